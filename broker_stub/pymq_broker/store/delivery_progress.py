"""DeliveryProgress: the progress file of a service that delivers stored messages later.

ScheduleMessageService (delay levels) and TimerMessageStore (exact times) write a message again
to its real topic when it is due, then their progress. The progress reaches the disk only once
what it covers is as durable as the store makes a send (under SYNC_FLUSH, the commit log flushed):
a restart never skips a message; a crash in between delivers the last round again (at least once,
as RocketMQ's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from ..common.config_manager import ConfigManager
from .config import SYNC_FLUSH
from .message_store import DefaultMessageStore


class DeliveryProgress(ConfigManager):
    def __init__(self, store: DefaultMessageStore, path: Path) -> None:
        super().__init__(path)
        self.store = store

    def load(self) -> None:
        super().load()
        if self.correct_progress():
            # on disk before anything is served: a second crash before the next round's write would
            # read the old progress again, past the new messages that took the cut offsets
            self.persist()

    def correct_progress(self) -> bool:
        """Progress past the end of what is stored goes back to it (a crash that cut the commit
        log's tail: a torn page, or under ASYNC_FLUSH what was not flushed, cuts the queues too, and
        the next messages take the cut offsets again); True if it moved."""
        return False

    def progress_made(self, *, write: bool) -> None:
        """A round delivered messages: its progress written now (``write``), or by the caller's
        :meth:`delivered_job` off the event loop (a write and an fsync after every round held every
        client of the broker)."""
        if write:
            self._flush_store()
            self.persist()
        else:
            self.dirty = True

    def delivered_job(self) -> Callable[[], None] | None:
        """The progress as it is now (taken on the event loop), as a call for another thread that
        flushes the store as needed and writes it; None when nothing was delivered since the last."""
        return self._flushed_then_written(self.snapshot_job()) if self.dirty else None

    async def progress_written(self) -> None:
        """The progress as it is now on disk when this returns, the store flushed first as needed: a
        change answered only once durable (a recall), while the broker serves everyone else.

        The snapshot is taken at the call, on the event loop; the flush and the write (an fsync)
        run on a thread. A delivery round's write racing it is safe: the commit log's flush waits
        for one in progress, and an older snapshot never replaces a newer one (which holds both).
        A write that fails, or a caller cancelled meanwhile, leaves the progress dirty for the next
        round's write."""
        job = self._flushed_then_written(self.snapshot_job())
        try:
            await asyncio.to_thread(job)
        except BaseException:
            self.dirty = True
            raise

    def _flushed_then_written(self, write: Callable[[], None]) -> Callable[[], None]:
        def job() -> None:
            self._flush_store()
            write()

        return job

    def _flush_store(self) -> None:
        if self.store.config.flush_disk_type == SYNC_FLUSH:
            self.store.commit_log.flush()
