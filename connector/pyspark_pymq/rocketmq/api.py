"""The client calls to RocketMQ brokers, one request each, as RocketMQ's ``MQClientAPIImpl``.

:class:`MQClientAPI` builds each request header with the field names of RocketMQ's
``*RequestHeader`` classes, sends it over a :class:`~.remoting.RemotingClient`, and maps
the answer: a typed result, or a :class:`~pyspark_pymq.errors.PymqError` subclass whose
``code`` is RocketMQ's ResponseCode name and whose message names the call, the broker
address and the broker's remark (``TopicNotExistError``, ``NoPermissionError``,
``SystemBusyError``, ``BrokerUnavailableError`` for SERVICE_NOT_AVAILABLE...).
Transport failures raise ``BrokerUnavailableError`` / ``RequestTimeoutError``.

Usage::

    api = MQClientAPI()                                    # the process's shared connections
    mq = MessageQueue("orders", "broker-a", 0)
    addr = "127.0.0.1:10911"                               # broker-a's master (see route.py)
    sent = api.send_message(addr, mq, b"hello", {"TAGS": "created"}, producer_group="g")
    pulled = api.pull_message(addr, "my-group", mq, offset=0, max_nums=32)
    pulled.status, pulled.next_begin_offset, pulled.message_binary   # decode with codec.py
    api.update_consumer_offset(addr, "my-group", mq, pulled.next_begin_offset)

What is left to the caller, as in RocketMQ's own client: choosing the broker (routes),
retrying failed sends elsewhere, decoding pulled records
(:mod:`~pyspark_pymq.rocketmq.codec`), and keeping a consumer registered (``heartbeat``
every 30 s: the broker drops a consumer it has not heard from for 120 s, and forgets it
at once when its connection closes).

Throughput: a pull answers at most the broker's ``maxTransferCountOnMessageInMemory``
(32 by default) messages and ``maxTransferBytesOnMessageInMemory`` (256 KiB): raise them
on the broker for large pulls; ``max_nums`` above them is cut silently. ``pull_range``
reads a long range of an unfiltered queue as many such pulls, a sliding window of them in
flight, without a Future or a fully parsed header per pull::

    got = api.pull_range(addr, "my-group", mq, offset=0, max_nums=32768, per_pull=32)
    got.next_begin_offset, got.message_binary          # the answers joined in queue order
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymq_proto.subscription import SUB_ALL, split_tags
from pymq_proto.topics import get_retry_topic

from ..client.message import MessageQueue, PullStatus, SendResult, SendStatus, frozen_msg_ids, new_uniq_key
from ..client.route import PERM_READ
from ..errors import PymqError, RequestTimeoutError
from .codec import message_properties_to_string
from .protocol import (
    SERIALIZE_JSON,
    FrameTemplate,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    decode_header,
    loads_fastjson,
    request_code_name,
    response_error,
)
from .remoting import RemotingClient

__all__ = [
    "DEFAULT_TOPIC",
    "PULL_FLAG_CLASS_FILTER",
    "PULL_FLAG_COMMIT_OFFSET",
    "PULL_FLAG_LITE_PULL",
    "PULL_FLAG_SUBSCRIPTION",
    "PULL_FLAG_SUSPEND",
    "ConsumerData",
    "MQClientAPI",
    "PullResultExt",
    "PulledRange",
    "SubscriptionData",
    "TopicConfig",
    "TopicOffset",
    "build_pull_sys_flag",
    "default_client_id",
    "java_string_hash",
]

# PullSysFlag
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10

# TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC: the template of topics a broker auto-creates.
DEFAULT_TOPIC = "TBW102"
DEFAULT_TOPIC_QUEUE_NUMS = 4
DEFAULT_TIMEOUT_S = 3.0  # sendMsgTimeout
UNIQ_KEY = "UNIQ_KEY"

_SEND_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}
_OFFSET = struct.Struct(">q")
# What a pull window reads of a JSON PULL_MESSAGE answer's header (ext field values are strings).
_JSON_CODE = re.compile(rb'"code":(-?[0-9]+)')
_PULL_FIELDS = re.compile(rb'"(nextBeginOffset|minOffset|maxOffset)":"(-?[0-9]+)"')

T = TypeVar("T")


def parse_offset_msg_ids(joined: str) -> tuple[bytes, tuple[int, ...]]:
    """The store host and commit-log offsets in a send's ``msgId`` answer.

    RocketMQ answers each stored message's offsetMsgId (store host + commit-log offset,
    in hex), comma-joined for a batch. A batch's ids have one width (one store host):
    decoded at once, not per message (0.7 µs per message in the sink's Python workers).
    An id that is not hex or too short is left out, as before.
    """
    first = joined.find(",")
    width = len(joined) if first < 0 else first
    n = (len(joined) + 1) // (width + 1) if width else 0
    if (width > 16 and width % 2 == 0 and n * (width + 1) - 1 == len(joined)
            and joined.count(",") == n - 1 and joined[width :: width + 1] == "," * (n - 1)):
        try:
            raw = bytes.fromhex(joined.replace(",", ""))
        except ValueError:
            raw = b""
        if len(raw) * 2 == n * width:  # fromhex skips whitespace: all of it was hex digits
            import numpy as np

            size = width // 2
            rows = np.frombuffer(raw, dtype=np.dtype([("host", f"V{size - 8}"), ("phy", ">i8")]))
            return raw[len(raw) - size : len(raw) - 8], tuple(rows["phy"].tolist())
    store_host = b""
    offsets: list[int] = []
    for one in filter(None, joined.split(",")):
        try:
            raw = bytes.fromhex(one)
        except ValueError:
            continue
        if len(raw) > 8:
            store_host = raw[:-8]
            offsets.append(_OFFSET.unpack_from(raw, len(raw) - 8)[0])
    return store_host, tuple(offsets)


def build_pull_sys_flag(
    *,
    commit_offset: bool = False,
    suspend: bool = False,
    subscription: bool = True,
    class_filter: bool = False,
) -> int:
    """``PullSysFlag.buildSysFlag``.

    ``subscription`` makes the broker filter by the request's expression; without it the
    broker uses the group's subscription from its heartbeat (SUBSCRIPTION_NOT_EXIST if
    none). ``commit_offset`` stores the request's ``commitOffset`` as the group's progress.
    ``suspend`` lets the broker hold a pull that finds nothing (long polling).
    """
    return (
        (PULL_FLAG_COMMIT_OFFSET if commit_offset else 0)
        | (PULL_FLAG_SUSPEND if suspend else 0)
        | (PULL_FLAG_SUBSCRIPTION if subscription else 0)
        | (PULL_FLAG_CLASS_FILTER if class_filter else 0)
    )


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as tag codes are computed."""
    h = 0
    for unit in struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def default_client_id() -> str:
    """A client id as RocketMQ's (``ip@instanceName``): host name and process id."""
    return f"{socket.gethostname()}@{os.getpid()}"


