"""TransactionProducer: RocketMQ's transactional messages.

A half message is stored invisibly, the local transaction runs, and its outcome
commits the message (consumers see it) or rolls it back (nobody ever does). If
the producer dies before it says, the broker asks the producer group later
(check-back) through ``check_listener``.
"""

from __future__ import annotations

import enum
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pymq_proto.record import MessageConst
from pymq_proto.v1 import pymq_pb2

from ..backend.base import client_tls
from ..errors import PymqError
from ..tls import TlsConfig
from .codec import decode_messages
from .message import Message, MessageExt, SendResult, SendStatus, SystemMessage
from .producer import Producer
from .transport import BrokerClient, ResponseStream

__all__ = ["HalfMessageProducer", "LocalTransactionState", "TransactionProducer", "TransactionSendResult"]

log = logging.getLogger(__name__)

END_TRANSACTION_CHUNK = 20_000  # msg ids per EndTransactionBatch request
CLOSE_JOIN_TIMEOUT_S = 5.0  # close() waits this long for the check-back thread


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


_STATE = {
    LocalTransactionState.COMMIT_MESSAGE: pymq_pb2.COMMIT_MESSAGE,
    LocalTransactionState.ROLLBACK_MESSAGE: pymq_pb2.ROLLBACK_MESSAGE,
    LocalTransactionState.UNKNOW: pymq_pb2.UNKNOW,
}


@dataclass(frozen=True)
class TransactionSendResult:
    send_result: SendResult
    local_transaction_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


def _state(value: object) -> LocalTransactionState:
    return value if isinstance(value, LocalTransactionState) else LocalTransactionState.UNKNOW


