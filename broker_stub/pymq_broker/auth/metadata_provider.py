"""Users and ACLs stored with the broker's other configs (RocketMQ's Local*MetadataProvider).

``config/users.json`` and ``config/acls.json``, each persisted atomically on every
change, on a thread (changes are rare: an administrator's). The files hold the passwords (the
broker needs them to check HMAC signatures, as RocketMQ's do), so they are made
readable by the broker's user only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..common.config_manager import ConfigManager
from .model import Acl, User


class AuthenticationMetadataProvider(ConfigManager):
    """The users, by name."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.users: dict[str, User] = {}

    def encode(self) -> dict[str, Any]:
        return {"users": [u.to_json() for u in self.users.values()]}

    def decode(self, data: dict[str, Any]) -> None:
        self.users = {u.username: u for u in (User.from_json(d) for d in data.get("users", []))}

    def write(self, snapshot: tuple[int, bytes]) -> None:
        # (every write, on whichever thread) the temporary file exists before the write, owner-only:
        # the base class's O_CREAT mode applies to new files only, so the passwords are never
        # readable by others on the way
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path.with_name(self.path.name + ".tmp"), os.O_WRONLY | os.O_CREAT, 0o600))
        _owner_only(self.path.with_name(self.path.name + ".tmp"))
        super().write(snapshot)
        _owner_only(self.path)


class AuthorizationMetadataProvider(ConfigManager):
    """The ACLs, by subject (``User:<name>``)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.acls: dict[str, Acl] = {}
        self.version = 0  # changes with every change of an ACL (decisions cached before are stale)

    def encode(self) -> dict[str, Any]:
        return {"acls": [a.to_json() for a in self.acls.values()]}

    def decode(self, data: dict[str, Any]) -> None:
        self.acls = {str(a.subject): a for a in (Acl.from_json(d) for d in data.get("acls", []))}
        self.version += 1

    def capture(self) -> Any:
        # taken on the event loop at each change, before its write (on a thread): decisions cached
        # before it are stale from now on
        self.version += 1
        return super().capture()


def _owner_only(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".bak"), path.with_name(path.name + ".tmp")):
        if p.exists():
            os.chmod(p, 0o600)