@dataclass(frozen=True, slots=True)
class PullResultExt:
    """A pull's answer, messages undecoded (RocketMQ's ``PullResultExt``).

    ``message_binary`` holds the stored records back to back (decode with
    ``codec.decode_messages`` or ``codec.decode_to_arrow``); empty unless FOUND. For
    NO_NEW_MSG, NO_MATCHED_MSG and OFFSET_ILLEGAL, ``next_begin_offset`` is where to pull
    next (for OFFSET_ILLEGAL past the end: the max offset). ``suggest_which_broker_id``
    is the broker id (0 master) the broker suggests pulling this queue from next.
    """

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int
    message_binary: bytes | bytearray
    offset_delta: int | None = None


@dataclass(frozen=True, slots=True)
class PulledRange:
    """What :meth:`MQClientAPI.pull_range` read: the pulls' answers joined in queue order.

    ``status`` is FOUND when the first pull found messages: ``message_binary`` then holds
    the records of every pull up to the one that ended the range, back to back, and
    ``next_begin_offset`` is where the last of them ends. Otherwise it is the first pull's
    answer as it came (NO_NEW_MSG...). ``min_offset`` / ``max_offset`` are the last
    answer's. ``pulls`` counts the answers used; ``short`` is how many messages the last
    one had when it had fewer than asked while the queue held more (a broker's per-pull
    cap, or the end of a consume queue file), else None.
    """

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    message_binary: bytes
    pulls: int
    short: int | None = None


# One answer of a pull window: (status, nextBeginOffset, minOffset, maxOffset, body), or the
# error the broker answered.
_Answer = tuple[PullStatus, int, int, int, bytes | bytearray] | PymqError


