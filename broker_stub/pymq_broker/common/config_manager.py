"""ConfigManager: a JSON document persisted atomically (write, fsync, rename), with a backup."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger(__name__)


class ConfigFileDamagedError(ValueError):
    """A config file (and its backup) that cannot be loaded: the broker does not start."""


class ConfigManager:
    """Subclasses give ``encode()`` / ``decode(data)``; ``persist()`` is crash-safe."""

    # written as compact JSON (Python's C encoder) rather than indented for people to read: for
    # a large document written every second on the event loop (the v2 in-flight messages)
    COMPACT: ClassVar[bool] = False
    # the mode of the file (and of its temporary file, from its first byte), for a document that
    # must not be readable by others (the users' passwords); None: 0644 less the umask
    FILE_MODE: ClassVar[int | None] = None

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
        """Read the document, or its backup when it is missing, empty or damaged.

        As RocketMQ's ``ConfigManager.load``: a file that cannot be read is logged and the
        backup (``<file>.bak``, the version before the last write) is tried. Unlike RocketMQ, a
        damaged file without a good backup stops the start (:class:`ConfigFileDamagedError`):
        serving with an empty table would drop every topic, offset or ACL it held, and the
        next write would put the empty table over the evidence.
        """
        bak = self.path.with_name(self.path.name + ".bak")
        damaged: list[str] = []
        empty: list[Path] = []
        for candidate in (self.path, bak):
            try:
                raw = candidate.read_bytes()
            except FileNotFoundError:
                continue
            if not raw.strip():
                log.warning("config file %s is empty: trying its backup", candidate)
                empty.append(candidate)
                continue
            # decode may fill a table entry by entry: a damaged file's first entries must not stay
            before = {k: copy.copy(v) if isinstance(v, (dict, list, set)) else v
                      for k, v in vars(self).items()}
            try:
                data = json.loads(raw)
                if not isinstance(data, dict):
                    raise TypeError(f"a JSON {type(data).__name__}, not an object")
                self.decode(data)
            except (ValueError, TypeError, AttributeError, KeyError) as err:
                vars(self).update(before)
                problem = f"{candidate} ({type(err).__name__}: {err})"
                damaged.append(problem)
                log.error("config file %s cannot be loaded: trying its backup", problem)
                continue
            if damaged or empty:
                log.warning("config file %s loaded from its backup %s: what changed after that backup "
                            "was written is lost", self.path, candidate)
            return
        if damaged:
            tried = [f"{p} is empty" for p in empty] + [f"{d} cannot be loaded" for d in damaged]
            if len(tried) == 1:
                tried.append(f"there is no backup {bak}")
            raise ConfigFileDamagedError(
                f"config file {' and '.join(tried)}: the broker does not start without what it "
                "holds. Restore the file from a copy, or move it away to start without it"
            )

    def persist(self) -> None:
        """Write the document so that a crash leaves either the old or the new one.

        A write that fails (a full disk) leaves both files as they were and marks the
        document dirty again, so the controller's periodic write tries it again.
        """
        try:
            self.write(self.snapshot())
        except BaseException:
            self.dirty = True
            raise

    def changed(self, *, persist: bool) -> None:
        """A change to the tables: written now (``persist``), or marked for a later write (the
        caller's :meth:`persist_async`, off the event loop, or the periodic one)."""
        if persist:
            self.persist()
        else:
            self.dirty = True

    async def persist_async(self) -> None:
        """:meth:`persist` from a coroutine on the event loop, the file work off it.

        The snapshot is taken here, on the loop (the only writer of the tables); the write and
        fsync run on a thread, and this returns once they are done: the change is on disk before
        its request is answered (as RocketMQ's), while other clients are served meanwhile. Two
        changes racing are safe: :meth:`write` does not put an older snapshot over a newer one,
        and the newer one holds both. A write that fails (or a caller cancelled while it runs)
        leaves the document dirty, for the controller's periodic write to try again.
        """
        job = self.snapshot_job()
        try:
            await asyncio.to_thread(job)
        except BaseException:
            self.dirty = True
            raise

    def persist_if_dirty(self) -> None:
        snapshot = self.snapshot_if_dirty()
        if snapshot is not None:
            try:
                self.write(snapshot)
            except BaseException:  # as persist(): the next write tries it again
                self.dirty = True
                raise

    def snapshot_if_dirty(self) -> tuple[int, bytes] | None:
        """A snapshot if something changed since the last one (for a write on another thread)."""
        return self.snapshot() if self.dirty else None

    def snapshot(self) -> tuple[int, bytes]:
        """The document as it is now, numbered: take it on the thread that changes the tables."""
        number, state = self._capture_numbered()
        return number, self.render(state)

    def snapshot_job(self) -> Callable[[], None]:
        """The document as it is now (take it on the thread that changes the tables), as a call that
        encodes and writes it, for another thread: :meth:`render` runs there."""
        number, state = self._capture_numbered()
        return lambda: self.write((number, self.render(state)))

    def snapshot_job_if_dirty(self) -> Callable[[], None] | None:
        return self.snapshot_job() if self.dirty else None

    def _capture_numbered(self) -> tuple[int, Any]:
        self.dirty = False
        self._snapshots += 1
        return self._snapshots, self.capture()

    def capture(self) -> Any:
        """What :meth:`render` encodes, taken on the thread that changes the tables: the encoded
        document, unless a subclass takes a cheaper copy (of values replaced, never changed in place)
        and encodes it in :meth:`render`, which may run on another thread."""
        return self.encode()

    def render(self, state: Any) -> bytes:
        """The file's bytes for :meth:`capture`'s ``state`` (by default an encoded document)."""
        if self.COMPACT:
            return json.dumps(state, separators=(",", ":")).encode()
        return json.dumps(state, indent=1, sort_keys=True).encode()

    def write(self, snapshot: tuple[int, bytes]) -> None:
        """Write ``snapshot`` (write, fsync, rename; from any thread) unless a newer one is on disk.

        The whole document reaches the disk before the old one becomes the backup: a short
        write (a disk filling up) raises and leaves the file and its backup untouched.
        """
        number, text = snapshot
        with self._persist_lock:
            if number <= self._written:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                mode = self.FILE_MODE
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if mode is None else mode)
                try:
                    if mode is not None:  # the mode given applies to a new file only (a crash's is not)
                        os.fchmod(fd, mode)
                    view = memoryview(text)
                    while view:  # os.write may take part of it (then the next one raises ENOSPC)
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if self.path.exists():
                    os.replace(self.path, self.path.with_name(self.path.name + ".bak"))
                os.replace(tmp, self.path)
                self._written = number
                dfd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except BaseException as err:
                # the file and its backup are as they were (if the file moved, load() reads the backup)
                tmp.unlink(missing_ok=True)
                if isinstance(err, OSError):  # "No space left on device" alone says not where
                    raise OSError(err.errno, err.strerror, str(self.path)) from err
                raise
