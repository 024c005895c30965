"""Transactional messages on Apache RocketMQ: ``TransactionProducer(namesrv_addr=...)``.

As RocketMQ's ``TransactionMQProducer`` (``DefaultMQProducerImpl.sendMessageInTransaction``,
``endTransaction``, ``checkTransactionState``):

- the half message is a ``SEND_MESSAGE_V2`` with ``TRAN_MSG=true``, ``PGROUP=<group>``
  and ``MessageSysFlag.TRANSACTION_PREPARED_TYPE``; the broker stores it in
  ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 (its real topic and queue in ``REAL_TOPIC`` /
  ``REAL_QID``) and answers that queue's offset;
- the end is a one-way ``END_TRANSACTION`` to the broker that stored it:
  ``EndTransactionRequestHeader`` with the half's queue offset (``tranStateTableOffset``),
  its commit-log offset (from its offsetMsgId), ``commitOrRollback`` (COMMIT 8,
  ROLLBACK 12, NOT 0), ``msgId`` = ``transactionId`` = its UNIQ_KEY;
- the check-back: a broker that does not know a half message's outcome after
  ``transactionTimeOut`` sends ``CHECK_TRANSACTION_STATE`` (one-way, the half message in
  the body, its topic and queue already the real ones) on a connection of a client that
  registered the producer group with ``HEART_BEAT``. The producer registers with every
  broker of the cluster when made, every ``heartbeat_interval_s`` (the broker forgets a
  producer after 120 s without one), and again before a send over a connection that was
  made anew; the answer is an ``END_TRANSACTION`` with ``fromTransactionCheck=true`` on
  the same connection.

Check-backs are read by the remoting client's reader and handed, by the ``PGROUP`` of
the half message, to the producer of that group in this process (one dispatcher per
:class:`~.remoting.RemotingClient`, as RocketMQ's ``ClientRemotingProcessor`` does
through ``MQClientInstance.selectProducer``); its check listener runs on the producer's
own thread, one check at a time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from pymq_proto.record import MessageConst

from ..backend.base import client_tls
from ..client.message import Message, MessageExt, SendResult
from ..client.producer import Producer
from ..client.transaction import LocalTransactionState, TransactionProducer, _state
from ..errors import PymqError
from ..tls import TlsConfig
from .api import MQClientAPI, default_client_id
from .codec import MessageSysFlag, decode_messages
from .protocol import RemotingCommand, RequestCode
from .remoting import RemotingClient

__all__ = ["RocketMQTransactionProducer", "commit_or_rollback"]

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_INTERVAL_S = 30.0  # ClientConfig.heartbeatBrokerInterval

_FLAG = {
    LocalTransactionState.COMMIT_MESSAGE: MessageSysFlag.TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK_MESSAGE: MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOW: MessageSysFlag.TRANSACTION_NOT_TYPE,
}


def commit_or_rollback(state: LocalTransactionState) -> int:
    """``EndTransactionRequestHeader.commitOrRollback`` of a local transaction's outcome."""
    return _FLAG[state]


