"""Subscription expressions: RocketMQ's tag expressions ("*", "TagA || TagB")."""

from __future__ import annotations

from pymq_proto.record import tag_hash
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException

SUB_ALL = "*"


def parse_tag_expression(expression: str, expression_type: str = "TAG") -> frozenset[int] | None:
    """The tag hash codes a subscription accepts, or None for every message."""
    if expression_type not in ("", "TAG"):
        raise BrokerException(
            pymq_pb2.SUBSCRIPTION_PARSE_FAILED,
            f"expression type {expression_type!r} is not supported; use TAG "
            "(SQL92 property filters need enablePropertyFilter and are not available yet)",
        )
    expr = (expression or SUB_ALL).strip()
    if expr == SUB_ALL:
        return None
    tags = [t.strip() for t in expr.split("||")]
    if any(not t for t in tags):
        raise BrokerException(
            pymq_pb2.SUBSCRIPTION_PARSE_FAILED,
            f"tag expression {expression!r} has an empty tag; write '*' or 'TagA || TagB'",
        )
    return frozenset(tag_hash(t.encode()) for t in tags)
