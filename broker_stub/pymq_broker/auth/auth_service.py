"""What the gRPC layer calls for every request when authentication is on: who signed it,
and may they do it (:class:`AuthService`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.remoting_helper import parse_peer_address
from . import rpc_resources as rules
from .authentication import DefaultAuthenticationProvider
from .authorization import DefaultAuthorizationProvider
from .model import User, UserStatus, UserType
from .rpc_resources import SUB, SUPER_ONLY, UPDATE, authorization_contexts, topic

if TYPE_CHECKING:
    from .stored_records import StoredRecords


def peer_ip(peer: str) -> str | None:
    """The address of a gRPC peer (``ipv4:10.0.0.7:5123``, ``ipv6:%5B::1%5D:5123``), as a source-IP
    ACL entry matches it; None when it is not an IP address.

    Decoded as :func:`~..common.remoting_helper.parse_peer_address` decodes it (an undecoded
    ``%5B::1%5D`` would be no address: no source-IP entry, Allow or Deny, would ever cover an IPv6
    client). An IPv4-mapped IPv6 address (a dual-stack listener's IPv4 client) is its IPv4
    address, so ``127.0.0.0/8`` covers it as it covers ``ipv4:127.0.0.1``.
    """
    address = parse_peer_address(peer)
    if not address:
        return None
    host = address.rpartition(":")[0].removeprefix("[").removesuffix("]")
    try:
        mapped = ipaddress.IPv6Address(host).ipv4_mapped
    except ValueError:
        return host  # IPv4, or a zone-scoped address (fe80::1%eth0): as written; ip_address parses it
    return str(mapped) if mapped is not None else host


class AuthService:
    """Authenticates every request; authorizes it when authorization is on.

    User and ACL administration is for Super users whenever authentication is on (even
    with authorization off). A send back needs Sub on the topic of every record it names
    (read from the store, not taken from the request), a half message is sent only by the
    producer group its PGROUP names, and a transaction is ended only under the producer group
    that sent it (``records``).
    """

    def __init__(self, broker_name: str, authentication: DefaultAuthenticationProvider,
                 authorization: DefaultAuthorizationProvider | None,
                 records: StoredRecords | None = None) -> None:
        self.broker_name = broker_name
        self.authentication = authentication
        self.authorization = authorization
        self.records = records

    def check(self, rpc: str, request: Any, metadata: Iterable[tuple[str, Any]] | None, peer: str) -> User:
        md: Mapping[str, str] = {k: v for k, v in metadata or () if isinstance(v, str)}
        user = self.authentication.authenticate(md)
        contexts = authorization_contexts(rpc, request, self.broker_name)
        if contexts == SUPER_ONLY:
            if user.user_type != UserType.SUPER:
                raise BrokerException(
                    pymq_pb2.FORBIDDEN,
                    f"user {user.username!r} may not call {rpc}: only Super users manage users and ACLs",
                )
            return user
        if self.authorization is None:
            return user
        assert not isinstance(contexts, str)
        if rpc == "CreateTopic" and self.records is not None and self.records.topic_exists(
                request.config.topic_name):
            contexts = [topic(request.config.topic_name, UPDATE)]  # changing a topic's settings
        half_groups: set[str] = set()
        if rpc in ("SendMessage", "SendHalfMessageBatch") and user.user_type != UserType.SUPER:
            # a half message (TRAN_MSG=true) belongs to a producer group, whatever the RPC carrying it:
            # its sender needs Pub on the group, as SendHalfMessageBatch's rule says
            half_groups = rules.half_message_groups(request)
            if half_groups and rpc == "SendMessage":
                contexts = [*contexts, rules.group(request.producer_group, rules.PUB)]
        ip = peer_ip(peer)
        self.authorization.authorize(user, contexts, ip)
        if user.user_type == UserType.SUPER:
            return user
        if half_groups:
            # and its PGROUP (which check-backs and EndTransaction's owner check read) is that group
            foreign = sorted(g for g in half_groups if g and g != request.producer_group)
            if foreign:
                raise BrokerException(
                    pymq_pb2.FORBIDDEN,
                    f"user {user.username!r} may not send half messages of producer group "
                    f"{foreign[0]!r} (PGROUP) as producer group {request.producer_group!r}: "
                    f"a transaction's PGROUP is the producer group that sends it",
                )
        if rpc in ("SendMessage", "SendHalfMessageBatch") and rules.group_of_topic(request.topic) is not None:
            self._authorize_origins(user, request.topic, rules.origin_topics(request), ip)
        if self.records is None:
            return user
        if rpc in ("ConsumerSendMsgBack", "ConsumerSendMsgBackBatch"):
            offsets = ([request.commit_log_offset] if rpc == "ConsumerSendMsgBack"
                       else list(request.commit_log_offsets))
            self._authorize_send_back(user, self.records.topics_at(offsets), ip)
        if rpc in ("EndTransaction", "EndTransactionBatch"):
            ids = [request.msg_id] if rpc == "EndTransaction" else list(request.msg_ids)
            others = {g for g in self.records.transaction_owners(ids).values() if g != request.producer_group}
            if others:
                raise BrokerException(
                    pymq_pb2.FORBIDDEN,
                    f"user {user.username!r} may not end transactions of another producer group than "
                    f"{request.producer_group!r}: only the producer group that sent a transaction ends it",
                )
        return user

    def _authorize_origins(self, user: User, to: str, origins: set[str], ip: str | None) -> None:
        """Sub on each origin topic a send to a retry or dead-letter topic names
        (:func:`rules.origin_topics`): else a consumer allowed on its group only could plant a
        message that goes to any topic."""
        for name in sorted(origins):
            self._require_sub(user, name, ip, (
                f"user {user.username!r} may not send to {to} a message whose origin topic "
                f"(RETRY_TOPIC / DLQ_ORIGIN_TOPIC) is {name!r}: it needs Sub on {topic(name, SUB).resource} "
                "(a retry or dead letter goes back to its origin topic, which its sender read it from)"))

    def _require_sub(self, user: User, name: str, ip: str | None, refusal: str) -> None:
        """Sub on topic ``name``, else FORBIDDEN with ``refusal`` (which says what it may: the
        evaluator's own words would name the resource)."""
        assert self.authorization is not None
        try:
            self.authorization.authorize(user, [topic(name, SUB)], ip)
        except BrokerException:
            raise BrokerException(pymq_pb2.FORBIDDEN, refusal) from None

    def _authorize_send_back(self, user: User, stored: dict[int, str], ip: str | None) -> None:
        """Sub on the stored topic of each record a send back names (by commit-log offset).

        The refusal names the offset, not the record's topic (or its %RETRY%/%DLQ% group): the
        user chose the offset, and may not learn the names of topics and groups it cannot read
        by probing the commit log.
        """
        first_offset: dict[str, int] = {}
        for offset, name in sorted(stored.items()):
            first_offset.setdefault(name, offset)
        for name, offset in first_offset.items():
            self._require_sub(user, name, ip, (
                f"user {user.username!r} may not send back the message at commit log offset {offset}: "
                "it is not of a topic (and group) the user may Sub"))

    def recheck(self, user: User, rpc: str, request: Any, peer: str) -> None:
        """The rights of an open stream's ``user``, again (its request's signature may be old by now).

        A user deleted or disabled since the stream opened is UNAUTHORIZED; with
        authorization on, the ACLs of now decide (decisions are cached per ACL version,
        so an unchanged ACL costs a dictionary look-up).
        """
        current = self.authentication.users.users.get(user.username)
        if current is None or current.user_status != UserStatus.ENABLE:
            raise BrokerException(
                pymq_pb2.UNAUTHORIZED, f"user {user.username!r} was deleted or disabled; {rpc} is closed"
            )
        if self.authorization is not None:
            contexts = authorization_contexts(rpc, request, self.broker_name)
            assert not isinstance(contexts, str)
            self.authorization.authorize(current, contexts, peer_ip(peer))
