"""BrokerGrpcService: the gRPC servicer. It only routes requests to processors.

A processor's BrokerException becomes a gRPC error whose trailing metadata
carries the RocketMQ ResponseCode (``pymq-response-code``); any other failure
becomes SYSTEM_ERROR with its message. Either way the broker keeps serving.

With authentication on, every request first passes ``AuthService.check``
(``pymq_broker.auth``): this layer only hands it the RPC's name, the request,
the metadata and the peer.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc

from ..auth.auth_service import AuthService
from ..common.broker_exception import BrokerException, bounded_remark
from .pull_answer_budget import PullAnswerBudget

log = logging.getLogger(__name__)

CODE_METADATA_KEY = "pymq-response-code"
_GRPC_STATUS: dict[int, grpc.StatusCode] = {
    pymq_pb2.ILLEGAL_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    pymq_pb2.MESSAGE_ILLEGAL: grpc.StatusCode.INVALID_ARGUMENT,
    pymq_pb2.SUBSCRIPTION_PARSE_FAILED: grpc.StatusCode.INVALID_ARGUMENT,
    pymq_pb2.TOPIC_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    pymq_pb2.QUERY_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    pymq_pb2.SUBSCRIPTION_GROUP_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    pymq_pb2.TOPIC_EXIST_ALREADY: grpc.StatusCode.ALREADY_EXISTS,
    pymq_pb2.NO_PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
    pymq_pb2.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
    pymq_pb2.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    pymq_pb2.SYSTEM_BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    pymq_pb2.SERVICE_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
}

Handler = Callable[[Any], Any]


def _rpc(handler_name: str, processor_attr: str, rpc: str | None = None) -> Callable[..., Awaitable[Any]]:
    rpc_name = rpc or "".join(w.capitalize() for w in handler_name.split("_"))

    async def method(
        self: BrokerGrpcService, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        handler = getattr(getattr(self, processor_attr), handler_name)
        try:
            if self.auth is not None:
                self.auth.check(rpc_name, request, context.invocation_metadata(), context.peer())
            result = handler(request)
            if hasattr(result, "__await__"):
                result = await result
            return result
        except BrokerException as err:
            context.set_trailing_metadata(((CODE_METADATA_KEY, err.code_name),))
            await context.abort(_GRPC_STATUS.get(err.code, grpc.StatusCode.INTERNAL), err.remark)
        except Exception as err:  # a bug must not take the broker down
            context.set_trailing_metadata(((CODE_METADATA_KEY, "SYSTEM_ERROR"),))
            if isinstance(err, OSError) and err.filename:  # a config file it could not save
                log.error("%s failed: %s", handler_name, err)
                await context.abort(grpc.StatusCode.INTERNAL, bounded_remark(
                    f"{handler_name}: the broker could not save {err.filename}: {err.strerror or err}. "
                    "The change may be in effect but is not on disk: free space on the broker's disk "
                    "and ask again"))
            log.exception("%s failed", handler_name)
            await context.abort(grpc.StatusCode.INTERNAL, bounded_remark(f"{handler_name} failed: {err!r}"))

    method.__name__ = handler_name
    return method


class BrokerGrpcService(pymq_pb2_grpc.BrokerServicer):
    """Maps each RPC of ``pymq_proto.v1.Broker`` to its processor method."""

    def __init__(self, send: Any, pull: Any, send_back: Any, consumer_manage: Any, admin: Any,
                 end_transaction: Any, auth_admin: Any = None, auth: AuthService | None = None,
                 pull_budget: PullAnswerBudget | None = None) -> None:
        self.pull_budget = pull_budget or PullAnswerBudget()
        self.end_transaction = end_transaction
        self.auth_admin = auth_admin
        self.auth = auth  # None: authentication is off, every request is served
        self.send = send
        self.pull = pull
        self.send_back = send_back
        self.consumer_manage = consumer_manage
        self.admin = admin

    SendMessage = _rpc("send_message", "send")
    _pull_message = _rpc("pull_message", "pull")

    async def PullMessage(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """PULL_MESSAGE, within the connection's budget of answers it has not read (PullAnswerBudget)."""
        peer, budget = context.peer(), self.pull_budget
        try:
            budget.check(peer)
        except BrokerException as err:
            context.set_trailing_metadata(((CODE_METADATA_KEY, err.code_name),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, err.remark)
        response = await self._pull_message(request, context)
        size = len(response.records)
        if size:
            budget.hold(peer, size)
            # (grpc-stubs types the callback as a class of its own; any callable is taken)
            context.add_done_callback(cast(Any, lambda _ctx: budget.release(peer, size)))
        return response
    ConsumerSendMsgBack = _rpc("consumer_send_msg_back", "send_back")
    ConsumerSendMsgBackBatch = _rpc("consumer_send_msg_back_batch", "send_back")
    QueryOffset = _rpc("query_offset", "consumer_manage")
    GetOffset = _rpc("get_offset", "consumer_manage")
    UpdateOffset = _rpc("update_offset", "consumer_manage")
    HeartBeat = _rpc("heart_beat", "consumer_manage")
    CheckClientConfig = _rpc("check_client_config", "consumer_manage")
    QueryRoute = _rpc("query_route", "admin")
    CreateTopic = _rpc("create_topic", "admin")
    DeleteTopic = _rpc("delete_topic", "admin")
    ListTopics = _rpc("list_topics", "admin")
    TopicStats = _rpc("topic_stats", "admin")
    ConsumerProgress = _rpc("consumer_progress", "admin")
    ListGroups = _rpc("list_groups", "admin")
    ResetOffset = _rpc("reset_offset", "admin")
    UpdateSubscriptionGroup = _rpc("update_subscription_group", "admin")
    GetSubscriptionGroup = _rpc("get_subscription_group", "admin")
    ViewMessage = _rpc("view_message", "admin")
    QueryMessage = _rpc("query_message", "admin")
    BrokerRuntimeInfo = _rpc("runtime_info", "admin", "BrokerRuntimeInfo")
    EndTransaction = _rpc("end_transaction", "end_transaction")
    EndTransactionBatch = _rpc("end_transaction_batch", "end_transaction")
    SendHalfMessageBatch = _rpc("send_half_message_batch", "send")
    CreateUser = _rpc("create_user", "auth_admin")
    UpdateUser = _rpc("update_user", "auth_admin")
    DeleteUser = _rpc("delete_user", "auth_admin")
    ListUsers = _rpc("list_users", "auth_admin")
    CreateAcl = _rpc("create_acl", "auth_admin")
    DeleteAcl = _rpc("delete_acl", "auth_admin")
    ListAcls = _rpc("list_acls", "auth_admin")

    async def TransactionStream(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            auth = self.auth
            user = None if auth is None else auth.check(
                "TransactionStream", request, context.invocation_metadata(), context.peer())
            async for check in self.end_transaction.transaction_stream(request):
                if auth is not None and user is not None:
                    # rights revoked while the stream is open end it; the check-back comes again later
                    auth.recheck(user, "TransactionStream", request, context.peer())
                yield check
        except BrokerException as err:
            context.set_trailing_metadata(((CODE_METADATA_KEY, err.code_name),))
            await context.abort(_GRPC_STATUS.get(err.code, grpc.StatusCode.INTERNAL), err.remark)
