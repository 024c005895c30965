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

    # the passwords are never readable by others on the way: the base class makes the temporary file
    # owner-only under its write lock. (Made so before that lock, one write's could be renamed away by
    # another's meanwhile, and the base class made it anew 0644.)
    FILE_MODE = 0o600

    def write(self, snapshot: tuple[int, bytes]) -> None:
        super().write(snapshot)
        # the backup, when it is a users.json an earlier version made 0644; under the write lock: a
        # concurrent write (a periodic retry, a change) renames the files between exists() and chmod
        # otherwise, and a write that reached the disk raised FileNotFoundError
        with self._persist_lock:
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