class _CheckDispatcher:
    """CHECK_TRANSACTION_STATE of one remoting client, to the producer of the half's PGROUP."""

    def __init__(self, remoting: RemotingClient) -> None:
        self._producers: dict[str, list[weakref.ReferenceType[RocketMQTransactionProducer]]] = {}
        self._lock = threading.Lock()
        remoting.register_processor(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    def add(self, producer: RocketMQTransactionProducer) -> None:
        with self._lock:
            self._producers.setdefault(producer.producer_group, []).append(weakref.ref(producer))

    def remove(self, producer: RocketMQTransactionProducer) -> bool:
        """Forget ``producer``; True when no other producer of its group is left."""
        with self._lock:
            group = producer.producer_group
            refs = [r for r in self._producers.get(group, []) if r() not in (None, producer)]
            if refs:
                self._producers[producer.producer_group] = refs
                return False
            self._producers.pop(producer.producer_group, None)
            return True

    def _select(self, group: str) -> RocketMQTransactionProducer | None:
        with self._lock:
            for ref in reversed(self._producers.get(group, [])):
                producer = ref()
                if producer is not None and not producer.closed:
                    return producer
        return None

    def _on_check(self, addr: str, request: RemotingCommand) -> RemotingCommand | None:
        # ClientRemotingProcessor.checkTransactionState: never answered (the request is one-way)
        header = request.ext_fields
        try:
            msg = decode_messages(bytes(request.body), header.get("bname", ""))[0]
        except (ValueError, IndexError) as err:
            log.warning("check-back from %s: cannot decode its message (%s)", addr, err)
            return None
        group = msg.properties.get(MessageConst.PROPERTY_PRODUCER_GROUP)
        producer = self._select(group) if group else None
        if producer is None:
            log.debug("check-back from %s for producer group %r: no such producer here", addr, group)
            return None
        producer._check_later(addr, dict(header), msg)
        return None


_DISPATCHERS: weakref.WeakKeyDictionary[RemotingClient, _CheckDispatcher] = weakref.WeakKeyDictionary()
_DISPATCHERS_LOCK = threading.Lock()


def _dispatcher(remoting: RemotingClient) -> _CheckDispatcher:
    with _DISPATCHERS_LOCK:
        found = _DISPATCHERS.get(remoting)
        if found is None:
            found = _DISPATCHERS[remoting] = _CheckDispatcher(remoting)
        return found


class RocketMQTransactionProducer(TransactionProducer):
    """:class:`~pyspark_pymq.client.transaction.TransactionProducer` for Apache RocketMQ.

    Made by ``TransactionProducer(namesrv_addr="host:9876", producer_group=...,
    check_listener=...)``; the same methods. ``heartbeat_interval_s``: how often the
    group is registered again with every broker (RocketMQ's 30 s).

    Construction fails (BrokerUnavailableError naming the address) when no name server
    answers; a broker that does not answer is registered with at the next heartbeat.
    :meth:`end_transactions` (the pymq broker's EndTransactionBatch) has no RocketMQ
    counterpart and raises.
    """

    def __init__(
        self, endpoint: str | None = None, producer_group: str = "",
        check_listener: Callable[[MessageExt], LocalTransactionState] | None = None, *,
        namesrv_addr: str | None = None, access_key: str | None = None, secret_key: str | None = None,
        send_msg_timeout_ms: int = 3000, tls: bool | TlsConfig | None = None, tls_ca_file: str | None = None,
        tls_cert_file: str | None = None, tls_key_file: str | None = None,
        heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S,
    ) -> None:
        if endpoint is not None or namesrv_addr is None:
            raise ValueError(
                "give exactly one of endpoint ('host:port' of a pymq broker) and namesrv_addr "
                f"('host:9876;host2:9876' of Apache RocketMQ), got endpoint={endpoint!r}, "
                f"namesrv_addr={namesrv_addr!r}"
            )
        self._check_args(producer_group, check_listener)
        if heartbeat_interval_s <= 0:
            raise ValueError(f"heartbeat_interval_s must be > 0, got {heartbeat_interval_s!r}")
        assert check_listener is not None
        self.producer_group = producer_group
        self.check_listener = check_listener
        self.heartbeat_interval_s = heartbeat_interval_s
        self.closed = False
        self._producer = Producer(namesrv_addr=namesrv_addr, access_key=access_key, secret_key=secret_key,
                                  producer_group=producer_group, send_msg_timeout_ms=send_msg_timeout_ms,
                                  tls=client_tls(tls, tls_ca_file, tls_cert_file, tls_key_file))
        from ..backend.rocketmq import RocketMQBackend

        backend = self._producer.backend
        assert isinstance(backend, RocketMQBackend)
        self._backend = backend
        self._api: MQClientAPI = backend.api
        self._timeout_s = send_msg_timeout_ms / 1000.0
        self._client_id = default_client_id()
        self._registered: dict[str, int | None] = {}  # broker address -> connection id registered on
        self._registered_lock = threading.Lock()
        self._checks = ThreadPoolExecutor(1, thread_name_prefix=f"pymq-tx-check-{producer_group}")
        self._closed = threading.Event()
        self._dispatcher = _dispatcher(backend.remoting)
        self._dispatcher.add(self)
        try:
            self._heartbeat_all(first=True)
        except BaseException:
            self._dispatcher.remove(self)
            self._checks.shutdown(wait=False)
            raise
        # the thread holds the producer weakly: one dropped without close() (a notebook cell run
        # again) is collected, and stops heartbeating and answering check-backs with its old listener
        self._thread = threading.Thread(target=_heartbeat_loop, args=(weakref.ref(self), self._closed,
                                        heartbeat_interval_s), name="pymq-tx-heartbeat", daemon=True)
        self._thread.start()
        weakref.finalize(self, self._closed.set)

    # -- registration -------------------------------------------------------------------

    def _heartbeat(self, addr: str) -> None:
        self._api.heartbeat(addr, self._client_id, producer_groups=[self.producer_group],
                            timeout_s=self._timeout_s)
        with self._registered_lock:
            self._registered[addr] = self._backend.remoting.connection_id(addr)

    def _heartbeat_all(self, *, first: bool = False) -> None:
        """HEART_BEAT with the producer group to every broker (MQClientInstance.sendHeartbeatToAllBroker)."""
        brokers = self._backend.namesrv.get_broker_addrs(timeout_s=self._timeout_s)
        for name, addr in sorted(brokers.items()):
            try:
                self._heartbeat(addr)
            except PymqError as err:
                log.log(logging.WARNING if first else logging.INFO,
                        "producer group %s not registered with broker %s (%s) for check-backs: %s",
                        self.producer_group, name, addr, err)

    def _ensure_registered(self, topic: str) -> None:
        """Register again with the topic's brokers whose connection was made anew since."""
        try:
            addrs = self._backend.route(topic).endpoints.values()
        except PymqError:
            return  # the send names the problem
        remoting = self._backend.remoting
        for addr in addrs:
            with self._registered_lock:
                known = self._registered.get(addr, -1)
            current = remoting.connection_id(addr)
            if current is None or current != known:
                try:
                    self._heartbeat(addr)
                except PymqError as err:
                    log.info("producer group %s: heartbeat to %s failed: %s", self.producer_group, addr, err)

    # -- send and end -------------------------------------------------------------------

    def _send_half(self, half: Message) -> SendResult:
        self._ensure_registered(half.topic)
        return self._producer.send_sync(half)

    def _end_sent(self, message: Message, result: SendResult, state: LocalTransactionState,
                  error: Exception | None) -> None:
        mq = result.message_queue
        remark = (f"executeLocalTransactionBranch exception: {type(error).__name__}: {error}"
                  if error else None)
        try:
            self._api.end_transaction(
                self._backend.broker_addr(mq),
                producer_group=self.producer_group,
                tran_state_table_offset=result.queue_offset,
                commit_log_offset=result.commit_log_offsets[0],
                commit_or_rollback=_FLAG[state],
                msg_id=result.msg_id,
                transaction_id=result.msg_id,
                topic=message.topic,
                broker_name=mq.broker_name,
                remark=remark,
                timeout_s=self._timeout_s,
            )
        except PymqError as err:  # as RocketMQ's client: logged, the check-back mends it
            log.warning("end transaction %s (%s) failed: %s", result.msg_id, state.value, err)

    def end_transactions(self, msg_ids: Sequence[str], state: LocalTransactionState) -> int:
        raise PymqError(
            "end_transactions (many transactions by msgId) is pymq's EndTransactionBatch: Apache "
            "RocketMQ ends each transaction by its half message's offsets (END_TRANSACTION), "
            "which send_message_in_transaction does",
            code="NOT_SUPPORTED",
        )

    # -- check-back ---------------------------------------------------------------------

    def _check_later(self, addr: str, header: dict[str, str], msg: MessageExt) -> None:
        if self.closed:
            return
        with contextlib.suppress(RuntimeError):  # shut down meanwhile
            self._checks.submit(self._check, addr, header, msg)

    def _check(self, addr: str, header: dict[str, str], msg: MessageExt) -> None:
        """DefaultMQProducerImpl.checkTransactionState: ask the listener, answer END_TRANSACTION."""
        remark = None
        try:
            state = _state(self.check_listener(msg))
        except Exception as err:
            log.exception("check listener failed for %s", msg.msg_id)
            state = LocalTransactionState.UNKNOW
            remark = f"checkLocalTransactionState Exception: {type(err).__name__}: {err}"
        uniq = msg.properties.get(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or msg.msg_id
        try:
            self._api.end_transaction(
                addr,
                producer_group=self.producer_group,
                tran_state_table_offset=int(header.get("tranStateTableOffset") or 0),
                commit_log_offset=int(header.get("commitLogOffset") or 0),
                commit_or_rollback=_FLAG[state],
                msg_id=uniq,
                transaction_id=header.get("transactionId"),
                from_transaction_check=True,
                topic=header.get("topic"),
                broker_name=header.get("bname"),
                remark=remark,
                timeout_s=self._timeout_s,
            )
        except PymqError as err:  # the broker checks again later
            log.warning("answer to the check-back of %s failed: %s", uniq, err)

    # -- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop answering check-backs; the last producer of its group here unregisters it."""
        if self.closed:
            return
        self.closed = True
        self._closed.set()
        last = self._dispatcher.remove(self)
        self._checks.shutdown(wait=True)
        if last:
            with self._registered_lock:
                addrs = list(self._registered)
            for addr in addrs:
                with contextlib.suppress(PymqError):  # else the broker forgets it after 120 s
                    self._api.unregister_client(addr, self._client_id, producer_group=self.producer_group,
                                                timeout_s=self._timeout_s)
        self._producer.close()

    def __enter__(self) -> RocketMQTransactionProducer:
        return self


def _heartbeat_loop(ref: weakref.ReferenceType[RocketMQTransactionProducer], closed: threading.Event,
                    interval_s: float) -> None:
    """Register the producer's group again every ``interval_s`` while it is open and referenced."""
    while not closed.wait(interval_s):
        producer = ref()
        if producer is None:
            return
        try:
            producer._heartbeat_all()
        except Exception as err:  # the name servers are away: try again next time
            log.info("heartbeat of producer group %s failed: %s", producer.producer_group, err)
        del producer
