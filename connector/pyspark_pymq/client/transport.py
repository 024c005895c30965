"""The transport to one pymq broker: its gRPC RPCs as typed methods, failures as PymqError.

This is the only connector module that imports ``grpc``. Each RPC of the
``Broker`` service (``proto/pymq_proto/v1/pymq.proto``) is an attribute of
:class:`BrokerClient`, named in snake case and typed by the generated stub::

    client = BrokerClient("127.0.0.1:8081")
    resp = client.send_message(req)           # SendMessageRequest -> SendMessageResponse
    fut = client.send_message.future(req, then=convert)   # Future of convert(response)
    for check in client.transaction_stream(req): ...      # a server stream

A failed call raises the :class:`~pyspark_pymq.errors.PymqError` that
:func:`map_rpc_error` picks (the broker's ResponseCode when it sent one, else
the gRPC status: UNAVAILABLE -> BrokerUnavailableError, DEADLINE_EXCEEDED ->
RequestTimeoutError); nothing else maps gRPC errors. ``error.retriable`` then
says whether another try may succeed.

Channels are cached per (process, endpoint): Spark reuses Python workers
across tasks, so a task's reader finds its channel already connected, and a
forked process never uses its parent's channel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, overload

import grpc
from google.protobuf.message import Message as ProtoMessage
from pymq_proto.v1 import pymq_pb2_grpc

from ..errors import (
    BrokerUnavailableError,
    PymqError,
    RequestTimeoutError,
    error_for_code,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "BrokerClient",
    "ResponseStream",
    "StreamRpc",
    "UnaryRpc",
    "check_endpoint",
    "map_rpc_error",
]

MAX_GRPC_MESSAGE = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
CODE_METADATA_KEY = "pymq-response-code"

_channels: dict[tuple[int, str], grpc.Channel] = {}
_channels_lock = threading.Lock()

Req = TypeVar("Req", bound=ProtoMessage)
Resp = TypeVar("Resp", bound=ProtoMessage)
T = TypeVar("T")


def check_endpoint(endpoint: object) -> str:
    """``endpoint`` as ``host:port``, or a ValueError naming the value."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValueError(f"endpoint must be 'host:port', got {endpoint!r}")
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"endpoint {endpoint!r} is not 'host:port' with a port in 1..65535 "
            "(e.g. '127.0.0.1:8081')"
        )
    return endpoint.strip()


def _channel(endpoint: str) -> grpc.Channel:
    key = (os.getpid(), endpoint)
    ch = _channels.get(key)
    if ch is None:
        with _channels_lock:
            ch = _channels.get(key)
            if ch is None:
                ch = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
                _channels[key] = ch
    return ch


def map_rpc_error(err: grpc.RpcError, endpoint: str, method: str) -> PymqError:
    """The PymqError for a failed call: the broker's code when it sent one."""
    code = None
    trailing: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for item in trailing or ():
        key, value = item[0], item[1]
        if key == CODE_METADATA_KEY:
            code = value if isinstance(value, str) else value.decode()
    details = err.details() if hasattr(err, "details") else str(err)
    if code is not None:
        return error_for_code(code, details or "")
    status = err.code() if hasattr(err, "code") else None
    if status == grpc.StatusCode.UNAVAILABLE:
        return BrokerUnavailableError(
            f"broker at {endpoint} is unavailable ({method}): {details}. "
            "Check that pymq-broker runs there and the endpoint option is right."
        )
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeoutError(f"broker at {endpoint} did not answer {method} in time")
    return PymqError(f"{method} to {endpoint} failed: {status}: {details}")


class UnaryRpc(Generic[Req, Resp]):
    """One request-response RPC of one broker: call it, or start it with :meth:`future`.

    ``timeout`` (seconds) defaults to the client's. A failure raises (or, for a
    future, completes with) the PymqError of :func:`map_rpc_error`.
    """

    __slots__ = ("_call", "endpoint", "name", "timeout")

    def __init__(
        self, call: grpc.UnaryUnaryMultiCallable[Req, Resp], name: str, endpoint: str, timeout: float
    ) -> None:
        self._call = call
        self.name = name  # the RPC's name in pymq.proto, for error messages
        self.endpoint = endpoint
        self.timeout = timeout

    def __call__(self, request: Req, timeout: float | None = None) -> Resp:
        try:
            return self._call(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, self.name) from None

    @overload
    def future(self, request: Req, timeout: float | None = None) -> Future[Resp]: ...

    @overload
    def future(
        self, request: Req, timeout: float | None = None, *, then: Callable[[Resp], T]
    ) -> Future[T]: ...

    def future(
        self, request: Req, timeout: float | None = None, *, then: Callable[[Resp], Any] | None = None
    ) -> Future[Any]:
        """Send ``request`` without waiting: a Future of the response, or of ``then(response)``.

        ``then`` runs on gRPC's thread when the answer arrives; if it raises, the
        Future holds its exception. A failed call's Future holds its PymqError.
        """
        out: Future[Any] = Future()
        endpoint, name = self.endpoint, self.name

        def done(call: grpc.Future[Resp]) -> None:
            try:
                resp = call.result()
            except grpc.RpcError as err:
                out.set_exception(map_rpc_error(err, endpoint, name))
                return
            except Exception as err:  # cancelled: nothing a retry would mend
                out.set_exception(PymqError(f"{name} to {endpoint} failed: {err!r}"))
                return
            if then is None:
                out.set_result(resp)
                return
            try:
                value = then(resp)
            except BaseException as err:
                out.set_exception(err)
                return
            out.set_result(value)

        call = self._call.future(request, timeout=self.timeout if timeout is None else timeout)
        call.add_done_callback(done)
        return out


