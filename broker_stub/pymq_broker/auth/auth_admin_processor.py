"""The user and ACL RPCs (RocketMQ 5's CREATE_USER ... LIST_ACL), on the metadata providers.

Who may call them is the gRPC layer's business (Super users once authentication is on);
this module checks the values and keeps the stored documents consistent. A password
never leaves the broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from .authentication import DefaultAuthenticationProvider
from .metadata_provider import AuthenticationMetadataProvider, AuthorizationMetadataProvider
from .model import (
    Acl,
    PolicyEntry,
    Resource,
    Subject,
    User,
    UserType,
    check_username,
    parse_action,
    parse_decision,
    parse_user_status,
    parse_user_type,
)
from .rpc_resources import check_acl_resource


def _illegal(err: ValueError) -> BrokerException:
    return BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, str(err))


_R = TypeVar("_R")

class AuthAdminProcessor:
    def __init__(self, users: AuthenticationMetadataProvider, acls: AuthorizationMetadataProvider,
                 authentication: DefaultAuthenticationProvider) -> None:
        self.users = users
        self.acls = acls
        self.authentication = authentication
        # held by a change from its checks until its files are written (on threads, off the event
        # loop: see ConfigManager.persist_async): changes of users and ACLs come one at a time, as
        # when they were written on the loop, so that what reaches the disk keeps its order (a
        # user's ACL gone before the user, none made for a user being deleted)
        self._changing = asyncio.Lock()

    async def _one_at_a_time(self, change: Callable[[], Awaitable[_R]]) -> _R:
        """``change`` under :attr:`_changing`, in a task of its own: a client that gives up (its
        deadline, a shutdown's grace) must not cut a change short between its table and its files
        (a DeleteUser's ACL written, its user never: back at the next start, and not deletable
        before it, gone from the table), nor let the next change in while its write still runs."""

        async def locked() -> _R:
            async with self._changing:
                return await change()

        return await asyncio.shield(asyncio.ensure_future(locked()))

    async def changes_done(self) -> None:
        """Wait for the change in progress and those waiting for it (:attr:`_changing` is handed on
        in order): a shutdown, before the data dir is let go, as it waits for the other managers'
        writes by writing them (their write lock); users and ACLs are written only by these."""
        async with self._changing:
            pass

    # -- users --------------------------------------------------------------------------

    async def create_user(self, req: pymq_pb2.CreateUserRequest) -> pymq_pb2.UserResponse:
        return await self._one_at_a_time(partial(self._create_user, req))

    async def _create_user(self, req: pymq_pb2.CreateUserRequest) -> pymq_pb2.UserResponse:
        u = req.user
        try:
            user = User(check_username(u.username), u.password, parse_user_type(u.user_type or "Normal"),
                        parse_user_status(u.user_status or "enable"))
        except ValueError as err:
            raise _illegal(err) from None
        if not user.password:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"user {user.username!r} needs a password")
        if user.username in self.users.users:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT,
                                  f"user {user.username!r} exists already: use update_user to change it")
        self.users.users[user.username] = user
        await self.users.persist_async()
        return pymq_pb2.UserResponse()

    def add_user(self, user: User) -> None:
        """The start's initial user (--init-authentication-user), before the broker serves."""
        self.users.users[user.username] = user
        self.users.persist()

    async def update_user(self, req: pymq_pb2.UpdateUserRequest) -> pymq_pb2.UserResponse:
        return await self._one_at_a_time(partial(self._update_user, req))

    async def _update_user(self, req: pymq_pb2.UpdateUserRequest) -> pymq_pb2.UserResponse:
        u = req.user
        user = self.users.users.get(u.username)
        if user is None:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"user {u.username!r} does not exist")
        try:
            updated = User(user.username, u.password or user.password,
                           parse_user_type(u.user_type) if u.user_type else user.user_type,
                           parse_user_status(u.user_status) if u.user_status else user.user_status)
        except ValueError as err:
            raise _illegal(err) from None
        self.users.users[user.username] = updated
        self.authentication.forget(user.username)  # in effect now, as the table
        await self.users.persist_async()
        return pymq_pb2.UserResponse()

    async def delete_user(self, req: pymq_pb2.DeleteUserRequest) -> pymq_pb2.UserResponse:
        return await self._one_at_a_time(partial(self._delete_user, req))

    async def _delete_user(self, req: pymq_pb2.DeleteUserRequest) -> pymq_pb2.UserResponse:
        if req.username not in self.users.users:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"user {req.username!r} does not exist")
        # The ACL goes to disk first: a crash between the two writes leaves a user without rights,
        # never rights without their user (which a user created again by that name would inherit).
        # Both leave the tables at once (refused from this request on), the files written after.
        subject = f"User:{req.username}"
        acl = self.acls.acls.pop(subject, None)
        user = self.users.users.pop(req.username)
        self.authentication.forget(req.username)
        try:
            if acl is not None:
                try:
                    await self.acls.persist_async()
                except BaseException:  # neither file written: the user keeps its rights, as on disk
                    self.acls.acls.setdefault(subject, acl)
                    self.acls.version += 1
                    raise
            await self.users.persist_async()
        except BaseException:
            # users.json still holds the user (no write of it follows by itself): kept in the table
            # too, so that the DeleteUser asked again writes its deletion (not "does not exist")
            self.users.users.setdefault(req.username, user)
            raise
        return pymq_pb2.UserResponse()

    def list_users(self, req: pymq_pb2.ListUsersRequest) -> pymq_pb2.ListUsersResponse:
        return pymq_pb2.ListUsersResponse(users=[
            pymq_pb2.UserInfo(username=u.username, user_type=u.user_type.value,
                              user_status=u.user_status.value)
            for name, u in sorted(self.users.users.items()) if req.filter in name
        ])

    def has_super_user(self) -> bool:
        return any(u.user_type == UserType.SUPER for u in self.users.users.values())

    # -- ACLs ---------------------------------------------------------------------------

    async def create_acl(self, req: pymq_pb2.CreateAclRequest) -> pymq_pb2.AclResponse:
        return await self._one_at_a_time(partial(self._create_acl, req))

    async def _create_acl(self, req: pymq_pb2.CreateAclRequest) -> pymq_pb2.AclResponse:
        try:
            subject = Subject.parse(req.acl.subject)
            entries = [PolicyEntry.build(e.resource, e.actions, e.decision or "Allow", e.source_ips)
                       for e in req.acl.entries]
            for entry in entries:
                check_acl_resource(entry.resource)
        except ValueError as err:
            raise _illegal(err) from None
        if not entries:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"the ACL of {subject} names no resource")
        if subject.username not in self.users.users:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT,
                                  f"user {subject.username!r} does not exist: create it first")
        acl = self.acls.acls.setdefault(str(subject), Acl(subject))
        for entry in entries:
            acl.entries[str(entry.resource)] = entry
        await self.acls.persist_async()
        return pymq_pb2.AclResponse()

    async def delete_acl(self, req: pymq_pb2.DeleteAclRequest) -> pymq_pb2.AclResponse:
        return await self._one_at_a_time(partial(self._delete_acl, req))

    async def _delete_acl(self, req: pymq_pb2.DeleteAclRequest) -> pymq_pb2.AclResponse:
        try:
            subject = Subject.parse(req.subject)
            resources = [str(Resource.parse(r)) for r in req.resources]
        except ValueError as err:
            raise _illegal(err) from None
        acl = self.acls.acls.get(str(subject))
        if acl is None:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"{subject} has no ACL")
        if resources:
            missing = [r for r in resources if r not in acl.entries]
            if missing:
                raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT,
                                      f"the ACL of {subject} has no entry for {', '.join(missing)}")
            for r in resources:
                del acl.entries[r]
        if not resources or not acl.entries:
            del self.acls.acls[str(subject)]
        await self.acls.persist_async()
        return pymq_pb2.AclResponse()

    def list_acls(self, req: pymq_pb2.ListAclsRequest) -> pymq_pb2.ListAclsResponse:
        try:
            subject = str(Subject.parse(req.subject)) if req.subject else None
            resources = {str(Resource.parse(r)) for r in req.resources}
            actions = {parse_action(a) for a in req.actions}
            decision = parse_decision(req.decision) if req.decision else None
        except ValueError as err:
            raise _illegal(err) from None
        out = []
        for name, acl in sorted(self.acls.acls.items()):
            if subject is not None and name != subject:
                continue
            entries = [
                pymq_pb2.PolicyEntry(resource=str(e.resource), actions=sorted(a.value for a in e.actions),
                                     source_ips=list(e.source_ips), decision=e.decision.value)
                for key, e in acl.entries.items()
                if (not resources or key in resources)
                and (not actions or actions & e.actions)
                and (decision is None or e.decision == decision)
            ]
            if entries:
                out.append(pymq_pb2.AclInfo(subject=name, entries=entries))
        return pymq_pb2.ListAclsResponse(acls=out)
