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

Channels are cached per (process, endpoint, TLS settings): Spark reuses Python
workers across tasks, so a task's reader finds its channel already connected,
and a forked process never uses its parent's channel. A child forked from a process
whose gRPC was in use cannot use gRPC at all while gRPC's fork support is off (pymq's
default, see :mod:`pymq_proto`): its calls would hang, so it gets an error saying so.

Security: with ``access_key`` / ``secret_key`` every call is signed as RocketMQ 5's
gRPC clients sign theirs (:func:`sign_metadata`: ``x-mq-date-time`` and an
``authorization`` of ``MQv2-HMAC-SHA1``), so a broker with authentication on knows
the user. With ``tls`` (a :class:`~pyspark_pymq.tls.TlsConfig`) the channel is TLS,
the broker's certificate verified; a plaintext client that meets a TLS broker raises
:class:`~pyspark_pymq.errors.TlsRequiredError` saying to enable TLS.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar, overload

import grpc
from google.protobuf.message import Message as ProtoMessage
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pymq_proto.wire import SerializedRequest, serialize_request

from ..backend.base import check_endpoint
from ..errors import (
    UNREACHABLE_HINT,
    BrokerUnavailableError,
    PymqError,
    RequestTimeoutError,
    TlsRequiredError,
    error_for_code,
)
from ..tls import TlsConfig
from .credentials import check_credentials

__all__ = [
    "CHANNEL_OPTIONS",
    "BrokerClient",
    "ResponseStream",
    "SharedConnections",
    "StreamRpc",
    "UnaryRpc",
    "map_rpc_error",
    "sign_metadata",
]

MAX_GRPC_MESSAGE = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# A connection that went dead without a word (a NAT or firewall that forgot it, a host gone) is
# found by an unanswered HTTP/2 ping and made again: without one, every call on it timed out
# until the process ended (the channel is shared by the process's clients). The broker accepts
# a ping this often (its grpc.http2.min_ping_interval_without_data_ms is lower).
KEEPALIVE_TIME_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000


def channel_options() -> list[tuple[str, int]]:
    """:data:`CHANNEL_OPTIONS` and the keep-alive pings."""
    return [*CHANNEL_OPTIONS,
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            # a keep-alive ping joins any ping in flight (HTTP/2 flow control's), whose answer
            # gRPC waits for this long (60 s by default)
            ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0)]
CODE_METADATA_KEY = "pymq-response-code"

_channels: dict[tuple[int, str, TlsConfig | None], grpc.Channel] = {}
_channels_lock = threading.Lock()

Req = TypeVar("Req")  # a message, or (the sends) a pymq_proto.wire.SerializedRequest
Resp = TypeVar("Resp", bound=ProtoMessage)
T = TypeVar("T")


class SharedConnections:
    """A client whose connections are the process's, shared with its other clients: ``close()``
    has nothing to release, and is there for ``with`` blocks (as :class:`~.producer.Producer`)."""

    def close(self) -> None:
        """Nothing to release (the process's channels stay for its other clients)."""

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_not_forked() -> None:
    """gRPC's core keeps threads and descriptors a forked child does not have: without fork
    support, a child of a process that used gRPC hangs in its first call (probe helper-92)."""
    user = next(iter(_channels), (os.getpid(),))[0]
    if user != os.getpid() and os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() not in ("1", "true"):
        raise PymqError(
            f"this process was forked from process {user}, which used gRPC, and gRPC cannot be used in "
            "a forked child with its fork support off (GRPC_ENABLE_FORK_SUPPORT=false, pymq's default): "
            "its calls would hang. Start the child with multiprocessing's 'spawn' or 'forkserver' start "
            "method, or set GRPC_ENABLE_FORK_SUPPORT=true in the environment before pymq is imported"
        )


