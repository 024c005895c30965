"""What each RPC of the Broker service needs: the (resource, actions) checks of a request.

As RocketMQ 5's DefaultAuthorizationContextBuilder: Pub on a topic to send, Sub on the
topic and on the group to pull, commit progress and send back, Get/List/Create/Update/
Delete for administration (a CreateTopic of an existing topic is an Update).
``%RETRY%<group>`` and ``%DLQ%<group>`` follow the group's rights: Sub on
``Group:<group>`` to read or write them, the admin actions on the group to change or
delete them. A transaction is sent, ended and checked back under its producer group (Pub
on ``Group:<producer group>``), whichever RPC carries its half message. Broker-wide
requests (list topics or groups, runtime info, a message by commit-log offset) are
``Cluster:<broker name>``. User and ACL administration is for Super users only
(:data:`SUPER_ONLY`): a grant could otherwise grant itself everything.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from pymq_proto.record import MessageConst, find_property, property_key
from pymq_proto.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX

from ..processor.admin_broker_processor import is_view_by_msg_id
from ..store.encoded_batch import parse_encoded
from .authorization import AuthorizationContext
from .model import Action, Resource, ResourcePattern, ResourceType

SUPER_ONLY = "super-only"
PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST = (
    Action.PUB, Action.SUB, Action.CREATE, Action.UPDATE, Action.DELETE, Action.GET, Action.LIST,
)
_DATA = {Action.PUB, Action.SUB}


def group_of_topic(name: str) -> str | None:
    """The group whose rights a ``%RETRY%<group>`` or ``%DLQ%<group>`` topic follows (None: another topic)."""
    for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


@functools.lru_cache(maxsize=8192)
def topic(name: str, *actions: Action) -> AuthorizationContext:
    """A topic check; a retry or dead-letter topic becomes its group's (data actions: Sub)."""
    owner = group_of_topic(name)
    if owner is not None:
        group_actions = tuple(dict.fromkeys(SUB if a in _DATA else a for a in actions))
        return AuthorizationContext(Resource.of(ResourceType.GROUP, owner), group_actions)
    return AuthorizationContext(Resource.of(ResourceType.TOPIC, name), actions)


def check_acl_resource(resource: Resource) -> None:
    """ValueError for an ACL entry no check would ever read: one on a retry or dead-letter topic
    (or a prefix of them), whose checks are its group's (:func:`topic`). Stored, it would be
    listed as if it held (a Deny on ``Topic:%DLQ%g`` ignored); its group's entry is what holds."""
    if resource.resource_type != ResourceType.TOPIC:
        return
    owner = group_of_topic(resource.name)
    if owner is None:
        return
    instead = Resource.parse(f"Group:{owner}{'*' if resource.pattern == ResourcePattern.PREFIXED else ''}")
    raise ValueError(
        f"resource {resource} is a retry or dead-letter topic: it follows the rights of its group, "
        f"and an ACL entry on it would never be applied; grant (or deny) on {instead} instead"
    )


@functools.lru_cache(maxsize=8192)
def group(name: str, *actions: Action) -> AuthorizationContext:
    return AuthorizationContext(Resource.of(ResourceType.GROUP, name), actions)


def _topics(names: Iterable[str], *actions: Action) -> list[AuthorizationContext]:
    return [topic(t, *actions) for t in dict.fromkeys(n for n in names if n)]


_TRAN = MessageConst.PROPERTY_TRANSACTION_PREPARED.encode()
_TRAN_KEY = property_key(MessageConst.PROPERTY_TRANSACTION_PREPARED)
_PGROUP = MessageConst.PROPERTY_PRODUCER_GROUP.encode()


def half_message_groups(r: Any) -> set[str]:
    """The PGROUP ("" without one) of each half message (TRAN_MSG=true) a v1 send carries.

    A half message belongs to its PGROUP: that group's check-backs carry it and only that
    group ends it. So a send of one, by SendHalfMessageBatch or by SendMessage, needs Pub on
    the request's producer group as well as on the topic, and its PGROUP must be that group.
    (Read only when the request carries ``TRAN_MSG``; an encoded batch that does is parsed.)
    """
    return {(find_property(p, _PGROUP) or b"").decode("utf-8", "replace")
            for p in _properties_naming(r, (_TRAN_KEY,)) if find_property(p, _TRAN) == b"true"}


def _properties_naming(r: Any, keys: tuple[bytes, ...]) -> list[bytes]:
    """The properties of the messages of a v1 send that hold any of ``keys`` (names + 0x01).

    The usual send names none of them: C searches of the bytes, and an encoded batch is parsed
    only when one is found (one that cannot be parsed: none, as the send processor refuses it,
    naming what is wrong)."""
    if r.HasField("encoded"):
        if not any(key in r.encoded.records for key in keys):
            return []
        try:
            props = parse_encoded(r.encoded.records, r.encoded.sizes, r.topic).all_properties()
        except ValueError:
            return []
    else:
        props = [m.properties for m in r.messages]
    return [p for p in props if any(key in p for key in keys)]


_ORIGINS = (MessageConst.PROPERTY_RETRY_TOPIC.encode(), MessageConst.PROPERTY_DLQ_ORIGIN_TOPIC.encode())
_ORIGIN_KEYS = tuple(name + b"\x01" for name in _ORIGINS)


def origin_topics(r: Any) -> set[str]:
    """The origin topics (RETRY_TOPIC, DLQ_ORIGIN_TOPIC) the messages of a v1 send name.

    A message in ``%RETRY%<g>`` or ``%DLQ%<g>`` goes back to its origin topic: a retry is
    delivered as of it, and Admin.resend_dead_letters publishes a dead letter into it with the
    operator's rights. So a send to those topics needs Sub on each topic it names as origin
    (what its sender must have read it from), not only the group's Sub.
    (Read only when the request carries one of the names; an encoded batch that does is parsed.)
    """
    return {value.decode("utf-8", "replace") for p in _properties_naming(r, _ORIGIN_KEYS)
            for name in _ORIGINS if (value := find_property(p, name))}


