"""Segment files: RocketMQ's MappedFile and MappedFileQueue, read and written by offset.

RocketMQ maps its segments into memory; pymq writes them with ``os.pwrite`` and
reads them with ``os.pread`` instead, so the broker's resident memory stays flat
however much is stored (the page cache does the caching, outside the process).
A segment is named after the offset of its first byte, 20 digits, as in RocketMQ.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path


class MappedFile:
    """One fixed-size segment. ``wrote_position`` is how far it has been written."""

    __slots__ = ("_allocate_lock", "_dirty", "_flush_lock", "fd", "file_from_offset", "file_name",
                 "file_size", "flushed_position", "wrote_position")

    def __init__(self, path: Path, file_from_offset: int, file_size: int) -> None:
        self.file_name = path
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        existed = path.exists()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not existed or os.fstat(self.fd).st_size < file_size:
            os.ftruncate(self.fd, file_size)  # sparse: no disk used until written
        self.wrote_position = 0
        self.flushed_position = 0
        self._dirty = False
        self._flush_lock = threading.Lock()
        # held around the allocate-ahead service's fallocate, as ``_flush_lock`` is around an
        # fdatasync: close() takes both, so neither call runs on a number close() gave back
        self._allocate_lock = threading.Lock()

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the write position; returns the global offset it starts at."""
        pos = self.wrote_position
        try:
            n = os.pwrite(self.fd, data, pos)
        except OSError as err:  # name the file: "No space left on device" alone says not where
            raise OSError(err.errno, err.strerror, str(self.file_name)) from None
        if n != len(data):
            # A short write is a full disk. What did land may hold whole records that were never
            # acknowledged, which recovery after a crash would find: cut it (the cut part reads
            # as zeros again, as a hole).
            self.cut(pos)
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({n} of {len(data)} bytes written)",
                          str(self.file_name))
        self.wrote_position = pos + n
        self._dirty = True
        return self.file_from_offset + pos

    def cut(self, position: int) -> None:
        """Everything from ``position`` on reads as zeros again (the file keeps its size)."""
        os.ftruncate(self.fd, position)
        os.ftruncate(self.fd, self.file_size)

    def read(self, position: int, size: int) -> bytes:
        """``size`` bytes from ``position`` within this file (fewer at its end)."""
        return os.pread(self.fd, size, position)

    def any_data_after(self, position: int) -> bool:
        """Whether a byte from ``position`` on is not zero, reading only what the file holds.

        A segment is sparse (:meth:`__init__`): its holes read as zeros without being read, found
        with ``SEEK_DATA`` / ``SEEK_HOLE`` where the system has them. Reading a mostly empty 6 MB
        consume queue segment whole, at every start, made a broker of 4,096 queues take ~25 s.
        """
        chunk = 1 << 20
        size = self.file_size
        while position < size:
            start, end = position, size
            if hasattr(os, "SEEK_DATA"):
                try:
                    start = max(position, os.lseek(self.fd, position, os.SEEK_DATA))
                    end = min(size, os.lseek(self.fd, start, os.SEEK_HOLE))
                except OSError as err:
                    if err.errno == errno.ENXIO:  # nothing but a hole from here to the end
                        return False
                    start, end = position, size  # the file system cannot say (EINVAL, ...): read it all
            while start < end:
                data = os.pread(self.fd, min(chunk, end - start), start)
                if not data:
                    return False
                if data.count(0) != len(data):
                    return True
                start += len(data)
            position = end
        return False

    def flush(self) -> int:
        """fdatasync if anything was written since the last flush; returns the flushed position.

        Once it returns, what was written before it was called is durable, whichever thread flushes:
        a second flush that found the flag cleared by one still in its fdatasync (the group commit,
        a delivery round's progress write, a recall's) waits for it, rather than returning at once
        and letting its caller write a progress that covers records not yet on disk."""
        with self._flush_lock:
            if self._dirty and self.fd >= 0:  # closed (retention, DeleteTopic): nothing left to sync
                # cleared before the position is read: an append in between (from the thread that
                # writes, while this runs on a flushing one) stays dirty for the next flush, rather
                # than its flag cleared with a target short of it (a SYNC_FLUSH put then waited for a
                # flush that never came: review helper-109)
                self._dirty = False
                target = self.wrote_position
                os.fdatasync(self.fd)
                self.flushed_position = max(self.flushed_position, target)
            return self.flushed_position

    def allocate(self, fallocate: Callable[[int, int, int], None], position: int, length: int) -> bool:
        """``fallocate(fd, position, length)`` unless the file is closed; whether it ran.

        For the allocate-ahead service's thread, which may still hold a segment that retention or
        a DeleteTopic closed meanwhile: it must not allocate in the file that got the number."""
        with self._allocate_lock:
            if self.fd < 0:
                return False
            fallocate(self.fd, position, length)
            return True

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def close(self) -> None:
        """Close the file; its ``fd`` becomes -1.

        Keeping the old number let a thread still holding the segment (a flush's fdatasync, the
        allocate-ahead service's fallocate) act on whatever file the system opened next under it.
        Waits for such a call in progress; later ones are no-ops (:meth:`flush`, :meth:`allocate`),
        other calls fail with EBADF."""
        with self._flush_lock, self._allocate_lock:
            fd, self.fd = self.fd, -1
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def destroy(self) -> None:
        self.close()
        self.file_name.unlink(missing_ok=True)

    def mtime(self) -> float:
        return os.fstat(self.fd).st_mtime