def _channel(endpoint: str, tls: TlsConfig | None = None) -> grpc.Channel:
    key = (os.getpid(), endpoint, tls)
    ch = _channels.get(key)
    if ch is None:
        with _channels_lock:
            ch = _channels.get(key)
            if ch is None:
                _check_not_forked()
                if tls is None:
                    ch = grpc.insecure_channel(endpoint, options=channel_options())
                else:
                    try:
                        root, key_pem, chain = tls.pem()
                    except OSError as err:
                        raise ValueError(f"TLS file cannot be read: {err}") from None
                    creds = grpc.ssl_channel_credentials(root, key_pem, chain)
                    ch = grpc.secure_channel(endpoint, creds, options=channel_options())
                _channels[key] = ch
    return ch


DATE_TIME_KEY = "x-mq-date-time"
AUTHORIZATION_KEY = "authorization"


def sign_metadata(access_key: str, secret_key: str, now: float | None = None) -> tuple[tuple[str, str], ...]:
    """RocketMQ 5's gRPC signature (rocketmq-clients' ``Signature.sign``): the call's metadata.

    ``x-mq-date-time`` is UTC ``yyyyMMdd'T'HHmmss'Z'``; ``authorization`` is
    ``MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>``,
    the hex of HMAC-SHA1 keyed by the secret key over the date-time.
    """
    date_time = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    signature = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()
    return (
        (DATE_TIME_KEY, date_time),
        (AUTHORIZATION_KEY,
         f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders={DATE_TIME_KEY}, Signature={signature}"),
    )


class _Signer:
    """The signed metadata of a call, computed once per second (the date-time's resolution)."""

    __slots__ = ("_access_key", "_second", "_secret_key", "_value")

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._access_key = access_key
        self._secret_key = secret_key
        self._second = -1
        self._value: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"_Signer(access_key={self._access_key!r})"

    def __call__(self) -> tuple[tuple[str, str], ...]:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._value = sign_metadata(self._access_key, self._secret_key, now)
            self._second = second
        return self._value


_tls_probes: dict[str, tuple[float, bool]] = {}
_remoting_probes: dict[str, tuple[float, bool]] = {}


def _speaks_remoting(endpoint: str) -> bool:
    """Whether the server at ``endpoint`` answers RocketMQ's remoting protocol in plaintext (an Apache
    RocketMQ name server or broker given as a pymq endpoint), asked at most every 5 s. Asked before
    the TLS probe: RocketMQ's servers complete a TLS handshake too (``tls.server.mode=permissive``
    with a self-signed test certificate), and "enable TLS" would send the user the wrong way."""
    from ..rocketmq.protocol import RemotingCommand, RequestCode

    hit = _remoting_probes.get(endpoint)
    if hit is not None and time.monotonic() - hit[0] < 5.0:
        return hit[1]
    host, _, port = endpoint.rpartition(":")
    result = False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0) as sock:
            sock.sendall(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO).encode())
            head = b""
            while len(head) < 4:
                chunk = sock.recv(4 - len(head))
                if not chunk:
                    break
                head += chunk
            length = int.from_bytes(head, "big") if len(head) == 4 else 0
            if 8 <= length + 4 <= 1 << 20:
                frame = bytearray(head)
                while len(frame) < length + 4:
                    chunk = sock.recv(length + 4 - len(frame))
                    if not chunk:
                        break
                    frame += chunk
                result = RemotingCommand.decode(frame).is_response
    except (OSError, ValueError, KeyError, TypeError):  # not remoting (or not there): a probe never raises
        result = False
    _remoting_probes[endpoint] = (time.monotonic(), result)
    return result


def _speaks_tls(endpoint: str) -> bool:
    """Whether the server at ``endpoint`` answers a TLS handshake (asked at most every 5 s)."""
    hit = _tls_probes.get(endpoint)
    if hit is not None and time.monotonic() - hit[0] < 5.0:
        return hit[1]
    host, _, port = endpoint.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    result = False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0) as raw, \
                ctx.wrap_socket(raw, server_hostname=None) as tls_sock:
            tls_sock.do_handshake()
            result = True
    except ssl.SSLError as err:  # an alert (e.g. no client certificate) is still TLS
        result = "ALERT" in str(err.reason or "").upper()
    except OSError:
        result = False
    _tls_probes[endpoint] = (time.monotonic(), result)
    return result


