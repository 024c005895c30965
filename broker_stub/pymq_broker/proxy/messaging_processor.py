"""MessagingProcessor: each apache.rocketmq.v2 RPC on top of the broker's processors and managers.

RocketMQ's proxy calls these *activities*. Each method checks the request as
the proxy does, raises :class:`~pymq_broker.proxy.status.ProxyException` with
rocketmq-apis' code for a bad one, and otherwise reuses the broker: sends go
through :class:`~pymq_broker.processor.send_message_processor.SendMessageProcessor`
(delay levels, half messages, %RETRY% rules, de-duplication), dead letters
through the send back, transactions through the end-transaction processor,
group settings from the SubscriptionGroupManager, and receive / ack / change
invisible duration through the :class:`PopMessageManager`.

Topics are never created over this API (TOPIC_NOT_FOUND), as RocketMQ's proxy
does: create them with ``Admin.create_topic`` or ``pymq-admin create-topic``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pymq_proto.record import MessageConst, decode_properties, tag_hash
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.subscription import split_tags
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import group_name_problem, is_system_topic
from ..common.perm import is_readable, is_writeable
from ..manager.topic_config_manager import TopicConfig
from ..processor.context import BrokerContext
from ..processor.end_transaction_processor import EndTransactionProcessor
from ..processor.pull_request_hold_service import PullRequestHoldService
from ..processor.send_back_processor import SendBackProcessor
from ..processor.send_message_processor import SendMessageProcessor
from ..processor.subscription import parse_subscription
from ..store.timer_message_store import TimerMessageStore
from .message_converter import (
    check_topic,
    message_type_of,
    parse_recall_handle,
    parse_record,
    recall_handle,
    to_message_to_send,
    to_v2_message,
)
from .pop_message_manager import DeliveryAttempts, InFlight, PopMessageManager, Popped
from .proxy_config import ProxyConfig
from .status import ProxyException, status

log = logging.getLogger(__name__)

ACCEPT_MESSAGE_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)  # a MIXED topic


def accept_message_types(cfg: TopicConfig) -> tuple[v2.MessageType.ValueType, ...]:
    """What a topic's queues accept: its TopicMessageType, or every type for MIXED."""
    if cfg.message_type == "MIXED":
        return ACCEPT_MESSAGE_TYPES
    return (v2.MessageType.Value(cfg.message_type),)
CONSUMER_TYPES = (v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER, v2.PULL_CONSUMER)
DUE_CHECK_S = 0.2  # how often a long-polling receive looks for messages due again
DEFAULT_REQUEST_TIMEOUT_MS = 3_000  # the official clients' default request timeout


def _now_ms() -> int:
    return int(time.time() * 1000)


