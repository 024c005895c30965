"""The pull consumer: read MessageQueues by offset and keep the group's progress."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pymq_proto.record import MAX_PROPERTIES_SIZE, MAX_REASON_CHARS, MessageConst, encode_properties
from pymq_proto.topics import get_dlq_topic, get_retry_topic

from ..backend.base import Backend, PullBatch, SendRequest, client_backend
from ..errors import (
    BrokerUnavailableError,
    MessageIllegalError,
    PymqError,
    RequestTimeoutError,
    TopicNotExistError,
)
from ..tls import TlsConfig
from .codec import uniq_first
from .message import (
    INT32_MAX,
    MessageExt,
    MessageQueue,
    PullResult,
    SendBackColumns,
    check_int,
    check_property_name,
    check_timeout_ms,
    clean_property_value,
    new_uniq_keys,
)
from .route import TopicRoute
from .transport import SharedConnections

__all__ = ["DEFAULT_PULL_BATCH_SIZE", "PullConsumer", "SendBackColumns", "SendBackResult", "retry_topic"]

MC = MessageConst
#: The group's retry topic, %RETRY%<group>, and its dead-letter topic, %DLQ%<group>.
retry_topic, dlq_topic = get_retry_topic, get_dlq_topic


@dataclass(frozen=True, slots=True)
class SendBackResult:
    """Where a sent-back message went: %RETRY%<group> or, past its retries, %DLQ%<group>."""

    topic: str
    dead_letter: bool
    fallback: bool  # True when the send back failed and a direct send to %RETRY% was made



DEFAULT_PULL_BATCH_SIZE = 32
class PullConsumer(SharedConnections):
    """Pulls messages by (MessageQueue, offset) for a consumer group.

    The caller owns the offsets (as Spark's checkpoint does) and tells the
    broker the group's progress with :meth:`commit`, so that lag shows on the
    broker and in ``Admin.group_progress``.

    Args:
        endpoint: ``host:port`` of a pymq broker.
        group: the consumer group.
        namesrv_addr: instead of ``endpoint``, Apache RocketMQ's name servers
            (``"host:9876;host2:9876"``): the same calls go to every broker of a topic's route.
        access_key, secret_key: ACL credentials (a user of the broker; requests are signed).
        tls, tls_ca_file, tls_cert_file, tls_key_file: TLS to the broker (as Producer's).
        timeout_ms: per request (long-polling pulls add their suspend time).

    Example::

        consumer = PullConsumer("127.0.0.1:8081", "analytics")
        for mq in consumer.queues("orders"):
            result = consumer.pull(mq, consumer.committed(mq) if consumer.committed(mq) >= 0 else 0)
            for msg in result.messages:
                print(msg.queue_offset, msg.body)
            consumer.commit(mq, result.next_begin_offset)
    """

    def __init__(
        self,
        endpoint: str | None = None,
        group: str = "",
        *,
        namesrv_addr: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool | TlsConfig | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        timeout_ms: int = 10_000,
        backend: Backend | None = None,
    ) -> None:
        if not isinstance(group, str) or not group:
            raise ValueError(f"consumer group must be a non-empty string, got {group!r}")
        check_timeout_ms(timeout_ms)
        self.group = group
        self._backend = client_backend(backend, timeout_ms / 1000.0, endpoint, namesrv_addr, access_key,
                                       secret_key, tls, tls_ca_file, tls_cert_file, tls_key_file)

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def endpoint(self) -> str:
        """The endpoint or name servers this consumer talks to."""
        return self._backend.config.address

    def queues(self, topic: str) -> list[MessageQueue]:
        """The readable MessageQueues of ``topic`` (TopicNotExistError if none)."""
        return list(self._backend.route(topic, refresh=True).subscribe_queues)

    def register(self, *topics: str) -> None:
        """Tell the brokers this group consumes ``topics`` (RocketMQ's HEART_BEAT).

        The brokers of the topics create ``%RETRY%<group>`` then, as RocketMQ's do
        when a consumer registers (on Apache RocketMQ this also lets ``mqadmin
        consumerProgress`` and RocketMQ Dashboard show the group's lag).
        """
        self._backend.register_consumer(self.group, topics)

    def retry_queues(self) -> list[MessageQueue]:
        """The queues of this group's %RETRY% topic.

        A broker makes it when a consumer of the group registers (or at its first send
        back): if it does not exist yet, the group registers first (:meth:`register`, as a
        RocketMQ consumer does when it starts), then the route is asked again.
        """
        return list(self._retry_route().subscribe_queues)

    def _retry_route(self) -> TopicRoute:
        topic = retry_topic(self.group)
        try:
            return self._backend.route(topic, refresh=True)
        except TopicNotExistError:
            self.register()
            return self._backend.route(topic, refresh=True)

    def pull_raw(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = DEFAULT_PULL_BATCH_SIZE,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
    ) -> PullBatch:
        """One pull, records undecoded (for columnar decoders: :meth:`Backend.decode_arrow`)."""
        check_int("pull offset", offset, 0)
        check_int("max_nums", max_nums, 1, INT32_MAX)
        return self._backend.pull(
            self.group, mq, offset, max_nums, subscription=subscription, expression_type=expression_type,
            max_bytes=max_bytes, suspend_timeout_ms=suspend_timeout_ms,
        )

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = DEFAULT_PULL_BATCH_SIZE,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        """Up to ``max_nums`` messages of ``mq`` from ``offset`` on.

        ``subscription`` is a tag expression (``"*"`` or ``"TagA || TagB"``).
        With ``suspend_timeout_ms`` > 0 a pull that finds nothing new waits
        (long polling) and returns as soon as a message arrives.
        """
        pulled = self.pull_raw(
            mq,
            offset,
            max_nums,
            subscription=subscription,
            expression_type=expression_type,
            max_bytes=max_bytes,
            suspend_timeout_ms=suspend_timeout_ms,
        )
        messages = self._backend.decode_messages(
            pulled, mq, subscription=subscription, expression_type=expression_type
        )
        return PullResult(
            status=pulled.status,
            messages=messages,
            next_begin_offset=pulled.next_begin_offset,
            min_offset=pulled.min_offset,
            max_offset=pulled.max_offset,
        )

    def commit(self, mq: MessageQueue, offset: int) -> None:
        """Record the group's progress on ``mq``: the next offset to consume."""
        self.commit_offsets({mq: offset})

    def commit_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Record the group's progress on several queues (one request per broker)."""
        for mq, offset in offsets.items():
            check_int(f"offset for {mq}", offset, 0)
        self._backend.commit_offsets(self.group, offsets)

    def committed(self, mq: MessageQueue) -> int:
        """The group's progress on ``mq``, or -1 when it has none.

        As stored: a commit beyond the queue's max offset reads back as it was
        (RocketMQ does not bound-check commits). -1 also where RocketMQ's brokers
        would say 0 (setZeroIfNotFound), so that "no progress" is never mistaken
        for progress.
        """
        return self._backend.committed(self.group, mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._backend.min_offset(mq)

    def max_offset(self, mq: MessageQueue) -> int:
        """One past the last message of ``mq`` (where the next message will go)."""
        return self._backend.max_offset(mq)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset whose store time is >= ``timestamp_ms`` (max offset if none)."""
        return self._backend.search_offset(mq, timestamp_ms)

    def send_back(
        self,
        message: MessageExt,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reason: str | Mapping[str, str] | None = None,
    ) -> SendBackResult:
        """Return a message this group failed to consume (RocketMQ's sendMessageBack).

        The broker stores a new message in %RETRY%<group> that comes back after
        ``delay_level`` (0: level 3 + reconsume times, i.e. 10s, 30s, 1m...), or in
        %DLQ%<group> once it was retried ``max_reconsume_times`` times or when
        ``delay_level`` < 0. As RocketMQ's consumers, ``max_reconsume_times`` goes
        with each send back and applies to it alone; without it the group's
        ``retryMaxTimes`` (16 unless set) applies on a pymq broker, and 16 on Apache
        RocketMQ (what RocketMQ's push consumer sends by default); the group's setting
        never changes. Both copies carry ``ORIGIN_MESSAGE_ID``: the offsetMsgId of the
        message as first stored (``Admin.view_message(id)`` finds it). ``reason``
        (a string or a dict of strings) is kept in the message's properties, so a
        dead letter says why it died.

        If the send back fails, the message is sent to %RETRY%<group> directly
        (RocketMQ's fallback); if that fails too, the error is raised so that the
        caller consumes the message again later.
        """
        return self.send_back_batch([message], delay_level, max_reconsume_times, [reason])[0]

    def send_back_orderly(
        self,
        message: MessageExt,
        reconsume_times: int,
        max_reconsume_times: int,
        reason: str | Mapping[str, str] | None = None,
    ) -> SendBackResult:
        """An orderly consumer gives a message up (RocketMQ's orderly ``sendMessageBack``).

        An orderly consumer retries a failed message in place, so the stored message
        never counts those retries: ``reconsume_times`` is the count (the message's own
        plus the in-place retries). A copy goes to %RETRY%<group> with that count + 1 and
        ``max_reconsume_times``; past the limit the broker stores it in %DLQ%<group>
        (RocketMQ's handleRetryAndDLQ), so the dead letter says how often the message
        was tried; else it comes back after level 3 + ``reconsume_times``.
        """
        _check_max_times(max_reconsume_times)
        if not isinstance(reconsume_times, int) or isinstance(reconsume_times, bool) or reconsume_times < 0:
            raise ValueError(
                f"reconsume_times must be an int >= 0 (the retries so far), got {reconsume_times!r}"
            )
        if not isinstance(message, MessageExt):
            raise TypeError(f"send_back_orderly takes a received MessageExt, got {type(message).__name__}")
        result = self._send_back_directly(replace(message, reconsume_times=reconsume_times), 0,
                                          max_reconsume_times, _reason_properties(reason))
        return replace(result, fallback=False)  # the copy is how an orderly consumer sends back

    def send_back_batch(
        self,
        messages: Sequence[MessageExt],
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reasons: Sequence[str | Mapping[str, str] | None] | None = None,
        *,
        done: list[SendBackResult | None] | None = None,
    ) -> list[SendBackResult]:
        """:meth:`send_back` for many messages in few requests.

        Same rules and fallback, item by item: a message the broker cannot send
        back is sent to %RETRY%<group> directly. ``reasons`` lines up with
        ``messages``; ``done`` as :meth:`send_back_columns`'s.
        """
        if reasons is not None and len(reasons) != len(messages):
            raise ValueError(
                f"reasons has {len(reasons)} items for {len(messages)} messages; give one per message"
            )
        results = _results_so_far(done, len(messages))
        by_broker: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            if not isinstance(m, MessageExt):
                raise TypeError(
                    f"send_back_batch takes received MessageExt items, got {type(m).__name__} at {i}"
                )
            by_broker.setdefault(m.broker_name, []).append(i)
        extras = [_reason_properties(reasons[i] if reasons else None) for i in range(len(messages))]
        names = list(dict.fromkeys(k for extra in extras for k in extra))
        for broker, idx in by_broker.items():
            columns = SendBackColumns(
                broker,
                [messages[i].commit_log_offset for i in idx],
                [delay_level] * len(idx),
                [messages[i].msg_id for i in idx],
                [messages[i].retry_topic or messages[i].topic for i in idx],
                reconsume_times=[messages[i].reconsume_times for i in idx],
                property_columns={k: [extras[i].get(k, "") for i in idx] for k in names},
            )
            part = [results[i] for i in idx]
            try:
                self.send_back_columns(columns, _pick(messages, idx), max_reconsume_times, done=part)
            finally:
                for i, r in zip(idx, part, strict=True):
                    results[i] = r
        return [r for r in results if r is not None]

    def send_back_columns(
        self,
        columns: SendBackColumns,
        messages: Callable[[Sequence[int]], Sequence[MessageExt]],
        max_reconsume_times: int | None = None,
        done: list[SendBackResult | None] | None = None,
    ) -> list[SendBackResult]:
        """:meth:`send_back_batch` for messages given as columns (the Spark sink's way).

        ``messages(indexes)`` returns the MessageExt of those items: it is called
        only for the fallback, the direct send of items the broker could not send
        back. Requests of SEND_BACK_RPC_ITEMS go out together, so that the
        broker works on one while the next is on its way.

        ``done``, one slot per item, gets each item's result as soon as it is
        known, and items whose slot holds one are not sent again: after an error,
        a call with the same list sends only the rest (the items acknowledged
        before it are in %RETRY% already; sending them again would copy them twice).
        """
        _check_max_times(max_reconsume_times)
        columns.check()
        results = _results_so_far(done, len(columns.commit_log_offsets))
        todo = [i for i, r in enumerate(results) if r is None]
        if not todo:
            return list(filter(None, results))
        part = columns if len(todo) == len(results) else columns.take(todo)
        outcomes = self._backend.send_back(self.group, part, max_reconsume_times)
        retry, dlq = retry_topic(self.group), dlq_topic(self.group)
        for i, o in zip(todo, outcomes, strict=True):
            if o is not None:
                results[i] = SendBackResult(dlq if o.dead_letter else retry, o.dead_letter, False)
        failed = [i for i in todo if results[i] is None]
        if failed:
            for i, message in zip(failed, messages(failed), strict=True):
                results[i] = self._send_back_directly(
                    message, columns.delay_levels[i], max_reconsume_times, columns.extra_properties(i)
                )
        return list(filter(None, results))

    def _send_back_directly(
        self, message: MessageExt, delay_level: int, max_times: int | None, extra: dict[str, str]
    ) -> SendBackResult:
        props = {MC.PROPERTY_RETRY_TOPIC: message.retry_topic or message.topic,
                 MC.PROPERTY_RECONSUME_TIME: str(message.reconsume_times + 1)}
        if delay_level < 0:
            # straight to the DLQ, as a send back with a negative level: the copy's reconsume
            # count over its limit makes the broker's retry rule store it in %DLQ%<group>
            max_times = message.reconsume_times
        elif max_times is None:  # RocketMQ's client sends its own default (16): its broker reads it
            max_times = self._backend.default_max_reconsume_times
        if max_times is not None:
            props[MC.PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        props[MC.PROPERTY_DELAY_TIME_LEVEL] = str(
            delay_level if delay_level > 0 else 3 + message.reconsume_times
        )
        topic = retry_topic(self.group)
        # the retry copy keeps the original's UNIQ_KEY, as RocketMQ's client does
        uniq = message.properties.get(MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or new_uniq_keys(1)[0]
        props_b = _copy_properties(message, extra, props, uniq)
        records, sizes = self._backend.encode_records(topic, [message.body], [props_b], [message.flag])
        request = SendRequest(topic, records, sizes, [uniq], reconsume_times=message.reconsume_times + 1)
        self._send_retry_copy(request, message.broker_name)
        # the broker's rule for a copy to %RETRY% (handleRetryAndDLQ): past the limit it carries,
        # the DLQ (without one, the group's retryMaxTimes decides: not known here)
        dead = max_times is not None and message.reconsume_times + 1 > max_times
        return SendBackResult(dlq_topic(self.group) if dead else topic, dead, True)

    def _send_retry_copy(self, request: SendRequest, broker_name: str) -> None:
        """Send a copy to %RETRY%<group>: on ``broker_name`` if it has the topic, else on another.

        The message's own broker may be down (its rows are sent back when it died): the copy
        goes to the next broker of the route that takes it. When none does (the topic is only
        on dead brokers), the group registers with every live broker, which creates the topic
        there (as RocketMQ's heartbeat does), and the route's new brokers are tried.
        """
        tried: set[str] = set()
        failed: PymqError | None = None
        for attempt in range(2):
            if attempt:
                self.register()
            try:
                queues = self._retry_route().publish_queues
            except TopicNotExistError as err:
                failed = failed or err
                continue
            # a queue per broker, the message's own first
            by_broker = {q.broker_name: q for q in reversed(queues) if q.broker_name not in tried}
            order = sorted(by_broker, key=lambda b: (b != broker_name, b))
            for broker in order:
                try:
                    self._backend.send(self.group, request, by_broker[broker], self._backend.timeout_s)
                    return
                except (BrokerUnavailableError, RequestTimeoutError, TopicNotExistError) as err:
                    tried.add(broker)
                    failed = err
        if failed is None:  # a route without a writable queue (the topic's perm)
            raise TopicNotExistError(
                f"{retry_topic(self.group)} has no writable queue on any broker, so the copy of a "
                "message sent back cannot be stored: give the topic write permission (perm 6)"
            )
        raise failed


# the broker adds entries as it stores a copy (REAL_TOPIC / REAL_QID to delay it, DLQ_ORIGIN_TOPIC /
# DLQ_ORIGIN_MESSAGE_ID to a dead letter) and refuses it if they take it past MAX_PROPERTIES_SIZE
_MAX_COPY_PROPERTIES = MAX_PROPERTIES_SIZE - 512


def _copy_properties(
    message: MessageExt, extra: Mapping[str, str], system: Mapping[str, str], uniq: str
) -> bytes:
    """A direct copy's properties, encoded: the message's, ``extra`` (the failure reasons), then ``system``.

    The broker's send back cuts each extra value to MAX_REASON_CHARS, so does the
    copy; and where the message's own properties leave less room, the longest
    values are cut further: a long traceback must not keep a message from %RETRY%
    (a send back that fails on every attempt stops the stream).
    """
    cut = {k: clean_property_value(v)[:MAX_REASON_CHARS] for k, v in extra.items()}
    while True:
        # ORIGIN_MESSAGE_ID unless there is one: the first stored copy's offsetMsgId, as the broker's
        # send back sets it
        props = {MC.PROPERTY_ORIGIN_MESSAGE_ID: message.offset_msg_id, **message.properties, **cut, **system}
        props.pop(MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, None)
        # A committed transactional message keeps TRAN_MSG; with it the broker would store the
        # copy as a half message (one that reaches %DLQ% too) that waits for a check-back of the
        # original producer group, so RocketMQ's consumers clear it from their copies
        props.pop(MC.PROPERTY_TRANSACTION_PREPARED, None)
        encoded = uniq_first(encode_properties(props), uniq)
        over = len(encoded) - _MAX_COPY_PROPERTIES
        if over <= 0:
            return encoded
        longest = max(cut, key=lambda k: len(cut[k]), default=None)
        if longest is None or not cut[longest]:
            raise MessageIllegalError(
                f"the copy of message {message.msg_id} to %RETRY% has properties of {len(encoded)} bytes "
                f"encoded even without its failure reasons, over the {_MAX_COPY_PROPERTIES} a copy may "
                f"have (RocketMQ's limit of {MAX_PROPERTIES_SIZE} less what the broker adds to store it): "
                "the message's own properties leave no room for the send back's"
            )
        # ``over`` bytes of UTF-8, not characters: a reason in Chinese would lose 3 times what it
        # must, and all of it next to large properties (a character cut in two is dropped)
        raw = cut[longest].encode()
        cut[longest] = raw[: max(0, len(raw) - over)].decode(errors="ignore")


def _results_so_far(done: list[SendBackResult | None] | None, n: int) -> list[SendBackResult | None]:
    if done is None:
        return [None] * n
    if len(done) != n:
        raise ValueError(f"done has {len(done)} slots for {n} messages; give one per message")
    return done


def _pick(
    messages: Sequence[MessageExt], idx: list[int]
) -> Callable[[Sequence[int]], list[MessageExt]]:
    """``messages(part)`` of :meth:`PullConsumer.send_back_columns`, for the items ``idx``."""
    return lambda part: [messages[idx[j]] for j in part]


def _check_max_times(max_times: int | None) -> None:
    if max_times is not None and (not isinstance(max_times, int) or max_times < 1):
        raise ValueError(f"max_reconsume_times must be an int >= 1, got {max_times!r}")


def _reason_properties(reason: str | Mapping[str, str] | None) -> dict[str, str]:
    if reason is None:
        return {}
    if isinstance(reason, str):
        return {MC.PROPERTY_CONSUME_FAILURE_REASON: clean_property_value(reason)}
    out = {}
    for k, v in reason.items():
        if not isinstance(v, str):
            raise TypeError(f"reason must map str to str, got {k!r}: {v!r}")
        check_property_name(k)
        out[k] = clean_property_value(v)
    return out