class ResponseStream(Generic[Resp]):
    """The answers of a server-streaming call; iterating raises PymqError if the stream fails."""

    __slots__ = ("_call", "endpoint", "name")

    def __init__(self, call: grpc.CallIterator[Resp], name: str, endpoint: str) -> None:
        self._call = call
        self.name = name
        self.endpoint = endpoint

    def __iter__(self) -> Iterator[Resp]:
        try:
            yield from self._call
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, self.name) from None

    def cancel(self) -> None:
        """End the stream: iteration stops with a (not retriable) PymqError."""
        self._call.cancel()  # type: ignore[no-untyped-call]


class StreamRpc(Generic[Req, Resp]):
    """One server-streaming RPC of one broker. Without ``timeout`` the stream has no deadline."""

    __slots__ = ("_call", "endpoint", "name")

    def __init__(self, call: grpc.UnaryStreamMultiCallable[Req, Resp], name: str, endpoint: str) -> None:
        self._call = call
        self.name = name
        self.endpoint = endpoint

    def __call__(self, request: Req, timeout: float | None = None) -> ResponseStream[Resp]:
        try:
            call = self._call(request, timeout=timeout)
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, self.name) from None
        return ResponseStream(call, self.name, self.endpoint)


class BrokerClient:
    """The RPCs of one broker (``endpoint``), each a typed attribute. ``timeout`` is in seconds.

    The attributes are :class:`UnaryRpc` (or :class:`StreamRpc`) objects built
    from the generated stub, so mypy knows each request and response type, and
    a call costs one attribute look-up more than the stub's own.
    """

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = check_endpoint(endpoint)
        self._timeout = timeout
        stub = pymq_pb2_grpc.BrokerStub(_channel(self.endpoint))
        ep = self.endpoint

        def unary(call: grpc.UnaryUnaryMultiCallable[Req, Resp], name: str) -> UnaryRpc[Req, Resp]:
            return UnaryRpc(call, name, ep, timeout)

        # one line per RPC of service Broker, in pymq.proto's order
        self.send_message = unary(stub.SendMessage, "SendMessage")
        self.pull_message = unary(stub.PullMessage, "PullMessage")
        self.query_route = unary(stub.QueryRoute, "QueryRoute")
        self.query_offset = unary(stub.QueryOffset, "QueryOffset")
        self.get_offset = unary(stub.GetOffset, "GetOffset")
        self.update_offset = unary(stub.UpdateOffset, "UpdateOffset")
        self.consumer_send_msg_back = unary(stub.ConsumerSendMsgBack, "ConsumerSendMsgBack")
        self.consumer_send_msg_back_batch = unary(stub.ConsumerSendMsgBackBatch, "ConsumerSendMsgBackBatch")
        self.create_topic = unary(stub.CreateTopic, "CreateTopic")
        self.delete_topic = unary(stub.DeleteTopic, "DeleteTopic")
        self.list_topics = unary(stub.ListTopics, "ListTopics")
        self.topic_stats = unary(stub.TopicStats, "TopicStats")
        self.consumer_progress = unary(stub.ConsumerProgress, "ConsumerProgress")
        self.list_groups = unary(stub.ListGroups, "ListGroups")
        self.update_subscription_group = unary(stub.UpdateSubscriptionGroup, "UpdateSubscriptionGroup")
        self.get_subscription_group = unary(stub.GetSubscriptionGroup, "GetSubscriptionGroup")
        self.view_message = unary(stub.ViewMessage, "ViewMessage")
        self.query_message = unary(stub.QueryMessage, "QueryMessage")
        self.broker_runtime_info = unary(stub.BrokerRuntimeInfo, "BrokerRuntimeInfo")
        self.heart_beat = unary(stub.HeartBeat, "HeartBeat")
        self.end_transaction = unary(stub.EndTransaction, "EndTransaction")
        self.send_half_message_batch = unary(stub.SendHalfMessageBatch, "SendHalfMessageBatch")
        self.end_transaction_batch = unary(stub.EndTransactionBatch, "EndTransactionBatch")
        self.transaction_stream = StreamRpc(stub.TransactionStream, "TransactionStream", ep)

    @property
    def timeout(self) -> float:
        """The deadline of a call that names none, in seconds (fixed: every RPC holds it)."""
        return self._timeout

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["endpoint"], state["timeout"])  # type: ignore[misc]
