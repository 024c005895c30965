"""ConfigManager: a JSON document persisted atomically (write, fsync, rename)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


class ConfigManager:
    """Subclasses give ``encode()`` / ``decode(data)``; ``persist()`` is crash-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._persist_lock = threading.Lock()

    def encode(self) -> dict[str, Any]:
        raise NotImplementedError

    def decode(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def load(self) -> None:
        for candidate in (self.path, self.path.with_name(self.path.name + ".bak")):
            try:
                data = json.loads(candidate.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            self.decode(data)
            return

    def persist(self) -> None:
        """Write the document so that a crash leaves either the old or the new one."""
        text = json.dumps(self.encode(), indent=1, sort_keys=True)
        with self._persist_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            if self.path.exists():
                os.replace(self.path, self.path.with_name(self.path.name + ".bak"))
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
