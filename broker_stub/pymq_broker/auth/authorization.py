"""The ACL evaluator (RocketMQ 5's DefaultAuthorizationProvider / DefaultAuthorizationHandler).

A Super user may do anything. For a Normal user, each :class:`AuthorizationContext`
(a resource and the actions of which any one suffices) is decided by the entries of the
user's ACL that cover the resource (literal, prefix or ``*``; patterns never cover a
system topic), one of the actions and the request's source IP: any Deny wins, else any
Allow allows, else the request is denied (no entry: deny by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import is_system_topic
from .metadata_provider import AuthorizationMetadataProvider
from .model import Action, Decision, Resource, ResourceType, User, UserType


@dataclass(frozen=True, slots=True)
class AuthorizationContext:
    """One check of a request: ``resource`` with any one of ``actions``."""

    resource: Resource
    actions: tuple[Action, ...]


def _system(resource: Resource) -> bool:
    return resource.resource_type == ResourceType.TOPIC and is_system_topic(resource.name)


class DefaultAuthorizationProvider:
    def __init__(self, acls: AuthorizationMetadataProvider) -> None:
        self.acls = acls
        # (user, context, source IP) -> None (allowed) or the refusal's remark, for one ACL version
        self._decisions: dict[tuple[str, AuthorizationContext, str | None], str | None] = {}
        self._version = -1

    def authorize(self, user: User, contexts: list[AuthorizationContext], source_ip: str | None) -> None:
        """Return if ``user`` may do every context; else BrokerException(FORBIDDEN) naming
        the user, the resource and the action (and nothing of the resource's data)."""
        if user.user_type == UserType.SUPER:
            return
        if self._version != self.acls.version or len(self._decisions) > 50_000:
            self._decisions.clear()
            self._version = self.acls.version
        for ctx in contexts:
            key = (user.username, ctx, source_ip)
            if key not in self._decisions:
                self._decisions[key] = self._decide(user, ctx, source_ip)
            refusal = self._decisions[key]
            if refusal is not None:
                raise BrokerException(pymq_pb2.FORBIDDEN, refusal)

    def _decide(self, user: User, ctx: AuthorizationContext, source_ip: str | None) -> str | None:
        acl = self.acls.acls.get(f"User:{user.username}")
        entries = [] if acl is None else [
            e for e in acl.entries.values()
            if e.resource.matches(ctx.resource, system_topic=_system(ctx.resource))
            and any(e.covers(a, source_ip) for a in ctx.actions)
        ]
        deny = next((e for e in entries if e.decision == Decision.DENY), None)
        if deny is not None or not entries:
            action = " or ".join(a.value for a in ctx.actions)
            why = (f"denied by the ACL entry for {deny.resource}" if deny is not None
                   else "no ACL entry of the user allows it")
            return (f"user {user.username!r} may not {action} on {ctx.resource} ({why}); "
                    "a Super user can grant it with Admin.create_acl / pymq-admin acl create")
        return None