class MappedFileQueue:
    """The ordered segments of one log (the commit log, or one consume queue)."""

    def __init__(self, store_path: Path, mapped_file_size: int) -> None:
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.files: list[MappedFile] = []
        self.lock = threading.Lock()

    def load(self) -> None:
        """Open the existing segments (all marked fully written; recovery fixes the last)."""
        if not self.store_path.exists():
            return
        for path in sorted(self.store_path.iterdir()):
            if not path.name.isdigit():
                continue
            mf = MappedFile(path, int(path.name), self.mapped_file_size)
            mf.wrote_position = mf.flushed_position = self.mapped_file_size
            self.files.append(mf)

    def last_mapped_file(self, create_offset: int | None = None) -> MappedFile | None:
        """The segment being written; a new one (from ``create_offset``) if it is full."""
        last = self.files[-1] if self.files else None
        if create_offset is not None and (last is None or last.is_full()):
            start = create_offset if last is None else last.end_offset
            self.store_path.mkdir(parents=True, exist_ok=True)
            last = MappedFile(self.store_path / f"{start:020d}", start, self.mapped_file_size)
            with self.lock:
                self.files.append(last)
        return last

    def find_mapped_file_by_offset(self, offset: int) -> MappedFile | None:
        files = self.files
        if not files or offset < files[0].file_from_offset:
            return None
        index = (offset - files[0].file_from_offset) // self.mapped_file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.end_offset:
                return mf
        for mf in files:  # segments after a gap (should not happen): search
            if mf.file_from_offset <= offset < mf.end_offset:
                return mf
        return None

    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """One past the last written byte."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.file_from_offset + last.wrote_position

    def truncate_dirty_files(self, offset: int) -> None:
        """Cut everything at and after ``offset`` (a torn tail): zero it, drop later files."""
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.end_offset <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                mf.cut(pos)
                mf.wrote_position = mf.flushed_position = pos
                keep.append(mf)
            else:
                mf.destroy()
        with self.lock:
            self.files = keep

    def flush(self) -> None:
        for mf in list(self.files):
            with contextlib.suppress(OSError):  # destroyed by retention meanwhile
                mf.flush()

    def take_first(self) -> MappedFile:
        """The first segment, out of the queue: the caller destroys it (maybe on another thread)."""
        with self.lock:
            return self.files.pop(0)

    def shutdown(self) -> None:
        for mf in self.files:
            mf.flush()
            mf.close()

    def close(self) -> None:
        """Close every segment without flushing (nothing was written: a load that failed)."""
        for mf in self.files:
            mf.close()
