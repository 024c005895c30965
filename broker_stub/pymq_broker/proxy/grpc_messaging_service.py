"""GrpcMessagingService: the servicer of ``apache.rocketmq.v2.MessagingService``; it only routes.

As RocketMQ's proxy, every answer carries a ``Status`` with rocketmq-apis'
code: a :class:`~pymq_broker.proxy.status.ProxyException` (or a processor's
BrokerException, mapped) becomes the response's status, any other failure
INTERNAL_SERVER_ERROR with its message; the gRPC call itself succeeds, which
is what the official clients expect. RPCs pymq does not serve yet answer
NOT_IMPLEMENTED. PullMessage, UpdateOffset, GetOffset and QueryOffset, which
RocketMQ's proxy leaves unimplemented, go to
:class:`~pymq_broker.proxy.pull_offset_processor.PullOffsetProcessor`.

The client's id comes in the ``x-mq-client-id`` metadata of every call.
Telemetry is a two-way stream: the client sends its settings and receives them
completed; a transactional producer receives the broker's check-backs on it
(``recover_orphaned_transaction_command``) and answers with EndTransaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc

from ..auth.auth_service import AuthService
from ..auth.model import User
from ..common.broker_exception import BrokerException, bounded_remark
from ..common.remoting_helper import parse_peer_address
from ..processor.end_transaction_processor import ProducerManager
from ..transaction.transactional_message_service import TransactionCheck
from .message_converter import parse_record, to_v2_message
from .messaging_processor import MessagingProcessor
from .pull_offset_processor import PullOffsetProcessor
from .status import ProxyException, status

log = logging.getLogger(__name__)

CLIENT_ID_METADATA_KEY = "x-mq-client-id"
Context = grpc.aio.ServicerContext[Any, Any]


def client_id_of(context: Context) -> str:
    """The calling client's id (``x-mq-client-id``), or "" without one."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return ""


def remote_address_of(context: Context) -> str:
    """The caller's ``host:port`` as the proxy's HeaderInterceptor writes it; "" when it is not an
    IP address (a Unix socket), as there."""
    return parse_peer_address(context.peer() or "")


def _failure_status(err: Exception, rpc: str) -> v2.Status:
    """The answer's Status; its message is cut as a BrokerException's remark is (an echo of an
    unexpected error's value could be megabytes)."""
    if isinstance(err, ProxyException):
        return status(err.code, bounded_remark(err.message))
    if isinstance(err, BrokerException):
        proxy = ProxyException.of(err)
        return status(proxy.code, bounded_remark(proxy.message))
    log.exception("%s failed", rpc)
    return status(v2.INTERNAL_SERVER_ERROR, bounded_remark(f"{rpc} failed: {err!r}"))


def _unary(
    rpc: str, handler_name: str, response: Callable[..., Any], target: str = "processor"
) -> Callable[..., Awaitable[Any]]:
    """An RPC whose request goes to ``<target>.<handler_name>`` as it is."""
    async def method(self: GrpcMessagingService, request: Any, context: Context) -> Any:
        try:
            self.authorize(rpc, request, context)
            result = getattr(getattr(self, target), handler_name)(request)
            if hasattr(result, "__await__"):
                result = await result
            return result
        except Exception as err:  # a bug must not take the broker down
            return response(status=_failure_status(err, rpc))

    method.__name__ = rpc
    return method