def _back_on_its_address(err: grpc.RpcError, endpoint: str) -> bool:
    """Whether ``err`` is a call the channel refused without sending it (its last connect attempt was
    refused) while a TCP connection to ``endpoint`` succeeds now."""
    if not hasattr(err, "code") or err.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    if "connection refused" not in (err.details() or "").lower():
        return False
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def map_rpc_error(
    err: grpc.RpcError, endpoint: str, method: str, tls: TlsConfig | None = None
) -> PymqError:
    """The PymqError for a failed call: the broker's code when it sent one.

    An unreachable broker that speaks TLS to a plaintext client is a
    :class:`TlsRequiredError`, as is a TLS handshake that fails (``tls`` given).
    """
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
        if _speaks_remoting(endpoint):
            return BrokerUnavailableError(
                f"{endpoint} speaks RocketMQ's remoting protocol (an Apache RocketMQ name server or "
                f"broker), not the pymq broker's gRPC ({method}): give it as namesrv_addr= (Spark option "
                "namesrvAddr, pymq-admin -n / PYMQ_NAMESRV_ADDR), not as the endpoint"
            )
        if tls is None and _speaks_tls(endpoint):
            return TlsRequiredError(
                f"broker at {endpoint} serves TLS and this client connects in plaintext ({method}): "
                "enable TLS on the client (tls_ca_file='ca.pem' for the client classes, Spark options "
                "tls=true and tlsCaFile)"
            )
        lowered = (details or "").lower()
        if (tls is not None and tls.cert_file is None and "socket closed" in lowered
                and _speaks_tls(endpoint)):
            return TlsRequiredError(
                f"broker at {endpoint} closed the TLS connection ({method}): it may require a client "
                "certificate (mutual TLS, --tls-client-ca-file): give tls_cert_file and tls_key_file "
                "(Spark options tlsCertFile and tlsKeyFile)"
            )
        if tls is not None and any(w in lowered for w in ("ssl", "handshake", "certificate", "tls")):
            return TlsRequiredError(
                f"TLS to broker at {endpoint} failed ({method}): {details}. Check that the broker serves "
                "TLS (--tls-cert-file), that tls_ca_file / tlsCaFile holds the CA that signed its "
                "certificate, and for mutual TLS the client certificate and key"
            )
        return BrokerUnavailableError(
            f"broker at {endpoint} is unavailable ({method}): {details}. {UNREACHABLE_HINT}."
        )
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeoutError(f"broker at {endpoint} did not answer {method} in time")
    if status == grpc.StatusCode.UNIMPLEMENTED:
        return PymqError(
            f"{endpoint} is a gRPC server without pymq's {method} ({details}): not a pymq broker, or one "
            "older than this client. An Apache RocketMQ 5 proxy also serves gRPC (on 8081 too): for a "
            "RocketMQ cluster give its name servers as namesrv_addr= (Spark option namesrvAddr, "
            "pymq-admin -n), not as the endpoint",
            code="REQUEST_CODE_NOT_SUPPORTED",
        )
    return PymqError(f"{method} to {endpoint} failed: {status}: {details}")


