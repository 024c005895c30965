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
        self._snapshots = 0  # snapshots taken so far
        self._written = 0  # the newest snapshot on disk: an older one never replaces it
        self.dirty = False  # changed since the last snapshot, by a change whose write may wait

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
        self.write(self.snapshot())

    def persist_if_dirty(self) -> None:
        snapshot = self.snapshot_if_dirty()
        if snapshot is not None:
            self.write(snapshot)

    def snapshot_if_dirty(self) -> tuple[int, bytes] | None:
        """A snapshot if something changed since the last one (for a write on another thread)."""
        return self.snapshot() if self.dirty else None

    def snapshot(self) -> tuple[int, bytes]:
        """The document as it is now, numbered: take it on the thread that changes the tables."""
        self.dirty = False
        self._snapshots += 1
        return self._snapshots, json.dumps(self.encode(), indent=1, sort_keys=True).encode()

    def write(self, snapshot: tuple[int, bytes]) -> None:
        """Write ``snapshot`` (write, fsync, rename; from any thread) unless a newer one is on disk."""
        number, text = snapshot
        with self._persist_lock:
            if number <= self._written:
                return
            self._written = number
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, text)
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
