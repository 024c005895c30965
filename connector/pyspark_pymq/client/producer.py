"""The producer: RocketMQ's send modes, retries, fault avoidance and batches."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..backend.base import Backend, SendRequest, client_backend
from ..errors import (
    BrokerUnavailableError,
    IllegalArgumentError,
    MessageIllegalError,
    NoPermissionError,
    PymqError,
    RequestTimeoutError,
)
from ..tls import TlsConfig
from .codec import UNIQ_PREFIX, fixed_width, uniq_first, uniq_property_matrix
from .message import (
    DEFAULT_MAX_MESSAGE_SIZE,
    SEND_MODES,
    Message,
    MessageQueue,
    RowKeys,
    SendResult,
    SendStatus,
    check_user_properties,
    encode_message_properties,
    new_uniq_keys,
)
from .route import PERM_READ, PERM_WRITE

__all__ = ["DEFAULT_MAX_MESSAGE_SIZE", "Producer", "SendMode"]

SendMode = Literal["sync", "async", "oneway"]
_COLUMNS_MIN = 64  # send_batch: from this many messages, plain ones are framed as columns


# ``running``: this thread is calling an async send's done callbacks (flush and close must not wait)
_callbacks = threading.local()


def _retriable(err: BaseException) -> bool:
    """Whether another try (on another queue or broker) may mend ``err``: its ``retriable``.

    The rest are the message's own fault (too big, no such topic...) and would fail again.
    """
    return isinstance(err, PymqError) and err.retriable


class LatencyFaultTolerance:
    """Send-side fault avoidance: a broker that just failed is avoided for a while."""

    def __init__(self, not_available_s: float = 30.0) -> None:
        self.not_available_s = not_available_s
        self._until: dict[str, float] = {}

    def update(self, broker_name: str, failed: bool) -> None:
        if failed:
            self._until[broker_name] = time.monotonic() + self.not_available_s
        else:
            self._until.pop(broker_name, None)

    def is_available(self, broker_name: str) -> bool:
        until = self._until.get(broker_name)
        return until is None or time.monotonic() >= until


class Producer:
    """Sends messages with RocketMQ's send semantics, to pymq's broker or to Apache RocketMQ.

    Args:
        endpoint: ``host:port`` of a pymq broker; routes lead to the others.
        namesrv_addr: instead of ``endpoint``, Apache RocketMQ's name servers,
            ``"host:9876;host2:9876"``.
        access_key, secret_key: ACL credentials (a user of the broker; requests are signed).
        tls, tls_ca_file, tls_cert_file, tls_key_file: TLS to the broker: ``tls=True`` trusts the
            system's CAs, ``tls_ca_file`` a CA file; the cert and key are for mutual TLS.
        send_mode: ``"sync"`` (default: wait for each result, retry
            ``retry_times_when_send_failed`` more times on another queue,
            avoiding a broker that just failed), ``"async"`` (``send`` returns a
            ``concurrent.futures.Future``; at most ``max_in_flight`` unanswered
            sends, further sends wait; the topic's route is looked up in the call when
            it is not known or older than 30 s, as RocketMQ's send does; retried
            ``retry_times_when_send_async_failed`` times, 0 by default as in RocketMQ; its
            callbacks run on the thread that answers sends: keep them short, and
            :meth:`flush` and :meth:`close` after them, not in them) or ``"oneway"`` (no answer is
            awaited: **messages may be lost**; after :meth:`flush`,
            ``oneway_unacknowledged`` counts those whose send failed since
            the producer was made, and ``oneway_undelivered`` is the first error of a send that
            never reached a broker (it does not answer); a send that finds no route (no broker
            or name server answers, a topic that does not exist) or that no retry could mend,
            such as one to a topic without write permission, still raises, as RocketMQ's
            ``sendOneway`` does).
        producer_group: RocketMQ's producer group, kept as PGROUP.
        send_msg_timeout_ms: per request, 3000 as in RocketMQ.
        max_message_size: 4 MiB; a larger message fails before it is sent.
        max_batch_bytes: a batch (``send_batch``) goes out as requests of at most
            this many bytes; ``max_message_size`` by default.
        retry_another_broker_when_not_store_ok: ``send_mode="sync"``: a message stored
            but not as durable as the broker is set to make it (FLUSH_DISK_TIMEOUT,
            FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) is sent again to another broker,
            within ``retry_times_when_send_failed``, unless its queue is pinned; the last
            answer is returned. False by default, as in RocketMQ.
        backend: instead of the connection arguments, a backend to send through, shared with
            other clients of the process (``pyspark_pymq.backend.cached_backend``), as a RocketMQ
            client instance is by its producers: the producer asks a topic's route once, and
            keeps the backend's when the name servers do not answer.

    Example::

        with Producer("127.0.0.1:8081") as producer:
            result = producer.send(Message("orders", b"hello", tags="created"))
            print(result.msg_id, result.queue_offset)
    """

    HALF_MESSAGES: ClassVar[bool] = False  # True: every send stores transaction half messages

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        namesrv_addr: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool | TlsConfig | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        send_mode: SendMode = "sync",
        producer_group: str = "DEFAULT_PRODUCER",
        retry_times_when_send_failed: int = 2,
        retry_times_when_send_async_failed: int = 0,
        send_msg_timeout_ms: int = 3000,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_in_flight: int = 64,
        max_batch_bytes: int | None = None,
        retry_another_broker_when_not_store_ok: bool = False,
        backend: Backend | None = None,
    ) -> None:
        if send_mode not in SEND_MODES:
            raise ValueError(f"send_mode must be one of {SEND_MODES}, got {send_mode!r}")
        if not isinstance(producer_group, str) or not producer_group:
            raise ValueError(f"producer_group must be a non-empty string, got {producer_group!r}")
        batch_bytes = max_message_size if max_batch_bytes is None else max_batch_bytes
        for name, value, low in (
            ("retry_times_when_send_failed", retry_times_when_send_failed, 0),
            ("retry_times_when_send_async_failed", retry_times_when_send_async_failed, 0),
            ("send_msg_timeout_ms", send_msg_timeout_ms, 1),
            ("max_message_size", max_message_size, 1),
            ("max_in_flight", max_in_flight, 1),
            ("max_batch_bytes", batch_bytes, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.send_mode: SendMode = send_mode
        self.producer_group = producer_group
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.retry_times_when_send_async_failed = retry_times_when_send_async_failed
        self.timeout = send_msg_timeout_ms / 1000.0
        self.max_message_size = max_message_size
        self.max_batch_bytes = batch_bytes
        if batch_bytes > max_message_size:  # a request the broker would refuse whole
            raise ValueError(f"max_batch_bytes must be at most max_message_size ({max_message_size}), "
                             f"got {max_batch_bytes!r}")
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self._backend: Backend = client_backend(backend, self.timeout, endpoint, namesrv_addr, access_key,
                                                secret_key, tls, tls_ca_file, tls_cert_file, tls_key_file)
        self._fault = LatencyFaultTolerance()
        # A random start, as RocketMQ's ThreadLocalIndex: producers made together (one per Spark
        # task) would otherwise all send their first batch to the same queue.
        self._rr = random.randrange(1 << 16)
        self._in_flight = threading.BoundedSemaphore(max_in_flight)
        self._pending: set[Future[Any]] = set()
        self._pending_lock = threading.Lock()
        self._closed = False
        # topics whose route this producer asked for: a shared backend's cached route may be up to
        # 30 s old, so it is asked once per producer (the cached one kept if asking fails transiently)
        self._routed: set[str] = set()
        self._shared_backend = backend is not None
        # oneway: messages whose send failed (nobody waits for them; the count is all that is kept)
        self.oneway_unacknowledged = 0
        # oneway: the first send that never reached a broker (not a lost answer: an unreachable one)
        self.oneway_undelivered: PymqError | None = None

    # -- public API -------------------------------------------------------------

    def send(self, message: Message) -> Any:
        """Send by ``send_mode``: a SendResult (sync), a Future (async), None (oneway)."""
        if self.send_mode == "sync":
            return self.send_sync(message)
        if self.send_mode == "async":
            return self.send_async(message)
        self.send_oneway(message)
        return None

    def send_batch(self, messages: Sequence[Message]) -> list[Any]:
        """Send a list as batches of at most ``max_batch_bytes`` bytes each.

        All messages must share one topic and have no delay level (RocketMQ's
        batch rules). Each batch lands in one queue, in order. Returns one
        result per batch, shaped by ``send_mode`` as :meth:`send`.
        """
        if not messages:
            raise ValueError("nothing to send: the message list is empty")
        return self._send_prepared(self._prepare(messages))

    def send_encoded(
        self,
        topic: str,
        bodies: Sequence[bytes],
        properties: Sequence[bytes],
        uniq_keys: Sequence[str],
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        broker_name: str | None = None,
    ) -> list[Any]:
        """Send messages whose properties are already encoded (RocketMQ's encoding).

        The fast path for bulk writers (the Spark sink): no Message objects.
        ``properties[i]`` must carry ``UNIQ_KEY`` = ``uniq_keys[i]``. The messages
        go as batches of at most ``max_batch_bytes`` bytes to ``queue_id``, or
        to the sharding key's queue, or round robin (``broker_name``: the queue id of that
        broker, where the topic is on several). Returns one result per batch,
        shaped by ``send_mode`` as :meth:`send`.
        """
        if self._closed:
            raise PymqError("the producer is closed")
        for i, body in enumerate(bodies):
            if len(body) > self.max_message_size:
                raise _over_max_size("message ", len(body), self.max_message_size,
                                     f"topic {topic!r}, message {i}")
        if not bodies:
            return []
        props = [uniq_first(p, k) for p, k in zip(properties, uniq_keys, strict=True)]
        records, sizes = self._backend.encode_records(topic, bodies, props)
        return self.send_records(topic, records, sizes, uniq_keys, queue_id=queue_id,
                                 sharding_key=sharding_key, broker_name=broker_name)

    def send_records(
        self,
        topic: str,
        records: bytes | memoryview,
        sizes: Sequence[int] | npt.NDArray[np.int32],
        uniq_keys: Sequence[str],
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        broker_name: str | None = None,
    ) -> list[Any]:
        """Send message images built by the backend (:meth:`Backend.encode_records` or ``frame_columns``).

        For writers that lay messages out themselves (the Spark sink, with Arrow):
        ``records`` back to back, ``sizes`` their lengths, ``uniq_keys`` their
        UNIQ_KEYs (first property of each). Split and sent as :meth:`send_encoded`.
        """
        if self._closed:
            raise PymqError("the producer is closed")
        size_arr = np.asarray(sizes, dtype=np.int32)
        if len(size_arr) != len(uniq_keys) or int(size_arr.sum(dtype=np.int64)) != len(records):
            raise ValueError(
                f"{len(size_arr)} sizes adding up to {int(size_arr.sum(dtype=np.int64))} bytes do not "
                f"describe {len(uniq_keys)} records in {len(records)} bytes"
            )
        if not len(size_arr):
            return []
        keys = uniq_keys if isinstance(uniq_keys, RowKeys) else list(uniq_keys)
        prepared = SendRequest(topic, records, size_arr, keys, sharding_key, queue_id,
                               broker_name=broker_name)
        return self._send_prepared(prepared)

    @property
    def backend(self) -> Backend:
        """Where the messages go (for writers that encode messages themselves)."""
        return self._backend

    def _send_prepared(self, whole: SendRequest) -> list[Any]:
        results: list[Any] = []
        for chunk in self._split_batch(whole):
            if self.send_mode == "sync":
                results.append(self._send_with_retry(chunk))
            elif self.send_mode == "async":
                results.append(self._send_async(chunk))
            else:
                self._send_async(chunk, oneway=True)
                results.append(None)
        return results

    def send_sync(self, message: Message) -> SendResult:
        return self._send_with_retry(self._prepare([message]))

    def send_async(self, message: Message) -> Future[SendResult]:
        return self._send_async(self._prepare([message]))

    def send_oneway(self, message: Message) -> None:
        """Send without waiting for the answer: the message may be lost."""
        self._send_async(self._prepare([message]), oneway=True)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every async or oneway send made before the call has been answered (sends
        other threads make meanwhile are not waited for). Not from a send's callback: that runs
        on the thread that answers sends, and would wait for itself (an error says so)."""
        if getattr(_callbacks, "running", False):
            raise PymqError("flush() was called from an async send's callback, which runs on the thread "
                            "that completes sends: it would wait for itself. Flush after the callback")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._pending_lock:
            pending = list(self._pending)
        for fut in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                fut.exception(timeout=left)
            except TimeoutError:
                raise RequestTimeoutError(f"flush timed out after {timeout} s with sends in flight") from None

    def close(self) -> None:
        """Refuse new sends, then wait for those in flight (not from a send's callback, where
        it only refuses new sends, as Kafka's producer closes without waiting there)."""
        self._closed = True
        if getattr(_callbacks, "running", False):
            return
        # every call waits (one after a close from a callback, a second thread's): the sends in
        # flight; one that passed the closed check as it was set may come after a flush
        while True:
            self.flush()
            with self._pending_lock:
                if not self._pending:
                    return

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------

    def _prepare(self, messages: Sequence[Message]) -> SendRequest:
        if self._closed:
            raise PymqError("the producer is closed")
        if not messages:
            raise ValueError("nothing to send: the message list is empty")
        if not isinstance(messages[0], Message):
            raise TypeError(f"expected a Message at position 0, got {type(messages[0]).__name__}")
        topic = messages[0].topic
        uniq = new_uniq_keys(len(messages))
        if len(messages) >= _COLUMNS_MIN and isinstance(uniq, RowKeys):
            prepared = self._prepare_plain(topic, messages, uniq)
            if prepared is not None:
                return prepared
        props_list: list[bytes] = []
        bodies: list[bytes] = []
        max_size = self.max_message_size
        for i, (msg, key) in enumerate(zip(messages, uniq, strict=True)):
            if not isinstance(msg, Message):
                raise TypeError(f"expected a Message at position {i}, got {type(msg).__name__}")
            if msg.topic != topic:
                raise ValueError(
                    f"a batch holds one topic: message {i} is for {msg.topic!r}, not {topic!r}"
                )
            if msg.sharding_key != messages[0].sharding_key:  # a batch goes to one queue
                raise ValueError(
                    f"a batch goes to one queue: message {i} has sharding_key {msg.sharding_key!r}, "
                    f"message 0 {messages[0].sharding_key!r}; send each key's messages in a batch "
                    "of their own"
                )
            if (msg.properties or msg.tags or msg.keys or msg.delay_level or msg.sharding_key is not None
                    or msg.deliver_time_ms is not None):
                check_user_properties(msg)
                props = encode_message_properties(msg, key)
            else:  # the msgId alone: no dict to build
                props = UNIQ_PREFIX + key.encode() + b"\x02"
            body = msg.body
            if len(body) > max_size:
                which = f"message {i} of the batch: its " if len(messages) > 1 else "message "
                raise _over_max_size(which, len(body), max_size, f"topic {topic!r}")
            props_list.append(props)
            bodies.append(body)
        if len(messages) > 1:
            for i, msg in enumerate(messages):
                if msg.delay_level or msg.deliver_time_ms is not None:
                    how = (f"delay_level={msg.delay_level}" if msg.delay_level
                           else f"deliver_time_ms={msg.deliver_time_ms}")
                    raise ValueError(
                        f"batch messages cannot be delayed: message {i} has {how}; send it alone")
        records, sizes = self._backend.encode_records(topic, bodies, props_list, [m.flag for m in messages])
        return SendRequest(topic, records, sizes, uniq, messages[0].sharding_key)

    def _prepare_plain(self, topic: str, messages: Sequence[Message], uniq: RowKeys) -> SendRequest | None:
        """Many messages of one topic with a body alone, framed as columns (Arrow, numpy), else None.

        The per-message loop of :meth:`_prepare` costs ~1 µs a message; a sync
        ``send_batch`` of 1000 waits for it before each request. Anything else
        (another topic, properties, tags, keys, a delay, a sharding key, a flag, a
        body over ``max_message_size``) takes that loop, which names the message.
        """
        if not all(type(m) is Message for m in messages) or any(
            m.topic != topic or m.properties or m.tags or m.keys or m.delay_level or m.flag
            or m.deliver_time_ms is not None
            or m.sharding_key is not None for m in messages
        ):
            return None
        bodies = pa.array([m.body for m in messages], pa.binary())
        body_lens = pc.binary_length(bodies).to_numpy(zero_copy_only=False).astype(np.int64)
        if int(body_lens.max()) > self.max_message_size:
            return None
        props = uniq_property_matrix(uniq)
        plens = np.full(len(messages), props.shape[1], dtype=np.int64)
        framed = self._backend.frame_columns(topic, bodies, body_lens, [fixed_width(props)], plens)
        if framed is None:
            return None
        return SendRequest(topic, framed[0], framed[1], uniq)

    def _split_batch(self, prepared: SendRequest) -> list[SendRequest]:
        """Batches of at most ``max_batch_bytes`` bytes (a record too big alone goes alone)."""
        if len(prepared.records) <= self.max_batch_bytes:
            return [prepared]
        ends = np.cumsum(prepared.sizes, dtype=np.int64)
        chunks: list[SendRequest] = []
        start, base = 0, 0
        while start < len(ends):
            stop = max(int(np.searchsorted(ends, base + self.max_batch_bytes, side="right")), start + 1)
            chunks.append(prepared.slice(start, stop, base, int(ends[stop - 1])))
            start, base = stop, int(ends[stop - 1])
        return chunks

    def queue_for_key(self, topic: str, sharding_key: str) -> int:
        """The queue id a sharding key maps to (MessageQueueSelector by hash)."""
        return self.message_queue_for_key(topic, sharding_key).queue_id

    def message_queue_for_key(self, topic: str, sharding_key: str) -> MessageQueue:
        """The queue a sharding key maps to (MessageQueueSelector by hash), broker included:
        where :meth:`send` puts a message with that ``sharding_key``."""
        queues = self._publish_queues(topic)
        return queues[self._backend.sharding_index(sharding_key, len(queues))]

    def _publish_queues(self, topic: str) -> tuple[MessageQueue, ...]:
        fresh = self._shared_backend and topic not in self._routed
        queues = self._backend.route(topic, refresh=fresh).publish_queues
        if fresh:
            self._routed.add(topic)
        if not queues:
            # RocketMQ's broker answers NO_PERMISSION for a send to a topic without PERM_WRITE.
            how = (f"mqadmin updateTopicPerm -n <namesrvAddr> -c <cluster> -t {topic} -p "
                   f"{PERM_READ | PERM_WRITE} (or updateTopic -w N)"
                   if self._backend.config.kind == "rocketmq" else
                   f"Admin(...).create_topic({topic!r}, perm={PERM_READ | PERM_WRITE}, write_queues=N)")
            raise NoPermissionError(
                f"topic {topic!r} has no writable queue (no write permission, or 0 write queues); "
                f"update it with {how} or send to another topic"
            )
        return queues

    def _select_queue(self, prepared: SendRequest, last_failed: str | None) -> MessageQueue:
        queues = self._publish_queues(prepared.topic)
        if prepared.queue_id is not None:
            for mq in queues:
                if mq.queue_id == prepared.queue_id and prepared.broker_name in (None, mq.broker_name):
                    return mq
            by_broker: dict[str, list[int]] = {}
            for mq in queues:
                by_broker.setdefault(mq.broker_name, []).append(mq.queue_id)
            has = ", ".join(f"{b} {min(ids)}..{max(ids)}" for b, ids in sorted(by_broker.items()))
            where = "" if prepared.broker_name is None else f" on broker {prepared.broker_name!r}"
            raise IllegalArgumentError(
                f"queue id {prepared.queue_id}{where} is not a writable queue of topic {prepared.topic!r}: "
                f"its writable queues are {has}"
            )
        if prepared.sharding_key is not None:
            # MessageQueueSelector by hash: the key's messages keep one queue.
            return queues[self._backend.sharding_index(prepared.sharding_key, len(queues))]
        for _ in range(len(queues)):
            self._rr += 1
            mq = queues[self._rr % len(queues)]
            if mq.broker_name != last_failed and self._fault.is_available(mq.broker_name):
                return mq
        self._rr += 1
        return queues[self._rr % len(queues)]

    def _send_with_retry(self, prepared: SendRequest) -> SendResult:
        attempts = 1 + self.retry_times_when_send_failed
        last_failed: str | None = None
        last_error: PymqError | None = None
        not_stored: SendResult | None = None  # the last answer other than SEND_OK
        again = (self.retry_another_broker_when_not_store_ok and prepared.queue_id is None
                 and prepared.sharding_key is None)
        for _ in range(attempts):
            mq: MessageQueue | None = None
            try:  # the route look-up is part of the try: a broker that is slow to answer it is retried too
                mq = self._select_queue(prepared, last_failed)
                result = self._backend.send(self.producer_group, prepared, mq, self.timeout,
                                            half=self.HALF_MESSAGES)
            except PymqError as err:
                if not err.retriable:
                    raise
                if mq is not None:
                    self._fault.update(mq.broker_name, True)
                    last_failed = mq.broker_name
                last_error = err
                continue
            self._fault.update(mq.broker_name, False)
            if again and result.status is not SendStatus.SEND_OK and any(
                q.broker_name != mq.broker_name for q in self._publish_queues(prepared.topic)
            ):
                # DefaultMQProducerImpl.sendDefaultImpl with retryAnotherBrokerWhenNotStoreOK (only
                # where another broker has the topic: the same one would store the messages again)
                not_stored, last_failed = result, mq.broker_name
                continue
            return result
        if not_stored is not None:
            return not_stored
        assert last_error is not None
        last_error.remark = f"{last_error.remark} (after {attempts} attempts)"
        raise last_error

    def _send_async(self, prepared: SendRequest, *, oneway: bool = False) -> Future[SendResult]:
        outer: Future[SendResult] = Future()
        # running: cancel() is refused (it cannot call back a send that is on its way)
        outer.set_running_or_notify_cancel()
        retries = 0 if oneway else self.retry_times_when_send_async_failed
        self._in_flight.acquire()
        with self._pending_lock:
            self._pending.add(outer)

        def finish(set_outcome: Callable[[], None], failed: bool = False) -> None:
            self._in_flight.release()
            with self._pending_lock:
                self._pending.discard(outer)
                if failed and oneway:
                    self.oneway_unacknowledged += len(prepared.sizes)
            running, _callbacks.running = getattr(_callbacks, "running", False), True
            try:
                set_outcome()  # the caller's done callbacks run here
            finally:
                _callbacks.running = running

        def attempt(left: int, last_failed: str | None) -> None:
            try:
                mq = self._select_queue(prepared, last_failed)
                call = self._backend.send_future(self.producer_group, prepared, mq, self.timeout,
                                                 half=self.HALF_MESSAGES)
            except BaseException as err:  # route look-up failed: retried as a send, else on the future
                retriable = _retriable(err)
                if left > 0 and retriable:
                    attempt(left - 1, last_failed)
                    return
                failure = err
                # oneway is lossy only in transport: as RocketMQ's sendOneway throws when it
                # finds no route or queue (also when no name server or broker answers the look-up),
                # the error reaches the caller.
                refused = oneway
                finish(lambda: outer.set_exception(failure), failed=not refused)
                if refused:
                    raise
                return

            def done(f: Future[SendResult]) -> None:
                try:
                    result = f.result()
                except Exception as err:  # a PymqError, or a bad answer: the outer future must end
                    retriable = _retriable(err)
                    self._fault.update(mq.broker_name, retriable)
                    if left > 0 and retriable:
                        attempt(left - 1, mq.broker_name)
                        return
                    error = err
                    if oneway and isinstance(err, BrokerUnavailableError) and self.oneway_undelivered is None:
                        self.oneway_undelivered = err  # it never reached the broker
                    finish(lambda: outer.set_exception(error), failed=True)
                    return
                self._fault.update(mq.broker_name, False)
                finish(lambda: outer.set_result(result))

            call.add_done_callback(done)

        attempt(retries, None)
        return outer


def _over_max_size(which: str, size: int, max_size: int, where: str) -> MessageIllegalError:
    """A body over ``max_size``, caught before it is sent, saying what would take it."""
    return MessageIllegalError(
        f"{which}body of {size} bytes is over maxMessageSize {max_size} ({where}); a larger message "
        "needs a larger max_message_size here (the Spark sink's option maxMessageSize) and on the "
        "broker (pymq-broker --max-message-size, RocketMQ's maxMessageSize)")