class UnaryRpc(Generic[Req, Resp]):
    """One request-response RPC of one broker: call it, or start it with :meth:`future`.

    ``timeout`` (seconds) defaults to the client's. A failure raises (or, for a
    future, completes with) the PymqError of :func:`map_rpc_error`. A call the
    channel refused unsent while the broker is back on its address (a restart: the
    channel waits out its reconnect backoff) waits for the connection instead, also
    one started with :meth:`future`.
    """

    __slots__ = ("_call", "_sign", "endpoint", "name", "timeout", "tls")

    def __init__(
        self, call: grpc.UnaryUnaryMultiCallable[Req, Resp], name: str, endpoint: str, timeout: float,
        sign: Callable[[], tuple[tuple[str, str], ...]] | None = None, tls: TlsConfig | None = None,
    ) -> None:
        self._call = call
        self.name = name  # the RPC's name in pymq.proto, for error messages
        self.endpoint = endpoint
        self.timeout = timeout
        self._sign = sign  # the call's signed metadata (None: unsigned)
        self.tls = tls

    def __call__(self, request: Req, timeout: float | None = None) -> Resp:
        limit = self.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            return self._call(request, timeout=limit, metadata=None if self._sign is None else self._sign())
        except grpc.RpcError as err:
            if not _back_on_its_address(err, self.endpoint):
                raise map_rpc_error(err, self.endpoint, self.name, self.tls) from None
        # The request never left (the channel's last connect was refused) and the broker accepts
        # connections now: it came back on its address while the shared channel waits out its
        # reconnect backoff (up to 1 s). A dead broker still fails at once: it refuses the probe.
        # The call keeps what is left of its deadline: once connected it is sent, and a broker that
        # takes its time (a SYNC_FLUSH, a long poll) must not be read as one that never got it.
        left = max(0.001, limit - (time.monotonic() - started))
        try:
            return self._call(request, timeout=left, wait_for_ready=True,
                              metadata=None if self._sign is None else self._sign())
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, self.name, self.tls) from None

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
        endpoint, name, tls = self.endpoint, self.name, self.tls
        limit = self.timeout if timeout is None else timeout
        started = time.monotonic()

        def done(call: grpc.Future[Resp], waited: bool = False) -> None:
            try:
                resp = call.result()
            except grpc.RpcError as err:
                if not waited and _back_on_its_address(err, endpoint):
                    # as __call__: a broker back on its address while the channel waits out its
                    # reconnect backoff gets the call once connected, within what is left of it
                    left = max(0.001, limit - (time.monotonic() - started))
                    try:
                        again = self._call.future(request, timeout=left, wait_for_ready=True,
                                                  metadata=None if self._sign is None else self._sign())
                    except Exception as retry_err:  # the future must end, whatever happens
                        out.set_exception(PymqError(f"{name} to {endpoint} failed: {retry_err!r}"))
                        return
                    again.add_done_callback(lambda c: done(c, waited=True))
                    return
                out.set_exception(map_rpc_error(err, endpoint, name, tls))
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

        call = self._call.future(request, timeout=limit,
                                 metadata=None if self._sign is None else self._sign())
        call.add_done_callback(done)
        return out


class ResponseStream(Generic[Resp]):
    """The answers of a server-streaming call; iterating raises PymqError if the stream fails."""

    __slots__ = ("_call", "endpoint", "name", "tls")

    def __init__(self, call: grpc.CallIterator[Resp], name: str, endpoint: str,
                 tls: TlsConfig | None = None) -> None:
        self._call = call
        self.name = name
        self.endpoint = endpoint
        self.tls = tls

    def __iter__(self) -> Iterator[Resp]:
        try:
            yield from self._call
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, self.name, self.tls) from None

    def cancel(self) -> None:
        """End the stream: iteration stops with a (not retriable) PymqError."""
        self._call.cancel()  # type: ignore[no-untyped-call]


class StreamRpc(Generic[Req, Resp]):
    """One server-streaming RPC of one broker. Without ``timeout`` the stream has no deadline."""

    __slots__ = ("_call", "_sign", "endpoint", "name", "tls")

    def __init__(self, call: grpc.UnaryStreamMultiCallable[Req, Resp], name: str, endpoint: str,
                 sign: Callable[[], tuple[tuple[str, str], ...]] | None = None,
                 tls: TlsConfig | None = None) -> None:
        self._call = call
        self.name = name
        self.endpoint = endpoint
        self._sign = sign
        self.tls = tls

    def __call__(self, request: Req, timeout: float | None = None) -> ResponseStream[Resp]:
        try:
            call = self._call(request, timeout=timeout, metadata=None if self._sign is None else self._sign())
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, self.name, self.tls) from None
        return ResponseStream(call, self.name, self.endpoint, self.tls)