class MessagingProcessor:
    """One method per RPC of ``apache.rocketmq.v2.MessagingService`` (see the module's docstring)."""

    def __init__(
        self, ctx: BrokerContext, send: SendMessageProcessor, send_back: SendBackProcessor,
        end_transaction: EndTransactionProcessor, hold: PullRequestHoldService,
        config: ProxyConfig | None = None, attempts_path: Path | None = None,
    ) -> None:
        self.ctx = ctx
        self.send = send
        self.send_back = send_back
        self.end_transaction = end_transaction
        self.hold = hold
        self.config = config or ProxyConfig(
            min_invisible_time_mills_for_recv=ctx.broker_config.min_invisible_time_mills_for_recv
        )
        attempts = DeliveryAttempts(attempts_path)
        attempts.load()
        self.pop = PopMessageManager(ctx.store, ctx.consumer_offset_manager, self.connected,
                                     self.config.renew_max_time_millis, attempts)
        ctx.delete_topic_hooks.append(self.pop.clean_by_topic)
        ctx.reset_offset_hooks.append(self.pop.reset_offset)
        self.timer: TimerMessageStore | None = None  # the controller's, for RecallMessage
        self.clients: dict[str, v2.Settings] = {}  # client id -> its settings (Telemetry)
        self._streams: dict[str, int] = {}  # client id -> its open Telemetry streams
        self._rotation = itertools.count()

    # -- checks -----------------------------------------------------------------------------------
    def topic_config(self, resource: v2.Resource) -> TopicConfig:
        """The topic's config: ILLEGAL_TOPIC for a bad name, TOPIC_NOT_FOUND for an unknown one."""
        name = resource.name
        check_topic(name)
        cfg = self.ctx.topic_config_manager.select_topic_config(name)
        if cfg is None:
            raise ProxyException(
                v2.TOPIC_NOT_FOUND,
                f"topic {name!r} not found on broker {self.ctx.broker_name}; create it first "
                "(Admin.create_topic / pymq-admin create-topic): topics are not created over this API",
            )
        return cfg

    @staticmethod
    def group_name(resource: v2.Resource) -> str:
        problem = group_name_problem(resource.name)
        if problem:
            raise ProxyException(v2.ILLEGAL_CONSUMER_GROUP, problem)
        return resource.name

    def _broker(self, access_point: v2.Endpoints | None) -> v2.Broker:
        """This broker, at the address the client used when it has one (as the proxy answers)."""
        broker = v2.Broker(name=self.ctx.broker_name, id=0)
        if access_point is not None and access_point.addresses:
            broker.endpoints.CopyFrom(access_point)
        else:
            host, _, port = self.ctx.endpoint.rpartition(":")
            broker.endpoints.scheme = v2.IPv4
            broker.endpoints.addresses.add(host=host, port=int(port))
        return broker

    @staticmethod
    def _permission(perm: int) -> v2.Permission.ValueType:
        readable, writeable = is_readable(perm), is_writeable(perm)
        if readable and writeable:
            return v2.READ_WRITE
        return v2.READ if readable else v2.WRITE if writeable else v2.NONE

    # -- route, heartbeat, assignment -------------------------------------------------------------
    def query_route(self, req: sv.QueryRouteRequest) -> sv.QueryRouteResponse:
        cfg = self.topic_config(req.topic)
        broker = self._broker(req.endpoints)
        out = sv.QueryRouteResponse(status=status())
        for queue_id in range(max(cfg.read_queue_nums, cfg.write_queue_nums)):
            perm = cfg.perm
            if queue_id >= cfg.read_queue_nums:
                perm &= ~4
            if queue_id >= cfg.write_queue_nums:
                perm &= ~2
            out.message_queues.add(
                topic=req.topic, id=queue_id, permission=self._permission(perm), broker=broker,
                accept_message_types=accept_message_types(cfg),
            )
        return out

    def heartbeat(self, req: sv.HeartbeatRequest) -> sv.HeartbeatResponse:
        """A consumer's group: created with defaults on first use, with its %RETRY% topic (as HEART_BEAT)."""
        if req.client_type in CONSUMER_TYPES and req.group.name:
            group = self.group_name(req.group)
            sub = self.ctx.subscription_group_manager.find_subscription_group_config(group)
            self.ctx.topic_config_manager.create_topic_of_retry(group, sub.retry_queue_nums)
        return sv.HeartbeatResponse(status=status())

    def query_assignment(self, req: sv.QueryAssignmentRequest) -> sv.QueryAssignmentResponse:
        """RouteActivity.queryAssignment: a group that is not orderly gets one assignment, queue id -1
        (a pop consumer reads every queue); an orderly (FIFO) group one per readable queue, so that
        a FIFO push consumer keeps one process queue, consumed in order, per queue. FORBIDDEN when
        the topic has no readable queue. (Either way ReceiveMessage pops every queue of the broker,
        as the proxy's ReceiveMessageQueueSelector asks the broker for queue id -1.)"""
        cfg = self.topic_config(req.topic)
        group = self.group_name(req.group)
        if not is_readable(cfg.perm) or cfg.read_queue_nums <= 0:
            raise ProxyException(v2.FORBIDDEN, "no readable queue")
        sub = self.ctx.subscription_group_manager.find_subscription_group_config(group)
        queue_ids = range(cfg.read_queue_nums) if sub.consume_message_orderly else (-1,)
        broker, permission = self._broker(req.endpoints), self._permission(cfg.perm)
        out = sv.QueryAssignmentResponse(status=status())
        for queue_id in queue_ids:
            out.assignments.add().message_queue.CopyFrom(v2.MessageQueue(
                topic=req.topic, id=queue_id, permission=permission, broker=broker,
                accept_message_types=accept_message_types(cfg),
            ))
        return out

    def notify_client_termination(
        self, req: sv.NotifyClientTerminationRequest, client_id: str
    ) -> sv.NotifyClientTerminationResponse:
        self.clients.pop(client_id, None)
        self._clear_receipt_handles(client_id)
        return sv.NotifyClientTerminationResponse(status=status())

    def _clear_receipt_handles(self, client_id: str) -> None:
        """A client gone (unregistered): what it received with auto renew is visible again in
        invisibleTimeMillisWhenClear (DefaultReceiptHandleManager.clearGroup)."""
        if client_id:
            self.pop.clear_owner(client_id, self.config.invisible_time_millis_when_clear, _now_ms())

    # -- send ---------------------------------------------------------------------------------------
    async def send_message(
        self, req: sv.SendMessageRequest, remote_address: str = ""
    ) -> sv.SendMessageResponse:
        """``remote_address``: the sender's ``host:port`` (a message's born host when it has none)."""
        if not req.messages:
            raise ProxyException(v2.BAD_REQUEST, "SendMessage carries no message")
        entries = [await self._send_one(m, remote_address) for m in req.messages]
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            overall = entries[0].status
        else:
            overall = status(v2.MULTIPLE_RESULTS, "the messages of this request had different results")
        return sv.SendMessageResponse(status=overall, entries=entries)

    async def _send_one(self, msg: v2.Message, remote_address: str = "") -> sv.SendResultEntry:
        try:
            cfg = self.topic_config(msg.topic)
            if is_system_topic(cfg.topic_name):
                raise ProxyException(v2.FORBIDDEN, f"topic {cfg.topic_name!r} belongs to the broker")
            store_config = self.ctx.store.config
            m = to_message_to_send(
                msg, config=self.config, max_body_size=store_config.max_message_size,
                producer_group=cfg.topic_name, remote_address=remote_address,
            )
            self._check_message_type(cfg, m.properties)
            queue_id = self._send_queue_id(m.message_group, cfg)
            req = pymq_pb2.SendMessageRequest(
                producer_group=cfg.topic_name, topic=cfg.topic_name, queue_id=queue_id,
                born_timestamp=m.born_timestamp,
                messages=[pymq_pb2.MessageData(body=m.body, flag=0, properties=m.properties)],
            )
            try:
                resp = await self.send.send_message(req)
            except BrokerException as err:
                raise ProxyException.of(err) from None
            if resp.status == pymq_pb2.FLUSH_DISK_TIMEOUT_STATUS:
                raise ProxyException(
                    v2.MASTER_PERSISTENCE_TIMEOUT, "stored, but not flushed within syncFlushTimeout"
                )
            transaction_id = m.message_id if m.message_type == v2.TRANSACTION else ""
            deliver_ms = msg.system_properties.delivery_timestamp.ToMilliseconds() \
                if msg.system_properties.HasField("delivery_timestamp") else 0
            return sv.SendResultEntry(
                status=status(), message_id=m.message_id, transaction_id=transaction_id,
                offset=max(resp.queue_offset, 0),
                recall_handle=recall_handle(cfg.topic_name, self.ctx.broker_name, deliver_ms,
                                            m.message_id) if deliver_ms > _now_ms() else "",
            )
        except ProxyException as err:
            return sv.SendResultEntry(status=status(err.code, err.message),
                                      message_id=msg.system_properties.message_id)

    @staticmethod
    def _send_queue_id(message_group: str, cfg: TopicConfig) -> int:
        """The proxy's SendMessageQueueSelector: a message group (FIFO) always goes to one queue;
        any other message to the broker's next queue, round robin (-1). The request's
        ``queue_id`` is not read, as the proxy does not: rocketmq-python-client never sets it,
        and its 0 sent every message to queue 0."""
        if message_group:
            return tag_hash(message_group.encode()) % cfg.write_queue_nums
        return -1

    async def recall_message(self, req: sv.RecallMessageRequest) -> sv.RecallMessageResponse:
        """RocketMQ 5.3's recall: a timer message not delivered yet is never delivered."""
        cfg = self.topic_config(req.topic)
        topic, broker_name, message_id = parse_recall_handle(req.recall_handle)
        if topic != cfg.topic_name or broker_name != self.ctx.broker_name:
            raise ProxyException(
                v2.BAD_REQUEST,
                f"recall handle is for topic {topic!r} on broker {broker_name!r}, not {cfg.topic_name!r} "
                f"on {self.ctx.broker_name!r}",
            )
        # the stored message's REAL_TOPIC must be the topic too (TimerMessageStore.recall): the
        # handle and the request's topic are both the caller's, so they alone prove nothing
        if self.timer is None or not await self.timer.recall(cfg.topic_name, message_id):
            raise ProxyException(
                v2.MESSAGE_NOT_FOUND,
                f"message {message_id!r} of {topic!r} is not waiting for its delivery time: delivered or "
                "recalled already",
            )
        return sv.RecallMessageResponse(status=status(), message_id=message_id)

    def _check_message_type(self, cfg: TopicConfig, properties: bytes) -> None:
        """The proxy's TopicMessageTypeValidator: a message of the topic's type (a MIXED topic: any)."""
        expected = cfg.message_type
        if not self.config.enable_topic_message_type_check or expected == "MIXED":
            return
        actual = v2.MessageType.Name(message_type_of(decode_properties(properties)))
        if actual != expected:
            raise ProxyException(
                v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"TopicMessageType validate failed, the expected type is {expected}, but actual type is "
                f"{actual}: topic {cfg.topic_name!r} takes {expected} messages (create it with "
                f"message_type={actual!r} or 'MIXED': Admin.create_topic, pymq-admin create-topic "
                "--message-type)",
            )

    async def end_transaction_message(self, req: sv.EndTransactionRequest) -> sv.EndTransactionResponse:
        """COMMIT stores the half message in its topic, ROLLBACK drops it (by message id).

        Only a pending half message of the request's topic, sent over v2 (PGROUP is its
        topic: the proxy's producer group), is ended: RocketMQ's proxy finds the
        transaction by (producer group = topic, transaction id) and the broker's
        checkPrepareMessage refuses another producer group. The id alone would let a
        caller allowed to publish on any topic end every group's transactions.
        """
        cfg = self.topic_config(req.topic)
        if not req.message_id:
            raise ProxyException(v2.ILLEGAL_MESSAGE_ID, "EndTransaction needs the message_id")
        if req.transaction_id and req.transaction_id != req.message_id:
            raise ProxyException(
                v2.INVALID_TRANSACTION_ID,
                f"transaction id {req.transaction_id!r} is not the one returned for message "
                f"{req.message_id!r}",
            )
        if req.resolution == v2.COMMIT:
            state = pymq_pb2.COMMIT_MESSAGE
        elif req.resolution == v2.ROLLBACK:
            state = pymq_pb2.ROLLBACK_MESSAGE
        else:
            raise ProxyException(
                v2.BAD_REQUEST, f"transaction resolution {req.resolution} is neither COMMIT nor ROLLBACK"
            )
        self._check_transaction_of(cfg.topic_name, req.message_id)
        try:
            await self.end_transaction.end_transaction(
                pymq_pb2.EndTransactionRequest(msg_id=req.message_id, state=state)
            )
        except BrokerException as err:
            raise ProxyException.of(err) from None
        return sv.EndTransactionResponse(status=status())

    def _check_transaction_of(self, topic: str, message_id: str) -> None:
        """INVALID_TRANSACTION_ID unless ``message_id`` is a pending half message that a v2 send of
        ``topic`` stored (REAL_TOPIC and PGROUP both ``topic``); no await until it is ended."""
        pending = self.end_transaction.service.pending.get(message_id)
        record = None if pending is None else self.ctx.store.look_message_by_offset(pending[1])
        if record is None:
            raise ProxyException(
                v2.INVALID_TRANSACTION_ID,
                f"message {message_id!r} is not a pending transaction: ended or given up already, "
                "or never sent",
            )
        props = parse_record(record).properties
        if (props.get(MessageConst.PROPERTY_REAL_TOPIC) != topic
                or props.get(MessageConst.PROPERTY_PRODUCER_GROUP) != topic):
            raise ProxyException(
                v2.INVALID_TRANSACTION_ID,
                f"message {message_id!r} is not a pending transaction of topic {topic!r} sent over "
                "apache.rocketmq.v2: end it with the topic it was sent to (a pymq TransactionProducer's "
                "transaction: with its producer group)",
            )

    # -- receive ------------------------------------------------------------------------------------
    def _invisible_ms(self, duration_ms: int, min_ms: int = 0) -> int:
        """GrpcValidator.validateInvisibleTime: ``min_ms`` .. maxInvisibleTimeMills. A receive's
        minimum is minInvisibleTimeMillsForRecv; ChangeInvisibleDuration's is 0 (a push
        consumer's nack asks for its retry delay, and 0 makes the message due at once)."""
        c = self.config
        if not min_ms <= duration_ms <= c.max_invisible_time_mills:
            raise ProxyException(
                v2.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {duration_ms} ms is out of range "
                f"{min_ms}..{c.max_invisible_time_mills} ms",
            )
        return duration_ms

    def _filter(
        self, expression: v2.FilterExpression
    ) -> tuple[frozenset[int] | None, frozenset[str] | None, Callable[[bytes], bool] | None]:
        return parse_filter(expression, enable_property_filter=self.ctx.broker_config.enable_property_filter)

    def _polling_ms(self, req: sv.ReceiveMessageRequest, time_remaining_s: float | None) -> int:
        """How long a receive may wait for messages: RocketMQ proxy's rule (ReceiveMessageActivity).

        The request's long polling timeout (else the call's deadline less half the
        default request timeout), within the proxy's bounds (5 s .. 20 s), and
        never past the call's deadline: a deadline closer than the 5 s minimum is
        ILLEGAL_POLLING_TIME. The answer leaves ``long_polling_reserve_time_in_millis``
        before the deadline.
        """
        c = self.config
        remaining = None if time_remaining_s is None else int(time_remaining_s * 1000)
        if req.HasField("long_polling_timeout"):
            polling = req.long_polling_timeout.ToMilliseconds()
        elif remaining is not None:
            polling = remaining - DEFAULT_REQUEST_TIMEOUT_MS // 2
        else:
            polling = c.max_long_polling_timeout_mills
        polling = min(max(polling, c.min_long_polling_timeout_mills), c.max_long_polling_timeout_mills)
        if remaining is not None and polling > remaining:
            if remaining < c.min_long_polling_timeout_mills:
                raise ProxyException(
                    v2.ILLEGAL_POLLING_TIME,
                    f"the call's deadline leaves {remaining} ms, less than the "
                    f"{c.min_long_polling_timeout_mills} ms a receive polls at least; give the call a "
                    "longer timeout than the long polling timeout",
                )
            polling = remaining
        return max(polling - c.long_polling_reserve_time_in_millis, 0)

    async def receive_message(
        self, req: sv.ReceiveMessageRequest, time_remaining_s: float | None = None, client_id: str = "",
    ) -> list[sv.ReceiveMessageResponse]:
        """Pop: messages due again first, then new ones, each queue of the topic in turn; long polling.

        Every queue whatever the request's queue id (an orderly group's assignment names one): the
        proxy's ReceiveMessageQueueSelector picks the broker's queue id -1, which pops them all."""
        group = self.group_name(req.group)
        cfg = self.topic_config(req.message_queue.topic)
        if not is_readable(cfg.perm):
            raise ProxyException(v2.FORBIDDEN, f"topic {cfg.topic_name!r} is not readable")
        if not 1 <= req.batch_size <= self.config.receive_batch_size:
            raise ProxyException(
                v2.BAD_REQUEST,
                f"batch size {req.batch_size} is out of range 1..{self.config.receive_batch_size}",
            )
        if req.auto_renew:  # a push consumer: the proxy's time whatever the request asks for (ReceiveMessage-
            # Activity), then renewed while the client is connected (PopMessageManager)
            invisible_ms = self.config.default_invisible_time_mills
        elif req.HasField("invisible_duration"):
            invisible_ms = self._invisible_ms(req.invisible_duration.ToMilliseconds(),
                                              self.config.min_invisible_time_mills_for_recv)
        else:
            raise ProxyException(
                v2.ILLEGAL_INVISIBLE_TIME, "a receive without auto renew needs an invisible duration"
            )
        tag_hashes, tags, prop_filter = self._filter(req.filter_expression)
        polling_ms = self._polling_ms(req, time_remaining_s)
        sub = self.ctx.subscription_group_manager.find_subscription_group_config(group)
        if not sub.consume_enable:  # RocketMQ's PopMessageProcessor: NO_PERMISSION
            raise ProxyException(v2.FORBIDDEN, f"consumer group {group!r} has consumption disabled "
                                               "(consumeEnable false)")
        max_attempts = sub.retry_max_times + 1
        deadline = time.monotonic() + polling_ms / 1000.0
        while True:
            popped = await self._pop(group, cfg, req.batch_size, invisible_ms, max_attempts,
                                     tag_hashes, tags, prop_filter, client_id if req.auto_renew else "",
                                     sub.consume_message_orderly)
            left = deadline - time.monotonic()
            if popped or left <= 0:
                break
            await self._wait(group, cfg, left)
        if not popped:
            return [sv.ReceiveMessageResponse(status=status(v2.MESSAGE_NOT_FOUND, "no new message"))]
        # when the messages left the broker: clients measure their receive latency from it
        sent = sv.ReceiveMessageResponse()
        sent.delivery_timestamp.FromMilliseconds(_now_ms())
        out = [sent, sv.ReceiveMessageResponse(status=status())]
        for p in popped:
            f = p.inflight
            out.append(sv.ReceiveMessageResponse(message=to_v2_message(
                p.message, receipt_handle=f.handle, delivery_attempt=f.delivery_attempt,
                invisible_ms=f.invisible_ms,
            )))
        return out

    async def _pop(
        self, group: str, cfg: TopicConfig, batch: int, invisible_ms: int, max_attempts: int,
        tag_hashes: frozenset[int] | None, tags: frozenset[str] | None,
        prop_filter: Callable[[bytes], bool] | None, owner: str, fifo: bool = False,
    ) -> list[Popped]:
        """Due messages first (dead-lettered past ``max_attempts``), then new ones; ``owner``:
        the client id of an auto-renewing receive; ``fifo``: a queue with messages in flight
        gives none new (a FIFO group's queue is held until they are acked)."""
        topic = cfg.topic_name
        now = _now_ms()
        out: list[Popped] = []
        due = self.pop.due(group, topic, now, batch, fifo)
        stalled: set[int] = set()  # fifo: queues whose earlier message stays put (nothing after it goes)
        handled = 0
        try:
            for inflight in due:
                handled += 1
                if inflight.forgotten:  # its queue's offset was reset during an earlier await
                    continue
                if inflight.queue_id in stalled:
                    self.pop.put_back(inflight)
                    continue
                if inflight.delivery_attempt >= max_attempts:
                    # shielded: a cancelled receive (client deadline) must not stop the DLQ write
                    # between the store and remove(), nor lose the message from the books
                    if not await asyncio.shield(self._dead_letter(inflight, max_attempts, now)) and fifo:
                        stalled.add(inflight.queue_id)
                    continue
                try:
                    record = self.ctx.store.look_message_by_offset(inflight.commit_log_offset)
                except Exception:  # a due message must never be dropped from the books: try again soon
                    log.exception("reading %s of group %s for redelivery failed",
                                  inflight.commit_log_offset, group)
                    self.pop.postpone(inflight, 1000, now)
                    if fifo:
                        stalled.add(inflight.queue_id)
                    continue
                if record is None:  # expired from the store: nothing to deliver any more
                    self.pop.remove(inflight)
                    continue
                again = self.pop.redeliver(inflight, invisible_ms, now, owner)
                out.append(Popped(parse_record(record), again))
        finally:  # cancelled (CancelledError) or failed: what was taken and not handled is due again
            for inflight in due[handled:]:
                self.pop.put_back(inflight)
        queues = cfg.read_queue_nums
        start = next(self._rotation)
        for i in range(queues):
            if len(out) >= batch:
                break
            queue_id = (start + i) % queues
            out.extend(self.pop.pop_new(
                group, topic, queue_id, batch - len(out), invisible_ms, now, tag_hashes, tags, prop_filter,
                owner, fifo,
            ))
        return out

    async def _dead_letter(self, inflight: InFlight, max_attempts: int, now: int) -> bool:
        """Past the group's max delivery attempts: to %DLQ%<group> through the send back, then done.

        False if it could not: kept in flight, never dropped; the next receive tries again.
        """
        try:
            await self._forward_to_dlq(inflight, max_attempts)
        except Exception as err:
            log.warning("could not dead-letter %s of group %s (%s); trying again in 1 s",
                        inflight.commit_log_offset, inflight.group, err)
            self.pop.postpone(inflight, 1000, now)
            return False
        self.pop.remove(inflight)
        return True

    async def _forward_to_dlq(self, inflight: InFlight, max_attempts: int) -> None:
        req = pymq_pb2.ConsumerSendMsgBackBatchRequest(
            group=inflight.group, max_reconsume_times=max(max_attempts - 1, 1),
            commit_log_offsets=[inflight.commit_log_offset], delay_levels=[-1],
            origin_topics=[inflight.topic],
        )
        try:
            resp = await self.send_back.consumer_send_msg_back_batch(
                req, deliveries=[inflight.delivery_attempt])
        except BrokerException as err:
            raise ProxyException.of(err) from None
        if resp.errors[0]:
            raise ProxyException(v2.INTERNAL_SERVER_ERROR, resp.errors[0])

    async def _wait(self, group: str, cfg: TopicConfig, left_s: float) -> None:
        """Until a message arrives on a queue of the topic, one is due again, or ``left_s`` passes.

        At most :data:`DUE_CHECK_S` at a time: another consumer of the group may
        meanwhile change a message's invisible duration to end sooner.
        """
        left_s = min(left_s, DUE_CHECK_S)
        due = self.pop.next_due_ms(group, cfg.topic_name)
        if due is not None:
            left_s = min(left_s, max(due - _now_ms(), 0) / 1000.0 + 0.001)
        topic = cfg.topic_name
        waits = [
            asyncio.ensure_future(self.hold.suspend(topic, q, self.pop.next_offset(group, topic, q), left_s))
            for q in range(cfg.read_queue_nums)
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    # -- ack, change invisible duration, dead letter ------------------------------------------------
    def ack_message(self, req: sv.AckMessageRequest) -> sv.AckMessageResponse:
        group = self.group_name(req.group)
        topic = self.topic_config(req.topic).topic_name
        if not req.entries:
            raise ProxyException(v2.BAD_REQUEST, "AckMessage carries no entry")
        now = _now_ms()
        entries = []
        for e in req.entries:
            try:
                self.pop.ack(group, topic, e.receipt_handle, now)
                result = status()
            except ProxyException as err:
                result = status(err.code, err.message)
            entries.append(sv.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=result
            ))
        return sv.AckMessageResponse(status=_overall(entries), entries=entries)

    def change_invisible_duration(
        self, req: sv.ChangeInvisibleDurationRequest
    ) -> sv.ChangeInvisibleDurationResponse:
        group = self.group_name(req.group)
        topic = self.topic_config(req.topic).topic_name
        invisible_ms = self._invisible_ms(req.invisible_duration.ToMilliseconds())
        renewed = self.pop.change_invisible_duration(
            group, topic, req.receipt_handle, invisible_ms, _now_ms()
        )
        return sv.ChangeInvisibleDurationResponse(status=status(), receipt_handle=renewed.handle)

    async def forward_message_to_dead_letter_queue(
        self, req: sv.ForwardMessageToDeadLetterQueueRequest
    ) -> sv.ForwardMessageToDeadLetterQueueResponse:
        """The consumer gives up on a message (a push consumer after its max attempts): %DLQ%<group>."""
        group = self.group_name(req.group)
        topic = self.topic_config(req.topic).topic_name
        inflight = self.pop.find(group, topic, req.receipt_handle, _now_ms())
        await self._forward_to_dlq(inflight, max(req.max_delivery_attempts, inflight.delivery_attempt))
        self.pop.remove(inflight)
        return sv.ForwardMessageToDeadLetterQueueResponse(status=status())

    # -- clients (Telemetry) ------------------------------------------------------------------------
    def stream_opened(self, client_id: str) -> None:
        """A client's Telemetry stream opened: it is connected (its push consumer's messages renew)."""
        self._streams[client_id] = self._streams.get(client_id, 0) + 1

    def stream_closed(self, client_id: str) -> None:
        left = self._streams.get(client_id, 0) - 1
        if left > 0:
            self._streams[client_id] = left
        else:  # gone: its settings go too (a client that comes back sends them again)
            self._streams.pop(client_id, None)
            self.clients.pop(client_id, None)
            # Its messages are no longer renewed, but stay hidden for their invisible time: a client
            # that reconnects at once is still working on them. RocketMQ's proxy clears a client's
            # handles only when it unregisters (NotifyClientTermination) or its channel expires.

    def connected(self, client_id: str) -> bool:
        """Whether the client has a Telemetry stream open (RocketMQ: its channel is alive)."""
        return client_id in self._streams

    # -- settings (Telemetry) -----------------------------------------------------------------------
    def settings(self, client_id: str, settings: v2.Settings) -> v2.Settings:
        """The settings a client sent, completed with the broker's side, as the proxy answers them."""
        out = v2.Settings()
        out.CopyFrom(settings)
        if settings.HasField("subscription"):
            group = self.group_name(settings.subscription.group)
            sub = self.ctx.subscription_group_manager.find_subscription_group_config(group)
            policy = out.backoff_policy
            policy.Clear()
            policy.max_attempts = sub.retry_max_times + 1
            for ms in CUSTOMIZED_RETRY_NEXT_MS:
                policy.customized_backoff.next.add().FromMilliseconds(ms)
            s = out.subscription
            s.fifo = sub.consume_message_orderly
            s.receive_batch_size = self.config.receive_batch_size
            if not s.HasField("long_polling_timeout"):
                s.long_polling_timeout.FromMilliseconds(self.config.max_long_polling_timeout_mills)
        elif settings.HasField("publishing"):
            p = out.publishing
            p.max_body_size = self.ctx.store.config.max_message_size
            p.validate_message_type = True
            attempts = settings.backoff_policy.max_attempts if settings.HasField("backoff_policy") else 0
            policy = out.backoff_policy
            policy.Clear()
            policy.max_attempts = attempts or 3
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromMilliseconds(1000)
            policy.exponential_backoff.multiplier = 2.0
        self.clients[client_id] = out
        return out


