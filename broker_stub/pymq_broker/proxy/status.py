"""Status codes of apache.rocketmq.v2 (definition.proto's ``Code``) and the proxy's one error type."""

from __future__ import annotations

from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException

Code = v2.Code

# The broker's ResponseCodes as RocketMQ's proxy answers them (ProxyException / ResponseCode mapping)
_FROM_RESPONSE_CODE: dict[int, v2.Code.ValueType] = {
    pymq_pb2.SUCCESS: v2.OK,
    pymq_pb2.TOPIC_NOT_EXIST: v2.TOPIC_NOT_FOUND,
    pymq_pb2.SUBSCRIPTION_GROUP_NOT_EXIST: v2.CONSUMER_GROUP_NOT_FOUND,
    pymq_pb2.SUBSCRIPTION_PARSE_FAILED: v2.ILLEGAL_FILTER_EXPRESSION,
    pymq_pb2.MESSAGE_ILLEGAL: v2.BAD_REQUEST,
    pymq_pb2.ILLEGAL_ARGUMENT: v2.BAD_REQUEST,
    pymq_pb2.NO_PERMISSION: v2.FORBIDDEN,
    pymq_pb2.SYSTEM_BUSY: v2.TOO_MANY_REQUESTS,
    pymq_pb2.SERVICE_NOT_AVAILABLE: v2.INTERNAL_SERVER_ERROR,
    pymq_pb2.FLUSH_DISK_TIMEOUT: v2.MASTER_PERSISTENCE_TIMEOUT,
    pymq_pb2.SYSTEM_ERROR: v2.INTERNAL_SERVER_ERROR,
    pymq_pb2.REQUEST_CODE_NOT_SUPPORTED: v2.NOT_IMPLEMENTED,
}


class ProxyException(Exception):
    """A v2 ``Code`` and a message naming the bad value: the ``Status`` of the answer."""

    def __init__(self, code: v2.Code.ValueType, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def of(cls, err: BrokerException) -> ProxyException:
        """A processor's BrokerException as the proxy answers it (unknown codes: INTERNAL_SERVER_ERROR)."""
        code = _FROM_RESPONSE_CODE.get(err.code)
        if code is None:
            name = err.code_name
            known = name in v2.Code.DESCRIPTOR.values_by_name  # UNAUTHORIZED, FORBIDDEN: same names
            code = v2.Code.Value(name) if known else v2.INTERNAL_SERVER_ERROR
        return cls(code, err.remark)

    def __str__(self) -> str:
        return f"[{v2.Code.Name(self.code)}] {self.message}"


def status(code: v2.Code.ValueType = v2.OK, message: str = "OK") -> v2.Status:
    """A ``Status``; ``message`` says what was wrong and with which value."""
    return v2.Status(code=code, message=message)