Rule = Callable[[Any, str], list[AuthorizationContext]]

# RPC name (pymq.proto) -> the checks of a request (second argument: the broker name)
RULES: dict[str, Rule | str] = {
    # (a SendMessage carrying a half message needs Pub on its group too: AuthService.check)
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
    "CheckClientConfig": lambda r, _b: [group(r.consumer_group, SUB), *_topics([r.topic], SUB)],
    "CreateTopic": lambda r, _b: [topic(r.config.topic_name, CREATE)],
    "DeleteTopic": lambda r, _b: [topic(r.topic, DELETE)],
    "ListTopics": lambda _r, b: [AuthorizationContext(Resource.of(ResourceType.CLUSTER, b), (LIST,))],
    "TopicStats": lambda r, _b: [topic(r.topic, SUB, GET)],
    "ConsumerProgress": lambda r, _b: [group(r.consumer_group, GET), *_topics([r.topic], GET)],
    "ListGroups": lambda _r, b: [AuthorizationContext(Resource.of(ResourceType.CLUSTER, b), (LIST,))],
    # ResetOffsetRequestHeader: @RocketMQAction(INVOKE_BROKER_TO_RESET_OFFSET, action = UPDATE)
    "ResetOffset": lambda r, _b: [group(r.consumer_group, UPDATE), topic(r.topic, UPDATE)],
    "UpdateSubscriptionGroup": lambda r, _b: [group(r.config.group_name, UPDATE)],
    "GetSubscriptionGroup": lambda r, _b: [group(r.group_name, GET)],
    "ViewMessage": lambda r, b: (
        # by msgId within a topic, or any record by offset (whatever its topic: the cluster's)
        [topic(r.topic, SUB, GET)] if is_view_by_msg_id(r)
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


def _sub_queue(r: Any, *extra: Action) -> list[AuthorizationContext]:
    """Sub (and ``extra``) on a v2 request's topic (its message queue's) and on its group."""
    name = r.message_queue.topic.name if "message_queue" in r.DESCRIPTOR.fields_by_name else r.topic.name
    return [topic(name, SUB, *extra), *([group(r.group.name, SUB, *extra)] if r.group.name else [])]


def _v2_settings(s: Any, _b: str) -> list[AuthorizationContext]:
    """A Telemetry settings command: Pub on a producer's topics, Sub on a consumer's group and topics."""
    if s.HasField("publishing"):
        return _topics((t.name for t in s.publishing.topics), PUB)
    if s.HasField("subscription"):
        sub = s.subscription
        return [*([group(sub.group.name, SUB)] if sub.group.name else []),
                *_topics((e.topic.name for e in sub.subscriptions), SUB)]
    return []


_V2_CONSUMERS = (2, 3, 4, 5, 6)  # ClientType: the push, simple, pull and lite consumers

# apache.rocketmq.v2.MessagingService (RocketMQ 5's official clients), as RocketMQ's
# DefaultAuthorizationContextBuilder checks its gRPC requests; keys "v2/<RPC>"
RULES.update({
    "v2/QueryRoute": lambda r, _b: [topic(r.topic.name, PUB, SUB, GET)],
    "v2/Heartbeat": lambda r, _b: (
        [group(r.group.name, SUB)] if r.group.name and r.client_type in _V2_CONSUMERS else []),
    "v2/SendMessage": lambda r, _b: _topics((m.topic.name for m in r.messages), PUB),
    "v2/QueryAssignment": lambda r, _b: _sub_queue(r),
    "v2/ReceiveMessage": lambda r, _b: _sub_queue(r),
    "v2/AckMessage": lambda r, _b: _sub_queue(r),
    "v2/ChangeInvisibleDuration": lambda r, _b: _sub_queue(r),
    "v2/ForwardMessageToDeadLetterQueue": lambda r, _b: _sub_queue(r),
    # Pub on the topic suffices: MessagingProcessor ends only a half message of that topic
    # whose PGROUP is the topic (what a v2 send sets), never another producer group's
    "v2/EndTransaction": lambda r, _b: [topic(r.topic.name, PUB)],
    "v2/NotifyClientTermination": lambda r, _b: [group(r.group.name, SUB)] if r.group.name else [],
    "v2/PullMessage": lambda r, _b: _sub_queue(r),
    "v2/UpdateOffset": lambda r, _b: _sub_queue(r),
    "v2/GetOffset": lambda r, _b: _sub_queue(r, GET),
    # a queue's offset by position or time, no group (RocketMQ's GET_MAX_OFFSET/GET_MIN_OFFSET/
    # SEARCH_OFFSET_BY_TIMESTAMP need Get on the topic): as the v1 QueryOffset, Sub or Get on it
    "v2/QueryOffset": lambda r, _b: [topic(r.message_queue.topic.name, SUB, GET)],
    "v2/RecallMessage": lambda r, _b: [topic(r.topic.name, PUB)],
    "v2/Telemetry": _v2_settings,
})


def authorization_contexts(method: str, request: Any, broker_name: str) -> list[AuthorizationContext] | str:
    """The checks of ``request`` to RPC ``method``, or :data:`SUPER_ONLY`.

    An RPC missing from :data:`RULES` is Super-only, so a new RPC is closed until it is listed.
    """
    rule = RULES.get(method, SUPER_ONLY)
    if isinstance(rule, str):
        return rule
    return rule(request, broker_name)
