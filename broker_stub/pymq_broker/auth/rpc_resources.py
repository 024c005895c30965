"""What each RPC of the Broker service needs: the (resource, actions) checks of a request.

As RocketMQ 5's DefaultAuthorizationContextBuilder: Pub on a topic to send, Sub on the
topic and on the group to pull, commit progress and send back, Get/List/Create/Update/
Delete for administration (a CreateTopic of an existing topic is an Update).
``%RETRY%<group>`` and ``%DLQ%<group>`` follow the group's rights: Sub on
``Group:<group>`` to read or write them, the admin actions on the group to change or
delete them. A transaction is ended and checked back under its producer group (Pub on
``Group:<producer group>``). Broker-wide requests (list topics or groups, runtime info, a
message by commit-log offset) are ``Cluster:<broker name>``. User and ACL administration
is for Super users only (:data:`SUPER_ONLY`): a grant could otherwise grant itself
everything.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from pymq_proto.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

from .authorization import AuthorizationContext
from .model import Action, Resource, ResourceType

SUPER_ONLY = "super-only"
PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST = (
    Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE, Action.DELETE, Action.GET, Action.LIST,
)
_DATA = {Action.PUB, Action.SUB}


@functools.lru_cache(maxsize=8192)
def topic(name: str, *actions: Action) -> AuthorizationContext:
    """A topic check; a retry or dead-letter topic becomes its group's (data actions: Sub)."""
    for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if name.startswith(prefix):
            group_actions = tuple(dict.fromkeys(SUB if a in _DATA else a for a in actions))
            return AuthorizationContext(Resource.of(ResourceType.GROUP, name[len(prefix):]), group_actions)
    return AuthorizationContext(Resource.of(ResourceType.TOPIC, name), actions)


@functools.lru_cache(maxsize=8192)
def group(name: str, *actions: Action) -> AuthorizationContext:
    return AuthorizationContext(Resource.of(ResourceType.GROUP, name), actions)


def _topics(names: Iterable[str], *actions: Action) -> list[AuthorizationContext]:
    return [topic(t, *actions) for t in dict.fromkeys(n for n in names if n)]


Rule = Callable[[Any, str], list[AuthorizationContext]]

# RPC name (pymq.proto) -> the checks of a request (second argument: the broker name)
RULES: dict[str, Rule | str] = {
    "SendMessage": lambda r, _b: [topic(r.topic, PUB)],
    "SendHalfMessageBatch": lambda r, _b: [topic(r.topic, PUB), group(r.producer_group, PUB)],
    "PullMessage": lambda r, _b: [topic(r.message_queue.topic, SUB), group(r.consumer_group, SUB)],
    "QueryRoute": lambda r, _b: [topic(r.topic, PUB, SUB, GET)],
    "QueryOffset": lambda r, _b: [topic(r.message_queue.topic, SUB, GET)],
    "GetOffset": lambda r, _b: [topic(r.message_queue.topic, SUB, GET), group(r.consumer_group, SUB, GET)],
    "UpdateOffset": lambda r, _b: [group(r.consumer_group, SUB),
                                   *_topics((o.message_queue.topic for o in r.offsets), SUB)],
    "ConsumerSendMsgBack": lambda r, _b: [group(r.group, SUB), *_topics([r.origin_topic], SUB)],
    "ConsumerSendMsgBackBatch": lambda r, _b: [group(r.group, SUB), *_topics(r.origin_topics, SUB)],
    "HeartBeat": lambda r, _b: [group(r.consumer_group, SUB), *_topics(r.topics, SUB)],
    "CreateTopic": lambda r, _b: [topic(r.config.topic_name, CREATE)],
    "DeleteTopic": lambda r, _b: [topic(r.topic, DELETE)],
    "ListTopics": lambda _r, b: [AuthorizationContext(Resource.of(ResourceType.CLUSTER, b), (LIST,))],
    "TopicStats": lambda r, _b: [topic(r.topic, SUB, GET)],
    "ConsumerProgress": lambda r, _b: [group(r.consumer_group, GET), *_topics([r.topic], GET)],
    "ListGroups": lambda _r, b: [AuthorizationContext(Resource.of(ResourceType.CLUSTER, b), (LIST,))],
    "UpdateSubscriptionGroup": lambda r, _b: [group(r.config.group_name, UPDATE)],
    "GetSubscriptionGroup": lambda r, _b: [group(r.group_name, GET)],
    "ViewMessage": lambda r, b: (
        [topic(r.topic, SUB, GET)] if r.topic and r.msg_id and not r.commit_log_offset
        else [AuthorizationContext(Resource.of(ResourceType.CLUSTER, b), (GET,))]
    ),
    "QueryMessage": lambda r, _b: [topic(r.topic, SUB, GET)],
    "BrokerRuntimeInfo": lambda _r, b: [AuthorizationContext(Resource.of(ResourceType.CLUSTER, b), (GET,))],
    "EndTransaction": lambda r, _b: [group(r.producer_group, PUB)],
    "EndTransactionBatch": lambda r, _b: [group(r.producer_group, PUB)],
    "TransactionStream": lambda r, _b: [group(r.producer_group, PUB)],
    "CreateUser": SUPER_ONLY,
    "UpdateUser": SUPER_ONLY,
    "DeleteUser": SUPER_ONLY,
    "ListUsers": SUPER_ONLY,
    "CreateAcl": SUPER_ONLY,
    "DeleteAcl": SUPER_ONLY,
    "ListAcls": SUPER_ONLY,
}


def authorization_contexts(method: str, request: Any, broker_name: str) -> list[AuthorizationContext] | str:
    """The checks of ``request`` to RPC ``method``, or :data:`SUPER_ONLY`.

    An RPC missing from :data:`RULES` is Super-only, so a new RPC is closed until it is listed.
    """
    rule = RULES.get(method, SUPER_ONLY)
    if isinstance(rule, str):
        return rule
    return rule(request, broker_name)