class BrokerClient:
    """The RPCs of one broker (``endpoint``), each a typed attribute. ``timeout`` is in seconds.

    The attributes are :class:`UnaryRpc` (or :class:`StreamRpc`) objects built
    from the generated stub, so mypy knows each request and response type, and
    a call costs one attribute look-up more than the stub's own.

    ``access_key`` / ``secret_key`` sign every call (:func:`sign_metadata`);
    ``tls`` makes the channel TLS. The secret key shows in no repr or message.
    """

    def __init__(self, endpoint: str, timeout: float = 10.0, *, access_key: str | None = None,
                 secret_key: str | None = None, tls: TlsConfig | None = None) -> None:
        self.endpoint = check_endpoint(endpoint)
        self._timeout = timeout
        self._credentials = check_credentials(access_key, secret_key)
        self.tls = tls
        sign = None if self._credentials is None else _Signer(*self._credentials)
        channel = _channel(self.endpoint, tls)
        stub = pymq_pb2_grpc.BrokerStub(channel)
        ep = self.endpoint

        def pre_serialized(method: str) -> grpc.UnaryUnaryMultiCallable[
            pymq_pb2.SendMessageRequest | SerializedRequest, pymq_pb2.SendMessageResponse
        ]:
            """The sends also take a SerializedRequest (a batch not copied through protobuf)."""
            return channel.unary_unary(
                f"/pymq_proto.v1.Broker/{method}", request_serializer=serialize_request,
                response_deserializer=pymq_pb2.SendMessageResponse.FromString,
            )

        def unary(call: grpc.UnaryUnaryMultiCallable[Req, Resp], name: str) -> UnaryRpc[Req, Resp]:
            return UnaryRpc(call, name, ep, timeout, sign, tls)

        # one line per RPC of service Broker, in pymq.proto's order
        self.send_message = unary(pre_serialized("SendMessage"), "SendMessage")
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
        self.reset_offset = unary(stub.ResetOffset, "ResetOffset")
        self.update_subscription_group = unary(stub.UpdateSubscriptionGroup, "UpdateSubscriptionGroup")
        self.get_subscription_group = unary(stub.GetSubscriptionGroup, "GetSubscriptionGroup")
        self.view_message = unary(stub.ViewMessage, "ViewMessage")
        self.query_message = unary(stub.QueryMessage, "QueryMessage")
        self.broker_runtime_info = unary(stub.BrokerRuntimeInfo, "BrokerRuntimeInfo")
        self.heart_beat = unary(stub.HeartBeat, "HeartBeat")
        self.check_client_config = unary(stub.CheckClientConfig, "CheckClientConfig")
        self.end_transaction = unary(stub.EndTransaction, "EndTransaction")
        self.send_half_message_batch = unary(pre_serialized("SendHalfMessageBatch"), "SendHalfMessageBatch")
        self.end_transaction_batch = unary(stub.EndTransactionBatch, "EndTransactionBatch")
        self.transaction_stream = StreamRpc(stub.TransactionStream, "TransactionStream", ep, sign, tls)
        self.create_user = unary(stub.CreateUser, "CreateUser")
        self.update_user = unary(stub.UpdateUser, "UpdateUser")
        self.delete_user = unary(stub.DeleteUser, "DeleteUser")
        self.list_users = unary(stub.ListUsers, "ListUsers")
        self.create_acl = unary(stub.CreateAcl, "CreateAcl")
        self.delete_acl = unary(stub.DeleteAcl, "DeleteAcl")
        self.list_acls = unary(stub.ListAcls, "ListAcls")

    @property
    def timeout(self) -> float:
        """The deadline of a call that names none, in seconds (fixed: every RPC holds it)."""
        return self._timeout

    def sibling(self, endpoint: str) -> BrokerClient:
        """A client of another broker (of the same cluster) with this one's timeout, credentials and TLS."""
        ak, sk = self._credentials or (None, None)
        return BrokerClient(endpoint, self._timeout, access_key=ak, secret_key=sk, tls=self.tls)

    def __repr__(self) -> str:
        user = "" if self._credentials is None else f", access_key={self._credentials[0]!r}"
        return f"BrokerClient({self.endpoint!r}{user}{', tls' if self.tls is not None else ''})"

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "timeout": self.timeout, "credentials": self._credentials,
                "tls": self.tls}

    def __setstate__(self, state: dict[str, Any]) -> None:
        ak, sk = state.get("credentials") or (None, None)
        self.__init__(state["endpoint"], state["timeout"], access_key=ak, secret_key=sk,  # type: ignore[misc]
                      tls=state.get("tls"))