class TransactionProducer:
    """Sends messages whose visibility follows a local transaction.

    Args:
        endpoint: ``host:port`` of a pymq broker.
        producer_group: the group the broker asks when a transaction is unresolved.
        check_listener: ``f(MessageExt) -> LocalTransactionState``, RocketMQ's
            ``checkLocalTransaction``: called on a background thread for a half
            message whose outcome the broker does not know (after
            ``transactionTimeout``, then every ``transactionCheckInterval``, at most
            ``transactionCheckMax`` times). Exceptions count as UNKNOW.
        namesrv_addr: instead of ``endpoint``, Apache RocketMQ's name servers
            (``"host:9876;host2:9876"``): a
            :class:`~pyspark_pymq.rocketmq.transaction.RocketMQTransactionProducer`,
            which registers the group with every broker (HEART_BEAT) and answers
            their check-backs (CHECK_TRANSACTION_STATE) on its connections.
        access_key, secret_key: RocketMQ ACL credentials (with ``namesrv_addr``).

    Example::

        def check(msg):
            return (LocalTransactionState.COMMIT_MESSAGE if order_saved(msg.keys[0])
                    else LocalTransactionState.ROLLBACK_MESSAGE)

        with TransactionProducer("127.0.0.1:8081", "orders-tx", check) as producer:
            producer.send_message_in_transaction(
                Message("orders", b"...", keys=["o-7"]), lambda msg, arg: save_order(arg), arg=order)

    Transactional messages cannot be delayed or batched. As RocketMQ's client, a half
    message stored but not durable as asked (status FLUSH_DISK_TIMEOUT,
    FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) is rolled back without running the
    local transaction.
    """

    def __new__(cls, endpoint: str | None = None, producer_group: str = "",
                check_listener: Any = None, **kwargs: Any) -> TransactionProducer:
        if kwargs.get("namesrv_addr") is not None and cls is TransactionProducer:
            from ..rocketmq.transaction import RocketMQTransactionProducer

            return super().__new__(RocketMQTransactionProducer)
        return super().__new__(cls)

    def __init__(
        self, endpoint: str | None = None, producer_group: str = "",
        check_listener: Callable[[MessageExt], LocalTransactionState] | None = None, *,
        namesrv_addr: str | None = None, access_key: str | None = None, secret_key: str | None = None,
        send_msg_timeout_ms: int = 3000, tls: bool | TlsConfig | None = None, tls_ca_file: str | None = None,
        tls_cert_file: str | None = None, tls_key_file: str | None = None,
    ) -> None:
        self._check_args(producer_group, check_listener)
        if endpoint is None:
            raise ValueError(
                "TransactionProducer needs an endpoint ('host:port' of a pymq broker) or namesrv_addr "
                "('host:9876;host2:9876' of Apache RocketMQ)"
            )
        assert check_listener is not None
        self.producer_group = producer_group
        self.check_listener = check_listener
        tls_config = client_tls(tls, tls_ca_file, tls_cert_file, tls_key_file)
        self._producer = Producer(endpoint, producer_group=producer_group,
                                  send_msg_timeout_ms=send_msg_timeout_ms, access_key=access_key,
                                  secret_key=secret_key, tls=tls_config)
        self._client = BrokerClient(endpoint, send_msg_timeout_ms / 1000.0, access_key=access_key,
                                    secret_key=secret_key, tls=tls_config)
        self._check_stream = _CheckStream()
        # the thread holds the producer weakly: one dropped without close() (a notebook cell run
        # again) is collected, and ends its stream, instead of answering check-backs for ever
        self._thread = threading.Thread(target=_serve_checks, args=(weakref.ref(self), self._check_stream),
                                        name="pymq-tx-checks", daemon=True)
        weakref.finalize(self, self._check_stream.stop)
        self._thread.start()

    @staticmethod
    def _check_args(producer_group: str, check_listener: object) -> None:
        if not producer_group:
            raise ValueError("a transaction producer needs a producer_group")
        if not callable(check_listener):
            raise TypeError(f"check_listener must be callable, got {type(check_listener).__name__}")

    def send_message_in_transaction(
        self, message: Message,
        execute_local_transaction: Callable[[Message, Any], LocalTransactionState],
        arg: Any = None,
    ) -> TransactionSendResult:
        """Send a half message, run the local transaction, then commit or roll back.

        An exception in the local transaction counts as UNKNOW: the broker will
        check back later.
        """
        if message.delay_level or message.deliver_time_ms is not None:
            raise ValueError("transactional messages cannot be delayed: set neither delay_level nor "
                             "deliver_time_ms")
        half = SystemMessage(  # TRAN_MSG and PGROUP are system properties
            message.topic, message.body, tags=message.tags, keys=message.keys,
            properties={**message.properties, MessageConst.PROPERTY_TRANSACTION_PREPARED: "true",
                        MessageConst.PROPERTY_PRODUCER_GROUP: self.producer_group},
            sharding_key=message.sharding_key, flag=message.flag,
        )
        result = self._send_half(half)
        error: Exception | None = None
        if result.status is not SendStatus.SEND_OK:
            # DefaultMQProducerImpl.sendMessageInTransaction: stored, not durable as asked
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            try:
                state = _state(execute_local_transaction(message, arg))
            except Exception as err:
                log.exception("local transaction of %s failed: the broker will check back", result.msg_id)
                state, error = LocalTransactionState.UNKNOW, err
        self._end_sent(message, result, state, error)
        return TransactionSendResult(result, state)

    def _send_half(self, half: Message) -> SendResult:
        return self._producer.send_sync(half)

    def _end_sent(self, message: Message, result: SendResult, state: LocalTransactionState,
                  error: Exception | None) -> None:
        """End the transaction of a half message just sent (failures logged: check-backs mend them)."""
        self._end(result.msg_id, state, from_check=False)

    def end_transactions(self, msg_ids: Sequence[str], state: LocalTransactionState) -> int:
        """End many transactions alike (EndTransactionBatch); returns how many were pending.

        Unlike the end after a local transaction, failures raise: the caller
        (the exactly-once sink's commit) must not report success without it.
        """
        resolved = 0
        for start in range(0, len(msg_ids), END_TRANSACTION_CHUNK):
            resp = self._client.end_transaction_batch(pymq_pb2.EndTransactionBatchRequest(
                producer_group=self.producer_group, msg_ids=msg_ids[start : start + END_TRANSACTION_CHUNK],
                state=_STATE[state],
            ))
            resolved += resp.resolved
        return resolved

    def _end(self, msg_id: str, state: LocalTransactionState, *, from_check: bool) -> None:
        try:
            self._client.end_transaction(pymq_pb2.EndTransactionRequest(
                producer_group=self.producer_group, msg_id=msg_id, state=_STATE[state],
                from_transaction_check=from_check,
            ))
        except PymqError as err:  # the check-back will ask again
            log.warning("end transaction %s (%s) failed: %s", msg_id, state.value, err)

    def _open_check_stream(self) -> ResponseStream[pymq_pb2.CheckTransactionStateRequest]:
        return self._client.transaction_stream(
            pymq_pb2.TransactionStreamRequest(producer_group=self.producer_group))

    def _answer_check(self, check: pymq_pb2.CheckTransactionStateRequest) -> None:
        msg = decode_messages(check.record, "")[0]
        # the real topic and queue, not the half's (as RocketMQ's broker sends it)
        msg.topic = check.topic
        real_qid = msg.properties.get(MessageConst.PROPERTY_REAL_QUEUE_ID)
        msg.queue_id = int(real_qid) if real_qid else msg.queue_id
        try:
            state = _state(self.check_listener(msg))
        except Exception:
            log.exception("check listener failed for %s", check.msg_id)
            state = LocalTransactionState.UNKNOW
        self._end(check.msg_id, state, from_check=True)

    def close(self) -> None:
        """Stop answering check-backs (the stream ends, its thread is joined) and close the producer.

        A check listener still running is waited for up to CLOSE_JOIN_TIMEOUT_S.
        """
        self._check_stream.stop()
        if self._thread is not threading.current_thread():  # not from a check listener
            self._thread.join(CLOSE_JOIN_TIMEOUT_S)
        self._producer.close()

    def __enter__(self) -> TransactionProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CheckStream:
    """What a TransactionProducer's check-back thread shares with it (not the producer itself)."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        # guards ``stream`` against stop(): a stream opened after stop() ran would never end
        self.lock = threading.Lock()
        self.stream: ResponseStream[pymq_pb2.CheckTransactionStateRequest] | None = None

    def stop(self) -> None:
        with self.lock:
            self.closed.set()
            stream = self.stream
        if stream is not None:
            stream.cancel()

    def open(self, ref: weakref.ref[TransactionProducer]) -> bool:
        """Open the producer's stream; False once it is stopped or gone."""
        with self.lock:  # opening does not wait for the broker
            producer = ref()
            if self.closed.is_set() or producer is None:
                return False
            self.stream = producer._open_check_stream()
            return True


