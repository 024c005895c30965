"""StoreLock: one broker per data dir, as RocketMQ's ``lock`` file in its store dir.

Two brokers on one data dir both append to the same commit log from their own offsets and
overwrite each other's acknowledged messages. RocketMQ's DefaultMessageStore takes a
``FileLock`` on ``<storePathRootDir>/lock`` at start and refuses to run without it; so does
pymq, with ``flock(2)``: the kernel drops the lock when its holder exits, a ``kill -9``
included, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE_NAME = "lock"  # RocketMQ's StorePathConfigHelper.getLockFile

_held: set[int] = set()  # the lock file descriptors held in this process


def _close_in_child() -> None:
    # A forked child shares the lock (flock belongs to the open file, not the process) and would
    # keep the data dir locked after the broker exits; closing its copy leaves the parent's held.
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


class DataDirInUseError(OSError):
    """Another broker (process, or EmbeddedBroker in this process) holds the data dir."""


class StoreLock:
    """The exclusive lock on ``root/lock``, held from :meth:`acquire` to :meth:`release`.

    The holder's pid is written into the file, so a refused broker can name it.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / LOCK_FILE_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock at once, or raise :class:`DataDirInUseError` naming the data dir and the holder.

        Only the lock file is opened (created if need be) before the lock is held: a refused broker
        changes nothing of the store.
        """
        if self._fd is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DataDirInUseError(
                f"data dir {str(self.root)!r} is in use by another broker ({holder}, holding "
                f"{str(self.path)!r}): two brokers on one store overwrite each other's messages. "
                "Stop that broker first, or give this one another data dir"
            ) from None
        except OSError as err:
            os.close(fd)
            raise OSError(
                f"cannot lock {str(self.path)!r}: {err.strerror or err}; the data dir must be on a file "
                "system that supports flock(2) (a local disk)"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)  # drops the lock too
            raise
        self._fd = fd
        _held.add(fd)

    def release(self) -> None:
        """Drop the lock (the file stays: the next holder writes its pid over it)."""
        fd, self._fd = self._fd, None
        if fd is None or fd not in _held:
            return  # a forked child's copy, closed at the fork: the number may be another file's now
        _held.discard(fd)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no pid of a stopped broker for a refused one to name
        os.close(fd)  # closing the only descriptor of the open file releases the flock


def _holder(fd: int) -> str:
    """``pid N`` of the lock's holder as it wrote it, or what is known of it."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    if not text.isdigit():
        return "pid unknown"
    pid = int(text)
    return f"pid {pid}, this process" if pid == os.getpid() else f"pid {pid}"
