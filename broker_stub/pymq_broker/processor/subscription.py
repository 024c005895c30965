"""Subscription expressions: RocketMQ's tag expressions ("*", "TagA || TagB") and SQL92."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pymq_proto.record import decode_properties, tag_hash
from pymq_proto.subscription import check_tags
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..filter.sql92 import compile_sql92


@dataclass(frozen=True)
class SubscriptionData:
    """A parsed subscription: tag hash codes and/or a property filter (None: accept all)."""

    tag_hashes: frozenset[int] | None
    property_filter: Callable[[bytes], bool] | None


def parse_subscription(
    expression: str, expression_type: str, *, enable_property_filter: bool
) -> SubscriptionData:
    """A TAG expression (``*``, ``A || B``) or, with enablePropertyFilter, a SQL92 one."""
    kind = (expression_type or "TAG").upper()
    if kind == "TAG":
        return SubscriptionData(parse_tag_expression(expression), None)
    if kind != "SQL92":
        raise BrokerException(
            pymq_pb2.SUBSCRIPTION_PARSE_FAILED,
            f"expression type {expression_type!r} is not supported; use TAG or SQL92",
        )
    if not enable_property_filter:
        raise BrokerException(
            pymq_pb2.NO_PERMISSION,
            "SQL92 filters are off on this broker: start it with --enable-property-filter "
            "(RocketMQ's enablePropertyFilter=true)",
        )
    try:
        compiled = compile_sql92(expression)
    except ValueError as err:
        raise BrokerException(pymq_pb2.SUBSCRIPTION_PARSE_FAILED, str(err)) from None
    return SubscriptionData(None, lambda raw: compiled.matches(decode_properties(raw)))


def parse_tag_expression(expression: str) -> frozenset[int] | None:
    """The tag hash codes a subscription accepts, or None for every message."""
    try:
        tags = check_tags(expression)
    except ValueError as err:
        raise BrokerException(pymq_pb2.SUBSCRIPTION_PARSE_FAILED, str(err)) from None
    return None if tags is None else frozenset(tag_hash(t.encode()) for t in tags)