def _answer(ref: weakref.ref[TransactionProducer], check: pymq_pb2.CheckTransactionStateRequest) -> bool:
    """Answer one check-back; False if the producer is gone."""
    producer = ref()
    if producer is None:
        return False
    producer._answer_check(check)
    return True


def _serve_checks(ref: weakref.ref[TransactionProducer], checks: _CheckStream) -> None:
    """Keep a TransactionStream open and answer the broker's check-backs, holding the producer
    only while it answers one (helpers hold it, so this frame never does)."""
    while not checks.closed.is_set():
        try:
            if not checks.open(ref):
                return
            assert checks.stream is not None
            for check in checks.stream:
                if not _answer(ref, check):
                    checks.stop()
                    return
        except PymqError:  # the broker went away (or close() cancelled the stream): open another
            pass
        checks.closed.wait(0.5)


class HalfMessageProducer(Producer):
    """A Producer whose batches are half messages (SendHalfMessageBatch), one transaction each.

    For bulk writers that end transactions themselves (the exactly-once Spark
    sink): every message must carry ``TRAN_MSG=true``, ``PGROUP`` and its
    UNIQ_KEY (its transaction id). It opens no check-back stream: check-backs
    go to a :class:`TransactionProducer` of the same group.
    """

    HALF_MESSAGES = True
