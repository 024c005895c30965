"""Flush services: ASYNC_FLUSH's periodic flush and SYNC_FLUSH's group commit.

They run in threads (fdatasync releases the GIL) and only ever flush: the
store's single writer thread does every append.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from pathlib import Path

log = logging.getLogger(__name__)


class ServiceThread:
    """A daemon thread that runs ``run_once`` every ``interval_s`` until stopped."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.name = name
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self._wakeup = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wakeup(self) -> None:
        self._wakeup.set()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wakeup.wait(self.interval_s)
            self._wakeup.clear()
            try:
                self.run_once()
            except Exception:  # a failed flush is retried next round
                log.exception("%s failed", self.name)
        try:
            self.run_once()
        except Exception:
            log.exception("%s failed at shutdown", self.name)

    def run_once(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        self._stopped.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(30)


class FlushRealTimeService(ServiceThread):
    """ASYNC_FLUSH: flush the commit log every ``flushIntervalCommitLog`` ms."""

    def __init__(self, flush: Callable[[], int], interval_ms: int) -> None:
        super().__init__("FlushRealTimeService", interval_ms / 1000)
        self.flush = flush

    def run_once(self) -> None:
        self.flush()


class GroupCommitService(ServiceThread):
    """SYNC_FLUSH: every waiting put is acknowledged once an fdatasync covers it.

    Puts that arrive while a flush runs are served together by the next one
    (group commit), so many producers share each fdatasync.
    """

    def __init__(self, flush: Callable[[], int]) -> None:
        super().__init__("GroupCommitService", 0.01)
        self.flush = flush
        self._lock = threading.Lock()
        self._requests: list[tuple[int, Future[bool]]] = []
        self.flushed_offset = 0

    def put_request(self, end_offset: int) -> Future[bool]:
        fut: Future[bool] = Future()
        with self._lock:
            self._requests.append((end_offset, fut))
        self.wakeup()
        return fut

    def run_once(self) -> None:
        with self._lock:
            requests, self._requests = self._requests, []
        if not requests:
            return
        self.flushed_offset = self.flush()
        for end, fut in requests:
            if end > self.flushed_offset:
                with self._lock:
                    self._requests.append((end, fut))
                continue
            # a put that stopped waiting (syncFlushTimeout: answered FLUSH_DISK_TIMEOUT) cancelled
            # its future; the others of this round must still be answered
            with contextlib.suppress(InvalidStateError):
                fut.set_result(True)


class StoreCheckpoint:
    """RocketMQ's StoreCheckpoint: up to which commit-log offset everything is durable.

    Holds ``logics_msg_offset``: every record before it has its consume-queue
    and index entries on disk, so recovery re-dispatches only what follows.
    """

    FORMAT = struct.Struct("<qq")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.logics_msg_offset = 0
        self.timestamp = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        raw = os.pread(self.fd, self.FORMAT.size, 0)
        if len(raw) == self.FORMAT.size:
            self.logics_msg_offset, self.timestamp = self.FORMAT.unpack(raw)

    def flush(self, logics_msg_offset: int, timestamp: int) -> None:
        self.logics_msg_offset, self.timestamp = logics_msg_offset, timestamp
        os.pwrite(self.fd, self.FORMAT.pack(logics_msg_offset, timestamp), 0)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
