"""The one error type the broker's layers raise: a RocketMQ ResponseCode and a remark."""

from __future__ import annotations

from pymq_proto.v1 import pymq_pb2


class BrokerException(Exception):
    """``code`` is a ResponseCode value; ``remark`` names the bad value and the limit."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark

    @property
    def code_name(self) -> str:
        return str(pymq_pb2.ResponseCode.Name(pymq_pb2.ResponseCode.ValueType(self.code)))

    def __str__(self) -> str:
        return f"[{self.code_name}] {self.remark}"