def parse_filter(
    expression: v2.FilterExpression, *, enable_property_filter: bool
) -> tuple[frozenset[int] | None, frozenset[str] | None, Callable[[bytes], bool] | None]:
    """(tag hashes, tags, property filter) of a filter expression; ILLEGAL_FILTER_EXPRESSION if bad.

    TAG: ``*`` (or nothing) or ``A || B``; the tags are checked exactly after the
    consume queue's hash. SQL: RocketMQ's SQL92, with enablePropertyFilter.
    """
    text = expression.expression.strip()
    if expression.type == v2.SQL:
        try:
            sub = parse_subscription(text, "SQL92", enable_property_filter=enable_property_filter)
        except BrokerException as err:
            raise ProxyException(v2.ILLEGAL_FILTER_EXPRESSION, err.remark) from None
        return None, None, sub.property_filter
    if expression.type not in (v2.TAG, v2.FILTER_TYPE_UNSPECIFIED):
        raise ProxyException(v2.ILLEGAL_FILTER_EXPRESSION, f"filter type {expression.type} is unknown")
    named = split_tags(text)
    if named is None:
        return None, None, None
    tags = frozenset(t for t in named if t)
    if not tags:
        raise ProxyException(v2.ILLEGAL_FILTER_EXPRESSION, f"tag expression {text!r} names no tag")
    return frozenset(tag_hash(t.encode()) for t in tags), tags, None


# RocketMQ's CustomizedRetryPolicy default (remoting ... subscription/CustomizedRetryPolicy.java), what
# GrpcClientSettingsManager sends a group without its own retry policy; the client's attempt N waits
# entry N-1. pymq groups have no retry policy of their own, so every group gets this list.
CUSTOMIZED_RETRY_NEXT_MS: tuple[int, ...] = tuple(
    s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)


def _overall(entries: Sequence[sv.AckMessageResultEntry]) -> v2.Status:
    codes = {e.status.code for e in entries}
    if len(codes) == 1:
        return entries[0].status
    return status(v2.MULTIPLE_RESULTS, "the entries of this request had different results")