class _PullWindow:
    """The answers to one :meth:`MQClientAPI.pull_range` (a ResponseWaiter, no Future per pull).

    Runs on the connection's reader thread: it reads the few header fields a pull needs,
    keeps the answer in its slot and wakes the caller when ``wake_at`` answers are in, or
    at the first answer that ends the range (short, not FOUND, an error).
    """

    __slots__ = (
        "addr", "answers", "done", "error", "event", "index", "lock", "nums", "starts", "wake_at", "woken",
    )

    def __init__(self, addr: str, starts: list[int], nums: list[int]) -> None:
        self.addr = addr
        self.starts = starts
        self.nums = nums
        self.index: dict[int, int] = {}  # opaque -> slot
        self.answers: list[_Answer | None] = [None] * len(starts)
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.done = 0  # answers in (the reader's count)
        self.wake_at = 1
        self.woken = False
        self.error: BaseException | None = None  # a request failed without an answer

    def on_json(self, opaque: int, header: memoryview | bytes, body: bytes | bytearray) -> None:
        slot = self.index.get(opaque)
        if slot is None:
            return
        answer: _Answer
        try:
            m = _JSON_CODE.search(header)
            status = _PULL_STATUS.get(int(m.group(1))) if m is not None else None
            if status is None:
                answer = response_error(decode_header(header, SERIALIZE_JSON), self.addr, "PULL_MESSAGE")
            else:
                fields = dict(_PULL_FIELDS.findall(header))
                answer = (
                    status, int(fields.get(b"nextBeginOffset", 0)), int(fields.get(b"minOffset", 0)),
                    int(fields.get(b"maxOffset", 0)), body if status is PullStatus.FOUND else b"",
                )
        except Exception as err:  # a header this cannot read: the request fails
            self.set_exception(err)
            return
        self._arrived(slot, answer)

    def set_result(self, response: RemotingCommand) -> None:
        slot = self.index.get(response.opaque)
        if slot is None:
            return
        answer: _Answer
        try:
            r = MQClientAPI._pull_result(self.addr, response)
            answer = (r.status, r.next_begin_offset, r.min_offset, r.max_offset,
                      r.message_binary if r.status is PullStatus.FOUND else b"")
        except PymqError as err:
            answer = err
        except Exception as err:
            self.set_exception(err)
            return
        self._arrived(slot, answer)

    def set_exception(self, error: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = error
            self.woken = True
        self.event.set()

    def _arrived(self, slot: int, answer: _Answer) -> None:
        self.answers[slot] = answer
        ends = isinstance(answer, PymqError) or answer[1] != self.starts[slot] + self.nums[slot]
        with self.lock:
            self.done += 1
            wake = not self.woken and (ends or self.done >= self.wake_at)
            if wake:
                self.woken = True  # once until the caller looks again
        if wake:
            self.event.set()


@dataclass(frozen=True, slots=True)
class TopicOffset:
    """A queue's offsets (``TopicOffset``): [min_offset, max_offset) are stored."""

    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's configuration on one broker (``TopicConfig``)."""

    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int

    def queue_ids(self) -> range:
        """The queue ids RocketMQ 5's broker answers stats for (``AdminBrokerProcessor.getTopicStatsInfo``:
        the larger of the read and write queue counts; 4.x's, the write queues')."""
        return range(max(self.read_queue_nums, self.write_queue_nums))

    def read_queue_ids(self) -> range:
        """The queue ids a consumer reads (a route's subscribe queues): ``readQueueNums``, none
        without PERM_READ (a write-only topic)."""
        return range(self.read_queue_nums if self.perm & PERM_READ else 0)


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    """One subscription of a consumer's heartbeat (``SubscriptionData``)."""

    topic: str
    sub_string: str = "*"
    expression_type: str = "TAG"
    sub_version: int = field(default_factory=lambda: int(time.time() * 1000))

    def to_json(self) -> dict[str, Any]:
        sub_string = self.sub_string.strip()
        tags: list[str] = []
        if self.expression_type == "TAG":
            # FilterAPI.buildSubscriptionData: "A || B" -> tags {A, B} (blanks dropped), codes their hashes
            named = split_tags(sub_string)
            if named is None:
                sub_string = SUB_ALL
            else:
                tags = [t for t in named if t]
        return {
            "classFilterMode": False,
            "codeSet": [java_string_hash(t) for t in tags],
            "expressionType": self.expression_type,
            "subString": sub_string,
            "subVersion": self.sub_version,
            "tagsSet": tags,
            "topic": self.topic,
        }


@dataclass(frozen=True, slots=True)
class ConsumerData:
    """A consumer group's part of a heartbeat (``ConsumerData``).

    ``consume_type``: ``CONSUME_PASSIVELY`` (push) or ``CONSUME_ACTIVELY`` (pull; some
    brokers reject those with ``rejectPullConsumerEnable``); ``message_model``:
    ``CLUSTERING`` or ``BROADCASTING``.
    """

    group_name: str
    subscriptions: tuple[SubscriptionData, ...]
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    unit_mode: bool = False

    @staticmethod
    def for_topics(
        group: str,
        topics: Mapping[str, str] | Iterable[str],
        *,
        expression_type: str = "TAG",
        message_model: str = "CLUSTERING",
        with_retry_topic: bool = True,
    ) -> ConsumerData:
        """A group subscribing ``topics`` (topic -> expression, or topics with ``*``).

        With ``with_retry_topic`` (and CLUSTERING) it also subscribes ``%RETRY%<group>``,
        as RocketMQ's push consumer does: the broker then creates that topic.
        """
        exprs = dict(topics) if isinstance(topics, Mapping) else dict.fromkeys(topics, "*")
        subs = [SubscriptionData(t, e, expression_type) for t, e in exprs.items()]
        retry = get_retry_topic(group)
        if with_retry_topic and message_model == "CLUSTERING" and retry not in exprs:
            subs.append(SubscriptionData(retry))
        return ConsumerData(group, tuple(subs), message_model=message_model)

    def to_json(self) -> dict[str, Any]:
        return {
            "consumeFromWhere": self.consume_from_where,
            "consumeType": self.consume_type,
            "groupName": self.group_name,
            "messageModel": self.message_model,
            "subscriptionDataSet": [s.to_json() for s in self.subscriptions],
            "unitMode": self.unit_mode,
        }


def _then(fut: Future[RemotingCommand], fn: Callable[[RemotingCommand], T]) -> Future[T]:
    """A future of ``fn(response)``; ``fn`` runs on the thread that completes ``fut``."""
    out: Future[T] = Future()
    out.set_running_or_notify_cancel()

    def done(f: Future[RemotingCommand]) -> None:
        err = f.exception()
        if err is not None:
            out.set_exception(err)
            return
        try:
            out.set_result(fn(f.result()))
        except BaseException as e:  # the caller sees it through the future
            out.set_exception(e)

    fut.add_done_callback(done)
    return out


def _int(ext: Mapping[str, str], name: str, default: int = 0) -> int:
    value = ext.get(name)
    return int(value) if value else default


class MQClientAPI:
    """Typed calls to RocketMQ brokers (one request each).

    Args:
        remoting: the connections to use; the process's :meth:`RemotingClient.shared`
            client by default.
        timeout_s: the default time-out of a call (RocketMQ's 3 s).

    Every method takes the broker address (``"host:port"``, from the route) and an
    optional ``timeout_s``. Ext field values are strings, named as RocketMQ's headers.
    """

    def __init__(
        self, remoting: RemotingClient | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.remoting = remoting if remoting is not None else RemotingClient.shared()
        self.timeout_s = timeout_s

    # -- plumbing -----------------------------------------------------------------------------

    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else timeout_s

    def _call(
        self, addr: str, request: RemotingCommand, timeout_s: float | None, check: bool = True
    ) -> RemotingCommand:
        response = self.remoting.invoke_sync(addr, request, self._timeout(timeout_s))
        if check and response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, request_code_name(request.code))
        return response

    # -- pull ---------------------------------------------------------------------------------

    def _pull_request(
        self,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        sub_expression: str,
        expression_type: str,
        sys_flag: int | None,
        commit_offset: int,
        suspend_timeout_ms: int,
        sub_version: int,
        max_msg_bytes: int | None,
    ) -> RemotingCommand:
        ext = {
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": str(mq.queue_id),
            "queueOffset": str(offset),
            "maxMsgNums": str(max_nums),
            "sysFlag": str(build_pull_sys_flag() if sys_flag is None else sys_flag),
            "commitOffset": str(commit_offset),
            "suspendTimeoutMillis": str(suspend_timeout_ms),
            "subscription": sub_expression,
            "subVersion": str(sub_version),
            "expressionType": expression_type,
            "bname": mq.broker_name,
        }
        if max_msg_bytes is not None:
            ext["maxMsgBytes"] = str(max_msg_bytes)
        return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext)

    @staticmethod
    def _pull_result(addr: str, response: RemotingCommand) -> PullResultExt:
        status = _PULL_STATUS.get(response.code)
        if status is None:
            raise response_error(response, addr, "PULL_MESSAGE")
        ext = response.ext_fields
        delta = ext.get("offsetDelta")
        return PullResultExt(
            status,
            _int(ext, "nextBeginOffset"),
            _int(ext, "minOffset"),
            _int(ext, "maxOffset"),
            _int(ext, "suggestWhichBrokerId"),
            response.body,
            int(delta) if delta else None,
        )

    def pull_message(
        self,
        addr: str,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        sub_expression: str = "*",
        expression_type: str = "TAG",
        sys_flag: int | None = None,
        commit_offset: int = 0,
        suspend_timeout_ms: int = 0,
        sub_version: int = 0,
        max_msg_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> PullResultExt:
        """Pull up to ``max_nums`` messages of ``mq`` from queue offset ``offset`` (PULL_MESSAGE).

        ``sys_flag`` defaults to ``build_pull_sys_flag()`` (filter by ``sub_expression``,
        no offset commit, no long polling); ``expression_type`` is ``TAG`` or ``SQL92``.
        With a suspend flag the broker may hold the pull ``suspend_timeout_ms``; the
        default time-out then adds it to the call's.
        """
        request = self._pull_request(
            group, mq, offset, max_nums, sub_expression, expression_type, sys_flag,
            commit_offset, suspend_timeout_ms, sub_version, max_msg_bytes,
        )  # fmt: skip
        timeout = self._timeout(timeout_s) + (suspend_timeout_ms / 1000 if timeout_s is None else 0)
        return self._pull_result(addr, self.remoting.invoke_sync(addr, request, timeout))

    def pull_message_async(
        self,
        addr: str,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        sub_expression: str = "*",
        expression_type: str = "TAG",
        sys_flag: int | None = None,
        commit_offset: int = 0,
        suspend_timeout_ms: int = 0,
        sub_version: int = 0,
        max_msg_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> Future[PullResultExt]:
        """:meth:`pull_message` without waiting: many queues can be pulled at once."""
        request = self._pull_request(
            group, mq, offset, max_nums, sub_expression, expression_type, sys_flag,
            commit_offset, suspend_timeout_ms, sub_version, max_msg_bytes,
        )  # fmt: skip
        timeout = self._timeout(timeout_s) + (suspend_timeout_ms / 1000 if timeout_s is None else 0)
        return _then(self.remoting.invoke_async(addr, request, timeout), lambda r: self._pull_result(addr, r))

    def pull_range(
        self,
        addr: str,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        per_pull: int,
        *,
        window: int = 64,
        refill: int = 16,
        sub_expression: str = "*",
        expression_type: str = "TAG",
        sys_flag: int | None = None,
        timeout_s: float | None = None,
    ) -> PulledRange:
        """Offsets ``[offset, offset + max_nums)`` of ``mq`` as pulls of ``per_pull``, ``window`` in flight.

        For an unfiltered subscription, whose queue offsets are dense: each pull's range is
        known before any answer. Up to ``window`` PULL_MESSAGE are in flight; as soon as
        ``refill`` of them are answered as many more go out, in one write (frames from a
        :class:`~.protocol.FrameTemplate` unless the client signs requests). The range ends
        at the first answer with fewer messages than asked (a broker's cap, the queue's end),
        without messages, or with an error; the answers up to it are joined in order.

        Raises the first pull's error (a PymqError, BrokerUnavailableError when its
        connection fails, RequestTimeoutError when it is not answered in time); an error
        after answers that found messages ends the range there instead.
        """
        if max_nums < 1 or per_pull < 1 or window < 1:
            raise ValueError("max_nums, per_pull and window must be positive")
        timeout = self._timeout(timeout_s)
        end = offset + max_nums
        starts = list(range(offset, end, per_pull))
        nums = [min(per_pull, end - s) for s in starts]
        n = len(starts)
        refill = max(1, min(refill, window))
        w = _PullWindow(addr, starts, nums)
        remoting = self.remoting
        request = self._pull_request(group, mq, offset, per_pull, sub_expression, expression_type, sys_flag,
                                     0, 0, 0, None)
        signed = remoting.rpc_hook is not None  # signatures differ per request: no template then
        template = None if signed else FrameTemplate(request, ("queueOffset", "maxMsgNums"))
        opaques: list[int] = []  # by slot
        head = 0  # answers before this slot are in and taken
        stop = n  # slots from here on are not needed (the range ended before them)
        try:
            while True:
                sent = len(opaques)
                room = min(window - (sent - w.done), stop - sent)
                if room > 0:
                    frames: list[tuple[int, bytes]] = []
                    for i in range(sent, sent + room):
                        if template is not None:
                            opaque = remoting.next_opaque()
                            frame = template.frame(opaque, starts[i], nums[i])
                        else:
                            request.ext_fields["queueOffset"] = str(starts[i])
                            request.ext_fields["maxMsgNums"] = str(nums[i])
                            request.ext_fields.pop("Signature", None)
                            opaque, frame = remoting.encode_request(addr, request)
                        w.index[opaque] = i
                        opaques.append(opaque)
                        frames.append((opaque, frame))
                    try:
                        remoting.send_frames(addr, frames, w, RequestCode.PULL_MESSAGE, timeout)
                    except PymqError as err:
                        w.set_exception(err)
                    sent = len(opaques)
                with w.lock:
                    w.event.clear()
                    w.woken = False
                    # wake up when `refill` answers made room, or when the last one needed is in
                    w.wake_at = w.done + (min(refill, sent - w.done) if sent < stop else 1 if stop < n else
                                          sent - w.done)
                answers = w.answers
                while head < stop:
                    a = answers[head]
                    if a is None:
                        break
                    if isinstance(a, PymqError) or a[1] != starts[head] + nums[head]:
                        stop = head + 1
                        remoting.discard(addr, opaques[stop:])
                    head += 1
                if head >= stop or w.error is not None:
                    break
                if sent < stop and window - (sent - w.done) >= refill:
                    continue
                if not w.event.wait(timeout + 1.0):
                    raise RequestTimeoutError(
                        f"{addr} did not answer PULL_MESSAGE of {mq} at offset {starts[head]} "
                        f"within {timeout:g} s"
                    )
        finally:
            if head < len(opaques):
                remoting.discard(addr, opaques[head:])
        return self._joined(w, starts, nums, head)

    @staticmethod
    def _joined(w: _PullWindow, starts: list[int], nums: list[int], head: int) -> PulledRange:
        """The answers of slots before ``head``, up to the first that ended the range."""
        parts: list[bytes | bytearray] = []
        last: tuple[PullStatus, int, int, int, bytes | bytearray] | None = None
        bounds: tuple[int, int] | None = None
        for slot in range(head):
            a = w.answers[slot]
            if a is None or isinstance(a, PymqError):
                break
            if a[0] is not PullStatus.FOUND:
                if last is None:
                    return PulledRange(a[0], a[1], a[2], a[3], b"", 1)
                bounds = (a[2], a[3])
                break
            parts.append(a[4])
            last = a
        if last is None:
            first = w.answers[0] if head else None
            if isinstance(first, PymqError):
                raise first
            if w.error is not None:
                raise w.error
            raise RequestTimeoutError(f"{w.addr} answered no PULL_MESSAGE")  # not reached
        used = len(parts)
        j = used - 1
        short = last[1] - starts[j] if last[1] < min(starts[j] + nums[j], last[3]) else None
        min_offset, max_offset = bounds if bounds is not None else (last[2], last[3])
        return PulledRange(PullStatus.FOUND, last[1], min_offset, max_offset, b"".join(parts), used, short)

    # -- send ---------------------------------------------------------------------------------

    def _send_request(
        self,
        code: int,
        mq: MessageQueue,
        body: bytes | bytearray,
        properties: str,
        producer_group: str,
        flag: int,
        sys_flag: int,
        born_timestamp_ms: int | None,
        reconsume_times: int | None,
        max_reconsume_times: int | None,
        batch: bool,
        default_topic: str,
        default_topic_queue_nums: int,
    ) -> RemotingCommand:
        # SendMessageRequestHeaderV2: one-letter names of SendMessageRequestHeader's fields
        ext = {
            "a": producer_group,
            "b": mq.topic,
            "c": default_topic,
            "d": str(default_topic_queue_nums),
            "e": str(mq.queue_id),
            "f": str(sys_flag),
            "g": str(int(time.time() * 1000) if born_timestamp_ms is None else born_timestamp_ms),
            "h": str(flag),
            "i": properties,
            "j": str(reconsume_times or 0),
            "k": "false",
            "m": "true" if batch else "false",
            "n": mq.broker_name,
        }
        if max_reconsume_times is not None:
            ext["l"] = str(max_reconsume_times)
        return RemotingCommand(code, ext_fields=ext, body=body)

    @staticmethod
    def _send_result(
        addr: str, mq: MessageQueue, msg_ids: Sequence[str], response: RemotingCommand, call: str
    ) -> SendResult:
        status = _SEND_STATUS.get(response.code)
        if status is None:
            raise response_error(response, addr, f"{call} of {mq}")
        ext = response.ext_fields
        store_host, offsets = parse_offset_msg_ids(ext.get("msgId", ""))
        return SendResult(
            status,
            MessageQueue(mq.topic, mq.broker_name, _int(ext, "queueId", mq.queue_id)),
            _int(ext, "queueOffset"),
            frozen_msg_ids(msg_ids),
            offsets,
            store_host,
        )

    def _single(
        self,
        mq: MessageQueue,
        body: bytes | bytearray,
        properties: Mapping[str, str],
        producer_group: str,
        flag: int,
        sys_flag: int,
        born_timestamp_ms: int | None,
        reconsume_times: int | None,
        max_reconsume_times: int | None,
    ) -> tuple[RemotingCommand, str]:
        uniq = properties.get(UNIQ_KEY)
        if not uniq:
            uniq = new_uniq_key()
            properties = {**properties, UNIQ_KEY: uniq}
        request = self._send_request(
            RequestCode.SEND_MESSAGE_V2, mq, body, message_properties_to_string(properties),
            producer_group, flag, sys_flag, born_timestamp_ms, reconsume_times,
            max_reconsume_times, False, DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS,
        )  # fmt: skip
        return request, uniq

    def send_message(
        self,
        addr: str,
        mq: MessageQueue,
        body: bytes | bytearray,
        properties: Mapping[str, str],
        *,
        producer_group: str,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp_ms: int | None = None,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Send one message to ``mq`` (SEND_MESSAGE_V2) and wait for the broker's result.

        ``properties`` are the stored ones (``TAGS``, ``KEYS``, ``DELAY``, user
        properties...); a ``UNIQ_KEY`` (the msgId) is added if missing. ``body`` is sent
        as is: compress it and set ``sys_flag`` (``MessageSysFlag``) yourself. The status
        is SEND_OK or, per the answer's code, FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT /
        SLAVE_NOT_AVAILABLE (stored, not yet durable as asked); any other code raises.
        """
        request, uniq = self._single(
            mq, body, properties, producer_group, flag, sys_flag, born_timestamp_ms,
            reconsume_times, max_reconsume_times,
        )  # fmt: skip
        response = self.remoting.invoke_sync(addr, request, self._timeout(timeout_s))
        return self._send_result(addr, mq, (uniq,), response, "SEND_MESSAGE_V2")

    def send_message_async(
        self,
        addr: str,
        mq: MessageQueue,
        body: bytes | bytearray,
        properties: Mapping[str, str],
        *,
        producer_group: str,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp_ms: int | None = None,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        timeout_s: float | None = None,
    ) -> Future[SendResult]:
        """:meth:`send_message` without waiting; the future gets the result or the error."""
        request, uniq = self._single(
            mq, body, properties, producer_group, flag, sys_flag, born_timestamp_ms,
            reconsume_times, max_reconsume_times,
        )  # fmt: skip
        return _then(
            self.remoting.invoke_async(addr, request, self._timeout(timeout_s)),
            lambda r: self._send_result(addr, mq, (uniq,), r, "SEND_MESSAGE_V2"),
        )

    def send_message_oneway(
        self,
        addr: str,
        mq: MessageQueue,
        body: bytes | bytearray,
        properties: Mapping[str, str],
        *,
        producer_group: str,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp_ms: int | None = None,
        reconsume_times: int | None = None,
        max_reconsume_times: int | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """Send one message without an answer; returns its msgId (UNIQ_KEY).

        Raises only if it could not be written: a broker refusal is never seen.
        """
        request, uniq = self._single(
            mq, body, properties, producer_group, flag, sys_flag, born_timestamp_ms,
            reconsume_times, max_reconsume_times,
        )  # fmt: skip
        self.remoting.invoke_oneway(addr, request, self._timeout(timeout_s))
        return uniq

    def _batch(
        self,
        mq: MessageQueue,
        body: bytes | bytearray,
        producer_group: str,
        properties: Mapping[str, str] | None,
        born_timestamp_ms: int | None,
    ) -> RemotingCommand:
        return self._send_request(
            RequestCode.SEND_BATCH_MESSAGE, mq, body,
            message_properties_to_string(properties) if properties else "",
            producer_group, 0, 0, born_timestamp_ms, None, None, True,
            DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS,
        )  # fmt: skip

    def send_batch_message(
        self,
        addr: str,
        mq: MessageQueue,
        body: bytes | bytearray,
        msg_ids: Sequence[str],
        *,
        producer_group: str,
        properties: Mapping[str, str] | None = None,
        born_timestamp_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Send a pre-encoded batch (``codec.encode_batch``) to ``mq`` (SEND_BATCH_MESSAGE).

        ``msg_ids`` are the UNIQ_KEYs inside the batch, in order (returned in the result;
        the broker answers only the offsetMsgIds). ``properties`` are the batch's own
        (the broker adds them to every message). One topic, no delay levels.
        """
        request = self._batch(mq, body, producer_group, properties, born_timestamp_ms)
        response = self.remoting.invoke_sync(addr, request, self._timeout(timeout_s))
        return self._send_result(addr, mq, msg_ids, response, "SEND_BATCH_MESSAGE")

    def send_batch_message_async(
        self,
        addr: str,
        mq: MessageQueue,
        body: bytes | bytearray,
        msg_ids: Sequence[str],
        *,
        producer_group: str,
        properties: Mapping[str, str] | None = None,
        born_timestamp_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> Future[SendResult]:
        """:meth:`send_batch_message` without waiting."""
        request = self._batch(mq, body, producer_group, properties, born_timestamp_ms)
        return _then(
            self.remoting.invoke_async(addr, request, self._timeout(timeout_s)),
            lambda r: self._send_result(addr, mq, msg_ids, r, "SEND_BATCH_MESSAGE"),
        )

    # -- offsets ------------------------------------------------------------------------------

    def query_consumer_offset(
        self,
        addr: str,
        group: str,
        mq: MessageQueue,
        *,
        set_zero_if_not_found: bool | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """The group's committed offset of ``mq`` (QUERY_CONSUMER_OFFSET); -1 if none.

        A broker answers a group that never committed with QUERY_NOT_FOUND (-1 here),
        except that by default (``set_zero_if_not_found`` None or True) it answers **0**
        when the queue's messages still start at offset 0 and are in memory. Pass
        ``set_zero_if_not_found=False`` to always tell "never committed" (-1) apart.
        """
        ext = {
            "consumerGroup": group,
            "topic": mq.topic,
            "queueId": str(mq.queue_id),
            "bname": mq.broker_name,
        }
        if set_zero_if_not_found is not None:
            ext["setZeroIfNotFound"] = "true" if set_zero_if_not_found else "false"
        request = RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=ext)
        response = self._call(addr, request, timeout_s, check=False)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, f"QUERY_CONSUMER_OFFSET of {group} on {mq}")
        return _int(response.ext_fields, "offset", -1)

    def _update_offset_request(self, group: str, mq: MessageQueue, offset: int) -> RemotingCommand:
        return RemotingCommand(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            ext_fields={
                "consumerGroup": group,
                "topic": mq.topic,
                "queueId": str(mq.queue_id),
                "commitOffset": str(offset),
                "bname": mq.broker_name,
            },
        )

    def update_consumer_offset(
        self, addr: str, group: str, mq: MessageQueue, offset: int, *, timeout_s: float | None = None
    ) -> None:
        """Commit ``offset`` (the next to consume) as the group's progress on ``mq``.

        The broker does not check it against the queue's range. It refuses it with
        SUBSCRIPTION_GROUP_NOT_EXIST until the group exists on that broker: a pull or a
        heartbeat of the group creates it (with ``autoCreateSubscriptionGroup``, the
        default), a query of its offsets does not.
        """
        self._call(addr, self._update_offset_request(group, mq, offset), timeout_s)

    def update_consumer_offset_oneway(self, addr: str, group: str, mq: MessageQueue, offset: int) -> None:
        """:meth:`update_consumer_offset` without an answer (as the Java client's periodic commit)."""
        self.remoting.invoke_oneway(addr, self._update_offset_request(group, mq, offset), self.timeout_s)

    def _queue_call(
        self, addr: str, code: int, mq: MessageQueue, timeout_s: float | None, **extra: str
    ) -> RemotingCommand:
        ext = {"topic": mq.topic, "queueId": str(mq.queue_id), "bname": mq.broker_name, **extra}
        response = self.remoting.invoke_sync(
            addr, RemotingCommand(code, ext_fields=ext), self._timeout(timeout_s)
        )
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, f"{request_code_name(code)} of {mq}")
        return response

    def get_max_offset(
        self, addr: str, mq: MessageQueue, *, committed: bool = True, timeout_s: float | None = None
    ) -> int:
        """The offset after the last message of ``mq`` (GET_MAX_OFFSET).

        ``committed``: only messages replicated as the broker's HA mode requires.
        """
        r = self._queue_call(
            addr, RequestCode.GET_MAX_OFFSET, mq, timeout_s, committed="true" if committed else "false"
        )
        return _int(r.ext_fields, "offset")

    def get_min_offset(self, addr: str, mq: MessageQueue, *, timeout_s: float | None = None) -> int:
        """The offset of the oldest message still stored in ``mq`` (GET_MIN_OFFSET)."""
        return _int(self._queue_call(addr, RequestCode.GET_MIN_OFFSET, mq, timeout_s).ext_fields, "offset")

    def search_offset(
        self,
        addr: str,
        mq: MessageQueue,
        timestamp_ms: int,
        *,
        boundary: str = "lower",
        timeout_s: float | None = None,
    ) -> int:
        """The queue offset of the first message stored at or after ``timestamp_ms``.

        (SEARCH_OFFSET_BY_TIMESTAMP.) ``boundary`` ``"lower"`` or ``"upper"`` picks the
        first or last of several messages stored in the same millisecond. Before the first
        message: the min offset; after the last: the max offset.
        """
        if boundary not in ("lower", "upper"):
            raise ValueError(f"boundary must be 'lower' or 'upper', got {boundary!r}")
        r = self._queue_call(
            addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq, timeout_s,
            timestamp=str(timestamp_ms), boundaryType=boundary,
        )  # fmt: skip
        return _int(r.ext_fields, "offset")

    def get_earliest_msg_store_time(
        self, addr: str, mq: MessageQueue, *, timeout_s: float | None = None
    ) -> int:
        """The store time (ms) of the oldest message in ``mq`` (GET_EARLIEST_MSG_STORETIME)."""
        r = self._queue_call(addr, RequestCode.GET_EARLIEST_MSG_STORETIME, mq, timeout_s)
        return _int(r.ext_fields, "timestamp")

    def get_topic_stats_info(
        self, addr: str, topic: str, *, timeout_s: float | None = None
    ) -> dict[MessageQueue, TopicOffset]:
        """Min and max offset of every queue of ``topic`` on this broker (GET_TOPIC_STATS_INFO)."""
        request = RemotingCommand(RequestCode.GET_TOPIC_STATS_INFO, ext_fields={"topic": topic})
        response = self.remoting.invoke_sync(addr, request, self._timeout(timeout_s))
        return self._topic_stats(addr, topic, response)

    def get_topic_stats_info_async(
        self, addr: str, topic: str, *, timeout_s: float | None = None
    ) -> Future[dict[MessageQueue, TopicOffset]]:
        """:meth:`get_topic_stats_info` without waiting: many topics' go out at once."""
        request = RemotingCommand(RequestCode.GET_TOPIC_STATS_INFO, ext_fields={"topic": topic})
        fut = self.remoting.invoke_async(addr, request, self._timeout(timeout_s))
        return _then(fut, lambda response: self._topic_stats(addr, topic, response))

    @staticmethod
    def _topic_stats(addr: str, topic: str, response: RemotingCommand) -> dict[MessageQueue, TopicOffset]:
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, f"GET_TOPIC_STATS_INFO of topic {topic!r}")
        # offsetTable is a Map<MessageQueue, TopicOffset>: fastjson writes object keys
        doc: Any = loads_fastjson(response.body) if response.body else {}
        out: dict[MessageQueue, TopicOffset] = {}
        for key, value in (doc.get("offsetTable") or {}).items():
            k = dict(key) if isinstance(key, tuple) else json.loads(key)
            out[MessageQueue(str(k["topic"]), str(k["brokerName"]), int(k["queueId"]))] = TopicOffset(
                int(value.get("minOffset", 0)),
                int(value.get("maxOffset", 0)),
                int(value.get("lastUpdateTimestamp", 0)),
            )
        return dict(sorted(out.items()))

    def get_topic_config_async(
        self, addr: str, topic: str, *, timeout_s: float | None = None
    ) -> Future[TopicConfig]:
        """``topic``'s configuration on this broker (GET_TOPIC_CONFIG, RocketMQ 5; 4.x answers
        REQUEST_CODE_NOT_SUPPORTED), without waiting."""
        request = RemotingCommand(RequestCode.GET_TOPIC_CONFIG, ext_fields={"topic": topic})

        def parse(response: RemotingCommand) -> TopicConfig:
            if response.code != ResponseCode.SUCCESS:
                raise response_error(response, addr, f"GET_TOPIC_CONFIG of topic {topic!r}")
            c: Any = loads_fastjson(response.body) if response.body else {}
            return TopicConfig(str(c.get("topicName", topic)), int(c.get("readQueueNums", 0)),
                               int(c.get("writeQueueNums", 0)), int(c.get("perm", 0)))

        return _then(self.remoting.invoke_async(addr, request, self._timeout(timeout_s)), parse)

    def get_all_topic_config_async(
        self, addr: str, *, timeout_s: float | None = None
    ) -> Future[dict[str, TopicConfig]]:
        """Every topic's configuration on this broker, by name (GET_ALL_TOPIC_CONFIG, as
        ``mqadmin`` asks it: ``TopicConfigSerializeWrapper.topicConfigTable``), without waiting."""
        request = RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG)

        def parse(response: RemotingCommand) -> dict[str, TopicConfig]:
            if response.code != ResponseCode.SUCCESS:
                raise response_error(response, addr, "GET_ALL_TOPIC_CONFIG")
            doc: Any = loads_fastjson(response.body) if response.body else {}
            return {
                str(name): TopicConfig(str(name), int(c.get("readQueueNums", 0)),
                                       int(c.get("writeQueueNums", 0)), int(c.get("perm", 0)))
                for name, c in (doc.get("topicConfigTable") or {}).items()
            }

        return _then(self.remoting.invoke_async(addr, request, self._timeout(timeout_s)), parse)

    def _mq_table(
        self, addr: str, request: RemotingCommand, what: str, field_name: str
    ) -> dict[Any, Any]:
        """A ``Map<MessageQueue, ...>`` of an answer (fastjson writes object keys), by MessageQueue."""
        response = self.remoting.invoke_sync(addr, request, self.timeout_s)
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, what)
        doc: Any = loads_fastjson(response.body) if response.body else {}
        out: dict[Any, Any] = {}
        for key, value in (doc.get(field_name) or {}).items():
            k = dict(key) if isinstance(key, tuple) else json.loads(key)
            out[MessageQueue(str(k["topic"]), str(k["brokerName"]), int(k["queueId"]))] = value
        return dict(sorted(out.items()))

    def get_consume_stats(
        self, addr: str, group: str, topic: str | None = None
    ) -> dict[MessageQueue, tuple[int, int, int]]:
        """The group's progress on this broker (GET_CONSUME_STATS), per queue:
        (broker offset, consumer offset, last consume timestamp), as ``mqadmin consumerProgress``."""
        ext = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        table = self._mq_table(addr, RemotingCommand(RequestCode.GET_CONSUME_STATS, ext_fields=ext),
                               f"GET_CONSUME_STATS of group {group!r}", "offsetTable")
        return {
            mq: (int(v.get("brokerOffset", 0)), int(v.get("consumerOffset", -1)),
                 int(v.get("lastTimestamp", 0)))
            for mq, v in table.items()
        }

    def get_broker_runtime_info(self, addr: str) -> dict[str, str]:
        """What ``mqadmin brokerStatus`` shows (GET_BROKER_RUNTIME_INFO): offsets, disk, queues."""
        request = RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO)
        response = self.remoting.invoke_sync(addr, request, self.timeout_s)
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, "GET_BROKER_RUNTIME_INFO")
        doc: Any = loads_fastjson(response.body) if response.body else {}
        return {str(k): str(v) for k, v in (doc.get("table") or {}).items()}

    def get_all_subscription_groups(self, addr: str) -> dict[str, dict[str, Any]]:
        """Every consumer group's configuration on this broker (GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""
        request = RemotingCommand(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        response = self.remoting.invoke_sync(addr, request, self.timeout_s)
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, "GET_ALL_SUBSCRIPTIONGROUP_CONFIG")
        doc: Any = loads_fastjson(response.body) if response.body else {}
        return {str(k): dict(v or {}) for k, v in (doc.get("subscriptionGroupTable") or {}).items()}

    # -- consumers ----------------------------------------------------------------------------

    def _send_back_request(
        self, group: str, commit_log_offset: int, delay_level: int, origin_msg_id: str, origin_topic: str,
        max_reconsume_times: int, broker_name: str | None,
    ) -> RemotingCommand:
        ext = {
            "offset": str(commit_log_offset),
            "group": group,
            "delayLevel": str(delay_level),
            "originMsgId": origin_msg_id,
            "originTopic": origin_topic,
            "unitMode": "false",
            "maxReconsumeTimes": str(max_reconsume_times),
        }
        if broker_name is not None:
            ext["bname"] = broker_name
        return RemotingCommand(RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=ext)

    def consumer_send_msg_back(
        self,
        addr: str,
        group: str,
        commit_log_offset: int,
        delay_level: int,
        origin_msg_id: str,
        origin_topic: str,
        max_reconsume_times: int,
        *,
        broker_name: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Hand a message that failed to consume back to the broker (CONSUMER_SEND_MSG_BACK).

        The broker reads the message at ``commit_log_offset`` and stores a copy in
        ``%RETRY%<group>`` through ``SCHEDULE_TOPIC_XXXX`` (``delay_level`` 0: level 3 +
        reconsume times), or in ``%DLQ%<group>`` once its reconsume times reach
        ``max_reconsume_times`` or when ``delay_level`` is negative.
        """
        request = self._send_back_request(group, commit_log_offset, delay_level, origin_msg_id,
                                          origin_topic, max_reconsume_times, broker_name)
        self._call(addr, request, timeout_s)

    def consumer_send_msg_back_async(
        self,
        addr: str,
        group: str,
        commit_log_offset: int,
        delay_level: int,
        origin_msg_id: str,
        origin_topic: str,
        max_reconsume_times: int,
        *,
        broker_name: str | None = None,
        timeout_s: float | None = None,
    ) -> Future[None]:
        """:meth:`consumer_send_msg_back` without waiting: many messages go back at once."""
        request = self._send_back_request(group, commit_log_offset, delay_level, origin_msg_id,
                                          origin_topic, max_reconsume_times, broker_name)

        def check(response: RemotingCommand) -> None:
            if response.code != ResponseCode.SUCCESS:
                raise response_error(response, addr, request_code_name(request.code))

        return _then(self.remoting.invoke_async(addr, request, self._timeout(timeout_s)), check)

    # -- transactions -------------------------------------------------------------------------

    @staticmethod
    def _end_transaction_request(
        producer_group: str,
        tran_state_table_offset: int,
        commit_log_offset: int,
        commit_or_rollback: int,
        msg_id: str,
        transaction_id: str | None,
        from_transaction_check: bool,
        topic: str | None,
        broker_name: str | None,
        remark: str | None,
    ) -> RemotingCommand:
        # EndTransactionRequestHeader (+ RpcRequestHeader's bname), as DefaultMQProducerImpl fills it
        ext = {
            "producerGroup": producer_group,
            "tranStateTableOffset": str(tran_state_table_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(commit_or_rollback),
            "fromTransactionCheck": "true" if from_transaction_check else "false",
            "msgId": msg_id,
        }
        if transaction_id:
            ext["transactionId"] = transaction_id
        if topic:
            ext["topic"] = topic
        if broker_name:
            ext["bname"] = broker_name
        return RemotingCommand(RequestCode.END_TRANSACTION, remark=remark, ext_fields=ext)

    def end_transaction(
        self,
        addr: str,
        *,
        producer_group: str,
        tran_state_table_offset: int,
        commit_log_offset: int,
        commit_or_rollback: int,
        msg_id: str,
        transaction_id: str | None = None,
        from_transaction_check: bool = False,
        topic: str | None = None,
        broker_name: str | None = None,
        remark: str | None = None,
        wait: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """End a transaction (END_TRANSACTION; one-way, as RocketMQ's client sends it).

        ``addr`` is the broker that stored the half message; ``tran_state_table_offset``
        is the half message's queue offset (the send result's ``queue_offset``),
        ``commit_log_offset`` its commit-log offset (from its offsetMsgId), ``msg_id`` its
        UNIQ_KEY. ``commit_or_rollback``: ``MessageSysFlag.TRANSACTION_COMMIT_TYPE`` (8),
        ``TRANSACTION_ROLLBACK_TYPE`` (12) or ``TRANSACTION_NOT_TYPE`` (0, "unknown": the
        broker checks back later). One-way, the broker never answers: a refused end (wrong
        producer group, offsets that do not match) leaves the half message to the
        check-back, and this raises only if the request cannot be written.

        ``wait=True`` (tools and tests; RocketMQ's clients never wait) waits for the
        broker's answer and raises its refusal. The broker does not answer an end with
        ``TRANSACTION_NOT_TYPE``: that waits out ``timeout_s``.
        """
        request = self._end_transaction_request(
            producer_group, tran_state_table_offset, commit_log_offset, commit_or_rollback, msg_id,
            transaction_id, from_transaction_check, topic, broker_name, remark,
        )  # fmt: skip
        if wait:
            self._call(addr, request, timeout_s)
        else:
            self.remoting.invoke_oneway(addr, request, self._timeout(timeout_s))

    def heartbeat(
        self,
        addr: str,
        client_id: str,
        consumers: Sequence[ConsumerData] = (),
        producer_groups: Sequence[str] = (),
        *,
        timeout_s: float | None = None,
    ) -> int:
        """Register consumers and producer groups with the broker (HEART_BEAT); its version.

        The registration lives on this process's connection to ``addr``: send one every
        30 s (the broker expires it after 120 s) and after a reconnect. For a CLUSTERING
        group it also creates ``%RETRY%<group>`` on the broker (if the group exists or
        ``autoCreateSubscriptionGroup`` is on).
        """
        body = {
            "clientID": client_id,
            "consumerDataSet": [c.to_json() for c in consumers],
            "heartbeatFingerprint": 0,  # non-zero selects the V2 protocol (fingerprint-based)
            "producerDataSet": [{"groupName": g} for g in producer_groups],
            "withoutSub": False,
        }
        request = RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(body).encode())
        return self._call(addr, request, timeout_s).version

    def check_client_config(
        self,
        addr: str,
        client_id: str,
        group: str,
        subscription: SubscriptionData,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """Raise if the broker would refuse ``subscription`` (CHECK_CLIENT_CONFIG).

        As RocketMQ's ``checkClientInBroker``: a SQL92 expression on a broker without
        ``enablePropertyFilter`` is SYSTEM_ERROR, one that does not compile
        SUBSCRIPTION_PARSE_FAILED; a TAG one always passes.
        """
        body = {"clientId": client_id, "group": group, "subscriptionData": subscription.to_json()}
        request = RemotingCommand(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())
        self._call(addr, request, timeout_s)

    def get_broker_config(self, addr: str, *, timeout_s: float | None = None) -> dict[str, str]:
        """The broker's configuration now, every key of its BrokerConfig, NettyServerConfig and
        MessageStoreConfig (GET_BROKER_CONFIG, as ``mqadmin getBrokerConfig``), values as text.

        Changes made with ``mqadmin updateBrokerConfig`` show at once.
        """
        response = self._call(addr, RemotingCommand(RequestCode.GET_BROKER_CONFIG), timeout_s)
        # MixAll.properties2String: "key=value" lines, nothing escaped
        text = bytes(response.body).decode("utf-8", errors="replace")
        out: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.lstrip().startswith("#"):
                out[key.strip()] = value.strip()
        return out

    def unregister_client(
        self,
        addr: str,
        client_id: str,
        *,
        producer_group: str | None = None,
        consumer_group: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Unregister a producer and/or consumer group of ``client_id`` (UNREGISTER_CLIENT)."""
        ext = {"clientID": client_id}
        if producer_group is not None:
            ext["producerGroup"] = producer_group
        if consumer_group is not None:
            ext["consumerGroup"] = consumer_group
        self._call(addr, RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields=ext), timeout_s)

    def get_consumer_list_by_group(
        self, addr: str, group: str, *, timeout_s: float | None = None
    ) -> list[str]:
        """The client ids of the group's consumers registered with this broker; [] if none."""
        request = RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields={"consumerGroup": group})
        response = self._call(addr, request, timeout_s, check=False)
        if response.code == ResponseCode.SYSTEM_ERROR and (response.remark or "").startswith(
            "no consumer for this group"
        ):
            return []  # how a broker says "none": SYSTEM_ERROR with this remark
        if response.code != ResponseCode.SUCCESS:
            raise response_error(response, addr, f"GET_CONSUMER_LIST_BY_GROUP of {group!r}")
        doc: Any = loads_fastjson(response.body) if response.body else {}
        return [str(c) for c in doc.get("consumerIdList") or ()]
