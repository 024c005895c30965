"""CONSUMER_SEND_MSG_BACK: a consumer returns a message it failed to consume.

RocketMQ's broker logic, step by step: read the original record by its
physical offset; past maxReconsumeTimes (the value sent with the send back, else
the group's retryMaxTimes) or with a delay level < 0, write it to %DLQ%<group>
with DELAY=0; otherwise write a *new* message to %RETRY%<group> with delay level
3 + reconsumeTimes (when the client passed 0), RECONSUME_TIME + 1. Both copies
get RETRY_TOPIC = the original topic (kept if set), ORIGIN_MESSAGE_ID = the
first stored copy's offsetMsgId (kept if set; not its msgId, as RocketMQ's
``msgExt.getMsgId()`` on the broker is the offsetMsgId) and WAIT=false. The delay
takes a retry through SCHEDULE_TOPIC_XXXX (DELAY, REAL_TOPIC=%RETRY%<group>,
REAL_QID, all kept on delivery); a dead letter keeps the REAL_TOPIC / REAL_QID
its retry copy had.

Both RPCs share one implementation over the batch's columns (a single send back
is a batch of one). The new properties are the stored ones as bytes, minus the
entries a send back sets, plus the new entries: no decoding of the rest.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    MAX_PROPERTIES_SIZE,
    MAX_REASON_CHARS,
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    MessageConst,
    NamedEntries,
    encode_properties,
    entries_named,
    offset_msg_id,
    split_tail,
)
from pymq_proto.topics import get_dlq_topic, get_retry_topic, is_retry_topic
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import SCHEDULE_TOPIC
from ..manager.topic_config_manager import TopicConfig
from ..store.commit_log import MessageToStore
from .context import BrokerContext
from .send_message_processor import PUT_STATUS_TO_CODE, wait_store_ok

MC = MessageConst
# the entries a send back writes, as "NAME\x01" (values follow)
_RETRY, _ORIGIN, _TIMES, _MAX_TIMES, _DLQ_TOPIC, _DLQ_ID = (f"{name}{NAME_VALUE_SEPARATOR}" for name in (
    MC.PROPERTY_RETRY_TOPIC, MC.PROPERTY_ORIGIN_MESSAGE_ID, MC.PROPERTY_RECONSUME_TIME,
    MC.PROPERTY_MAX_RECONSUME_TIMES, MC.PROPERTY_DLQ_ORIGIN_TOPIC, MC.PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
))
_RETRY_TOPIC = MC.PROPERTY_RETRY_TOPIC.encode()
_ORIGIN_ID = MC.PROPERTY_ORIGIN_MESSAGE_ID.encode()
_REAL_TOPIC = MC.PROPERTY_REAL_TOPIC.encode()
_REAL_QID = MC.PROPERTY_REAL_QUEUE_ID.encode()
# RocketMQ's send back stores both copies with waitStoreMsgOK false; a dead letter with DELAY=0
_WAIT_FALSE = f"{MC.PROPERTY_WAIT_STORE_MSG_OK}{NAME_VALUE_SEPARATOR}false{PROPERTY_SEPARATOR}"
_DELAY_ZERO = f"{MC.PROPERTY_DELAY_TIME_LEVEL}{NAME_VALUE_SEPARATOR}0{PROPERTY_SEPARATOR}"
# What a send back sets itself: replaced on the message, refused as extra properties.
SET_BY_SEND_BACK = tuple(sorted(MC.SEND_BACK_PROPERTIES))


def _text(raw: bytes | None) -> str:
    """A stored property value as text (U+FFFD for bytes a record stored before issue 17 may hold)."""
    return (raw or b"").decode("utf-8", "replace")


@dataclass(slots=True)
class _Columns:
    """A checked batch request: its extra properties, encoded, and what they replace."""

    n: int
    shared: str
    columns: list[tuple[str, list[str]]]
    replaced: NamedEntries


class SendBackProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def consumer_send_msg_back(
        self, req: pymq_pb2.ConsumerSendMsgBackRequest
    ) -> pymq_pb2.ConsumerSendMsgBackResponse:
        batch = pymq_pb2.ConsumerSendMsgBackBatchRequest(
            group=req.group, max_reconsume_times=req.max_reconsume_times,
            commit_log_offsets=[req.commit_log_offset], delay_levels=[req.delay_level],
            origin_msg_ids=[req.origin_msg_id], origin_topics=[req.origin_topic],
            extra_properties=req.extra_properties,
        )
        resp = await self.consumer_send_msg_back_batch(batch)
        if resp.errors[0]:
            raise BrokerException(pymq_pb2.ResponseCode.Value(resp.error_codes[0]), resp.errors[0])
        dead = resp.dead_letters[0]
        return pymq_pb2.ConsumerSendMsgBackResponse(
            topic=get_dlq_topic(req.group) if dead else get_retry_topic(req.group),
            commit_log_offset=resp.commit_log_offsets[0], dead_letter=dead,
        )

    async def consumer_send_msg_back_batch(
        self, req: pymq_pb2.ConsumerSendMsgBackBatchRequest, deliveries: Sequence[int] = ()
    ) -> pymq_pb2.ConsumerSendMsgBackBatchResponse:
        """Each item as ConsumerSendMsgBack; messages bound for one queue share a write.

        ``deliveries`` (the v2 service's pop, one per item): how often the item was delivered, where
        that is more than its stored reconsume times + 1 (pymq redelivers the stored message itself,
        RocketMQ's revive a copy with reconsume times + 1); the new message counts from there.
        """
        cols = _check_columns(req)
        answers = _Answers.of(cols.n)
        writes = self._resend_messages(req, cols, answers, deliveries)
        if any(answers.dead_letters):
            await self.ctx.dlq_on_disk(req.group)
        # the retry topic its delayed copies go to, if this made it (they wait in SCHEDULE_TOPIC_XXXX)
        await self.ctx.topic_on_disk(get_retry_topic(req.group))
        await self._store(writes, answers)
        return pymq_pb2.ConsumerSendMsgBackBatchResponse(
            commit_log_offsets=answers.phys, dead_letters=answers.dead_letters, errors=answers.errors,
            error_codes=answers.codes,
        )

    def _resend_messages(
        self, req: pymq_pb2.ConsumerSendMsgBackBatchRequest, cols: _Columns, answers: _Answers,
        deliveries: Sequence[int] = (),
    ) -> dict[tuple[str, int], list[tuple[int, MessageToStore]]]:
        """The new message of each item, by the queue it is written to (SCHEDULE_TOPIC_XXXX or DLQ).

        One loop over the items, no call per item: this is the send back's hot path.
        """
        ctx = self.ctx
        n, group = cols.n, req.group
        sub = ctx.subscription_group_manager.find_subscription_group_config(group)
        # RocketMQ: the value sent with this send back, else the group's; the group keeps its own
        max_times = req.max_reconsume_times if req.max_reconsume_times > 0 else sub.retry_max_times
        offsets = list(req.commit_log_offsets)
        levels = list(req.delay_levels)
        origin_topics = list(req.origin_topics) or [""] * n
        records = ctx.store.look_messages_by_offsets(offsets)
        writes: dict[tuple[str, int], list[tuple[int, MessageToStore]]] = {}
        retry_topic, dlq_topic = get_retry_topic(group), get_dlq_topic(group)
        retry: TopicConfig | None = None
        queues = 1
        schedules: dict[tuple[int, int], tuple[str, int]] = {}  # (retry queue, level) -> properties
        max_text = f"{_MAX_TIMES}{max_times}\x02"
        for i in range(n):
            record = records[i]
            if record is None:
                answers.fail(i, "ILLEGAL_ARGUMENT", (
                    f"no message at commit log offset {offsets[i]} (it may have expired); "
                    "pass the commit_log_offset of a consumed message"
                ))
                continue
            h = HEADER.unpack_from(record)
            total, flag, phy, born, reconsume, body_len = h[0], h[4], h[6], h[8], h[11], h[13]
            if deliveries:
                reconsume = max(reconsume, deliveries[i] - 1)
            t0, t1, p0, p1 = split_tail(record, 0, total, body_len)
            props = record[p0:p1]
            old = cols.replaced.values(props)
            if old:
                props = cols.replaced.cut(props)
            if props and not props.endswith(b"\x02"):
                props += b"\x02"
            stored_topic = record[t0:t1].decode()
            origin_topic = _text(old.get(_RETRY_TOPIC)) or origin_topics[i] or stored_topic
            if is_retry_topic(origin_topic):
                origin_topic = origin_topics[i] or origin_topic
            # the first stored copy's offsetMsgId (the client's origin msg id is for tracing only)
            origin_id = _text(old.get(_ORIGIN_ID)) or offset_msg_id(h[10], phy)
            level = levels[i]
            dead = reconsume >= max_times or level < 0
            if dead:
                store_topic, store_queue_id = dlq_topic, 0
                # DELAY=0; the REAL_TOPIC / REAL_QID of a retry copy are kept
                real = "".join(
                    f"{name.decode()}\x01{_text(old[name])}\x02" for name in (_REAL_TOPIC, _REAL_QID)
                    if name in old
                )
                tail = f"{_DELAY_ZERO}{real}{_DLQ_TOPIC}{origin_topic}\x02{_DLQ_ID}{origin_id}\x02"
            else:  # the delay goes through SCHEDULE_TOPIC_XXXX, as the store's resolve_delay
                if retry is None:  # created on first use: a dead letter alone does not make it
                    retry = ctx.topic_config_manager.create_topic_of_retry(group, sub.retry_queue_nums)
                    queues = retry.write_queue_nums
                key = (random.randrange(queues) if queues > 1 else 0, level or 3 + reconsume)
                delayed = schedules.get(key)
                if delayed is None:
                    props_of, queue = ctx.store.schedule_properties(retry_topic, *key)
                    delayed = schedules[key] = (encode_properties(props_of).decode(), queue)
                tail, store_queue_id = delayed
                store_topic = SCHEDULE_TOPIC
            # the new entries, encode_properties inlined (one string per item)
            own = "".join(
                f"{name}\x01{values[i]}\x02" for name, values in cols.columns if values[i]
            ) if cols.columns else ""
            new_props = props + (
                f"{cols.shared}{own}{_RETRY}{origin_topic}\x02{_ORIGIN}{origin_id}\x02"
                f"{_TIMES}{reconsume + 1}\x02{max_text}{_WAIT_FALSE}{tail}"
            ).encode()
            if len(new_props) > MAX_PROPERTIES_SIZE:
                answers.fail(i, "MESSAGE_ILLEGAL", (
                    f"its properties would be {len(new_props)} bytes, over the limit of "
                    f"{MAX_PROPERTIES_SIZE}; send shorter extra properties"
                ))
                continue
            answers.dead_letters[i] = dead
            body = record[HEADER_SIZE : HEADER_SIZE + body_len]
            message = MessageToStore(body, flag, new_props, born, reconsume + 1)
            writes.setdefault((store_topic, store_queue_id), []).append((i, message))
        return writes

    async def _store(
        self, writes: dict[tuple[str, int], list[tuple[int, MessageToStore]]], answers: _Answers
    ) -> None:
        """Write each queue's messages in puts within maxMessageSize; a failed put fails its items."""
        store = self.ctx.store
        last = None
        for (topic, queue_id), items in writes.items():
            for chunk in _chunks(items, store.config.max_message_size):
                put = store.put_messages(topic, queue_id, [m for _, m in chunk])
                if not put.ok:
                    code = pymq_pb2.ResponseCode.Name(
                        PUT_STATUS_TO_CODE.get(put.status, pymq_pb2.SYSTEM_ERROR)
                    )
                    for i, _m in chunk:
                        answers.fail(i, code, put.remark or put.status.value)
                    continue
                for (i, _m), phy in zip(chunk, put.physical_offsets, strict=True):
                    answers.phys[i] = phy
                last = put
        if last is not None:
            await wait_store_ok(self.ctx, last)  # a later write is durable only after earlier ones


@dataclass(slots=True)
class _Answers:
    """The batch response's columns, filled item by item."""

    phys: list[int]
    dead_letters: list[bool]
    errors: list[str]
    codes: list[str]

    @classmethod
    def of(cls, n: int) -> _Answers:
        return cls([0] * n, [False] * n, [""] * n, [""] * n)

    def fail(self, i: int, code: str, error: str) -> None:
        self.errors[i], self.codes[i], self.dead_letters[i] = error, code, False


def _check_columns(req: pymq_pb2.ConsumerSendMsgBackBatchRequest) -> _Columns:
    """The request's columns line up and its extra properties can be stored; else ILLEGAL_ARGUMENT."""
    n = len(req.commit_log_offsets)
    counts = {"delay_levels": (len(req.delay_levels), False),
              "origin_msg_ids": (len(req.origin_msg_ids), True),
              "origin_topics": (len(req.origin_topics), True)}
    columns = [(c.name, [v[:MAX_REASON_CHARS] for v in c.values]) for c in req.property_columns]
    counts.update({f"property_columns[{c!r}]": (len(v), False) for c, v in columns})
    for field, (count, may_be_empty) in counts.items():
        if count != n and not (may_be_empty and count == 0):
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"{field} has {count} values for {n} commit_log_offsets; give one per message"
                + (" (or none)" if may_be_empty else ""),
            )
    extra = req.extra_properties
    shared = {key: extra[key][:MAX_REASON_CHARS] for key in extra}
    names = [*shared, *(name for name, _ in columns)]
    for name in names:
        if not name or name in SET_BY_SEND_BACK or _has_separator(name):
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"extra property name {name!r} cannot be set on a message sent back: names must be "
                "non-empty, without \\x01 or \\x02, and not one the send back sets "
                f"({', '.join(SET_BY_SEND_BACK)})",
            )
    if len(set(names)) != len(names):
        raise BrokerException(
            pymq_pb2.ILLEGAL_ARGUMENT, f"extra property names {names} repeat a name; give each once",
        )
    for name, values in [*((k, [v]) for k, v in shared.items()), *columns]:
        if _has_separator("".join(values)):
            i = next(i for i, v in enumerate(values) if _has_separator(v))
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"extra property {name!r} value {values[i][:80]!r} (message {i}) contains \\x01 or "
                "\\x02, which separate stored properties; remove them",
            )
    replaced = entries_named((*SET_BY_SEND_BACK, *names))
    return _Columns(n, encode_properties(shared).decode(), columns, replaced)


def _has_separator(text: str) -> bool:
    return NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text


def _chunks(
    items: list[tuple[int, MessageToStore]], max_bytes: int
) -> list[list[tuple[int, MessageToStore]]]:
    """Split so that each write stays within maxMessageSize (the batch rule)."""
    out: list[list[tuple[int, MessageToStore]]] = [[]]
    size = 0
    for item in items:
        n = len(item[1].body)
        if out[-1] and size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out
