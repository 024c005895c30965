"""gRPC channels and calls to one broker, with errors mapped to PymqError.

Channels are cached per (process, endpoint): Spark reuses Python workers
across tasks, so a task's reader finds its channel already connected, and a
forked process never uses its parent's channel.
"""

from __future__ import annotations

import os
import threading
from typing import Any, TypeVar

import grpc
from pymq_proto.v1 import pymq_pb2_grpc

from ..errors import (
    BrokerUnavailableError,
    PymqError,
    RequestTimeoutError,
    error_for_code,
)

__all__ = ["CHANNEL_OPTIONS", "BrokerClient", "check_endpoint", "map_rpc_error"]

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

R = TypeVar("R")


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


class BrokerClient:
    """Calls to one broker. ``timeout`` is in seconds."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.timeout = timeout
        self.stub = pymq_pb2_grpc.BrokerStub(_channel(self.endpoint))

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["endpoint"], state["timeout"])  # type: ignore[misc]

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """Call ``method`` (an RPC name such as ``"PullMessage"``) and return its response."""
        try:
            return getattr(self.stub, method)(
                request, timeout=self.timeout if timeout is None else timeout
            )
        except grpc.RpcError as err:
            raise map_rpc_error(err, self.endpoint, method) from None

    def call_future(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """Start ``method`` without waiting: a grpc future (errors via map_rpc_error)."""
        return getattr(self.stub, method).future(
            request, timeout=self.timeout if timeout is None else timeout
        )
