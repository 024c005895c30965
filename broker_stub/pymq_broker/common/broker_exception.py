"""The one error type the broker's layers raise: a RocketMQ ResponseCode and a remark."""

from __future__ import annotations

from pymq_proto.v1 import pymq_pb2

MAX_REMARK_BYTES = 1024
"""A remark travels in gRPC's trailing metadata (``grpc-message``), whose hard limit is 16 KiB
(8 KiB soft), percent-encoded: an echo of a 64 KiB group name would break the answer itself."""


def bounded_remark(remark: str) -> str:
    """``remark`` cut to :data:`MAX_REMARK_BYTES` UTF-8 bytes, saying how much was cut."""
    raw = remark.encode("utf-8", "replace")
    if len(raw) <= MAX_REMARK_BYTES:
        return remark
    head = raw[: MAX_REMARK_BYTES - 48].decode("utf-8", "ignore")
    return f"{head}... ({len(raw) - len(head.encode())} more bytes cut)"


class BrokerException(Exception):
    """``code`` is a ResponseCode value; ``remark`` names the bad value and the limit
    (at most :data:`MAX_REMARK_BYTES`: a value echoed back is cut)."""

    def __init__(self, code: int, remark: str) -> None:
        remark = bounded_remark(remark)
        super().__init__(remark)
        self.code = code
        self.remark = remark

    @property
    def code_name(self) -> str:
        return str(pymq_pb2.ResponseCode.Name(pymq_pb2.ResponseCode.ValueType(self.code)))

    def __str__(self) -> str:
        return f"[{self.code_name}] {self.remark}"