def _not_implemented(rpc: str, response: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def method(self: GrpcMessagingService, request: Any, context: Context) -> Any:
        return response(status=status(v2.NOT_IMPLEMENTED, f"{rpc} is not served by the pymq broker yet"))

    method.__name__ = rpc
    return method


class GrpcMessagingService(service_pb2_grpc.MessagingServiceServicer):
    """Maps each RPC of ``apache.rocketmq.v2.MessagingService`` to :class:`MessagingProcessor`."""

    def __init__(
        self, processor: MessagingProcessor, pull_offsets: PullOffsetProcessor, producers: ProducerManager,
        auth: AuthService | None = None,
    ) -> None:
        self.processor = processor
        self.pull_offsets = pull_offsets
        self.producers = producers
        self.auth = auth

    def authorize(self, rpc: str, request: Any, context: Context) -> User | None:
        """With authentication on: the request's signature (the official clients sign every call as
        pymq's own clients do) and, with authorization on, its rights (``v2/<rpc>`` rules);
        a refusal is a BrokerException that becomes UNAUTHORIZED / FORBIDDEN. The caller
        (None with authentication off)."""
        if self.auth is None:
            return None
        return self.auth.check(f"v2/{rpc}", request, context.invocation_metadata(), context.peer())

    QueryRoute = _unary("QueryRoute", "query_route", sv.QueryRouteResponse)
    Heartbeat = _unary("Heartbeat", "heartbeat", sv.HeartbeatResponse)
    QueryAssignment = _unary("QueryAssignment", "query_assignment", sv.QueryAssignmentResponse)
    AckMessage = _unary("AckMessage", "ack_message", sv.AckMessageResponse)
    ChangeInvisibleDuration = _unary(
        "ChangeInvisibleDuration", "change_invisible_duration", sv.ChangeInvisibleDurationResponse
    )
    ForwardMessageToDeadLetterQueue = _unary(
        "ForwardMessageToDeadLetterQueue", "forward_message_to_dead_letter_queue",
        sv.ForwardMessageToDeadLetterQueueResponse,
    )
    EndTransaction = _unary("EndTransaction", "end_transaction_message", sv.EndTransactionResponse)
    UpdateOffset = _unary("UpdateOffset", "update_offset", sv.UpdateOffsetResponse, "pull_offsets")
    GetOffset = _unary("GetOffset", "get_offset", sv.GetOffsetResponse, "pull_offsets")
    QueryOffset = _unary("QueryOffset", "query_offset", sv.QueryOffsetResponse, "pull_offsets")
    RecallMessage = _unary("RecallMessage", "recall_message", sv.RecallMessageResponse)
    SyncLiteSubscription = _not_implemented("SyncLiteSubscription", sv.SyncLiteSubscriptionResponse)

    async def SendMessage(self, request: sv.SendMessageRequest, context: Context) -> sv.SendMessageResponse:
        try:
            self.authorize("SendMessage", request, context)
            return await self.processor.send_message(request, remote_address_of(context))
        except Exception as err:
            return sv.SendMessageResponse(status=_failure_status(err, "SendMessage"))

    async def NotifyClientTermination(
        self, request: sv.NotifyClientTerminationRequest, context: Context
    ) -> sv.NotifyClientTerminationResponse:
        try:
            self.authorize("NotifyClientTermination", request, context)
            return self.processor.notify_client_termination(request, client_id_of(context))
        except Exception as err:
            return sv.NotifyClientTerminationResponse(status=_failure_status(err, "NotifyClientTermination"))

    async def ReceiveMessage(
        self, request: sv.ReceiveMessageRequest, context: Context
    ) -> AsyncIterator[sv.ReceiveMessageResponse]:
        try:
            self.authorize("ReceiveMessage", request, context)
            responses = await self.processor.receive_message(
                request, context.time_remaining(), client_id_of(context)
            )
        except Exception as err:
            responses = [sv.ReceiveMessageResponse(status=_failure_status(err, "ReceiveMessage"))]
        for response in responses:
            yield response

    async def PullMessage(
        self, request: sv.PullMessageRequest, context: Context
    ) -> AsyncIterator[sv.PullMessageResponse]:
        try:
            self.authorize("PullMessage", request, context)
            async for response in self.pull_offsets.pull_message(request):
                yield response
        except Exception as err:
            yield sv.PullMessageResponse(status=_failure_status(err, "PullMessage"))

    async def Telemetry(
        self, request_iterator: AsyncIterator[sv.TelemetryCommand], context: Context
    ) -> AsyncIterator[sv.TelemetryCommand]:
        """Settings in, settings out; check-backs out to a transactional producer's stream."""
        client_id = client_id_of(context)
        try:  # who opens the stream; each settings command is authorized as it comes
            user = self.authorize("Telemetry", v2.Settings(), context)
        except Exception as err:
            yield sv.TelemetryCommand(status=_failure_status(err, "Telemetry"))
            return
        outbox: asyncio.Queue[sv.TelemetryCommand | None] = asyncio.Queue()
        checks: list[tuple[str, asyncio.Queue[TransactionCheck]]] = []
        forwarders: list[asyncio.Task[None]] = []

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if command.HasField("settings"):
                        answer = self._settings(client_id, command.settings, checks, forwarders, outbox,
                                                context, user)
                        outbox.put_nowait(answer)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(read())
        self.processor.stream_opened(client_id)
        try:
            while (command := await outbox.get()) is not None:
                yield command
        finally:
            self.processor.stream_closed(client_id)
            reader.cancel()
            for task in forwarders:
                task.cancel()
            for topic, queue in checks:
                self.producers.unregister_topic(topic, queue)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    def _settings(
        self, client_id: str, settings: v2.Settings,
        checks: list[tuple[str, asyncio.Queue[TransactionCheck]]],
        forwarders: list[asyncio.Task[None]], outbox: asyncio.Queue[sv.TelemetryCommand | None],
        context: Context, user: User | None,
    ) -> sv.TelemetryCommand:
        try:
            self.authorize("Telemetry", settings, context)
            answer = self.processor.settings(client_id, settings)
        except Exception as err:
            return sv.TelemetryCommand(status=_failure_status(err, "Telemetry"))
        if settings.HasField("publishing"):  # a producer hears the check-backs of its topics' transactions
            known = {topic for topic, _ in checks}
            for topic in settings.publishing.topics:
                if topic.name and topic.name not in known:
                    # the v2 namespace: a v1 producer group of the same name is another producer
                    queue = self.producers.register_topic(topic.name)
                    checks.append((topic.name, queue))
                    forwarders.append(asyncio.ensure_future(
                        self._forward_checks(topic.name, queue, checks, outbox, user, context.peer())))
        return sv.TelemetryCommand(status=status(), settings=answer)

    async def _forward_checks(
        self, topic: str, queue: asyncio.Queue[TransactionCheck],
        checks: list[tuple[str, asyncio.Queue[TransactionCheck]]],
        outbox: asyncio.Queue[sv.TelemetryCommand | None], user: User | None, peer: str,
    ) -> None:
        """The check-backs of ``topic`` to the stream, each under the user's rights of now (Pub on
        the check's topic), as a v1 TransactionStream re-checks: a user who lost them hears no
        more of the topic's check-backs (they go to other producers, or come again later)."""
        while True:
            check = await queue.get()
            if self.auth is not None and user is not None:
                publishing = v2.Settings(publishing=v2.Publishing(topics=[v2.Resource(name=check.topic)]))
                try:
                    self.auth.recheck(user, "v2/Telemetry", publishing, peer)
                except BrokerException as err:
                    self.producers.unregister_topic(topic, queue)
                    with contextlib.suppress(ValueError):
                        checks.remove((topic, queue))
                    outbox.put_nowait(sv.TelemetryCommand(status=_failure_status(err, "Telemetry")))
                    return
            message = to_v2_message(parse_record(check.record), topic=check.topic)
            outbox.put_nowait(sv.TelemetryCommand(
                recover_orphaned_transaction_command=sv.RecoverOrphanedTransactionCommand(
                    message=message, transaction_id=check.msg_id,
                )
            ))
