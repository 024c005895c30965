"""ConsumeQueue: the per-MessageQueue index into the commit log.

Fixed 20-byte entries (physical offset int64, size int32, tag hash code int64),
one per message, so queue offset N is at byte N * 20. For SCHEDULE_TOPIC_XXXX
the tag slot holds the delivery time instead (RocketMQ's trick, kept).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .mapped_file import MappedFile, MappedFileQueue

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE = 20
CQ_ENTRY = np.dtype([("phy", "<i8"), ("size", "<i4"), ("tag", "<i8")])
assert CQ_ENTRY.itemsize == CQ_STORE_UNIT_SIZE
# RocketMQ's fillPreBlank entry (phy 0, size Integer.MAX_VALUE): the segment bytes before the first
# entry of a queue that begins later. Zeros there would read as the queue's end at the next load.
PRE_BLANK_SIZE = 2**31 - 1

EntryArray = npt.NDArray[np.void]


def pack_entries(
    phys: list[int] | npt.NDArray[np.int64], sizes: list[int] | npt.NDArray[np.int64],
    tags: list[int] | npt.NDArray[np.int64],
) -> bytes:
    arr = np.empty(len(phys), dtype=CQ_ENTRY)
    arr["phy"] = phys
    arr["size"] = sizes
    arr["tag"] = tags
    return arr.tobytes()


class ConsumeQueue:
    """The consume queue of (topic, queue id); offsets are entry indexes."""

    def __init__(self, topic: str, queue_id: int, root: Path, mapped_file_size: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = mapped_file_size
        self.queue = MappedFileQueue(root / topic / str(queue_id), mapped_file_size)
        self.min_logic_offset = 0  # bytes; raised by retention
        self.max_physic_offset = 0  # end of the last message it indexes
        self.last_store_timestamp = 0  # cached by the store, 0 = unknown
        self.dirty = False
        # recover() found an entry that is not one (bytes after the queue's end): the store
        # rebuilds the entries from the last good one out of the commit log
        self.damaged = False
        self._stale: list[Path] = []  # segments past a damaged entry, until the rebuild

    def load(self) -> None:
        self.queue.load()

    def recover(self) -> None:
        """Find the real end of the last segment: the first entry with size 0 (a pre-blank
        entry's size is positive: a queue that begins later keeps its entries).

        Past the end a segment holds zeros. Anything else there (an entry whose size was
        damaged on disk, entries after it) makes the queue :attr:`damaged`: its end is put at
        the last good entry, and the store rebuilds what follows from the commit log (trusted as
        the end, the entries after it were hidden, and their queue offsets given to new
        messages). Nothing is cut on disk here: :meth:`finish_recovery` does it once the store
        has rebuilt the queue, so a start that fails in between finds the damage again.
        """
        files = self.queue.files
        if not files:
            return
        # as RocketMQ's ConsumeQueue.recover, the segments before the last (two of them) are
        # walked too: every entry of a full segment is one
        for mf in files[-3:-1]:
            arr = np.frombuffer(mf.read(0, mf.file_size), dtype=CQ_ENTRY)
            bad = np.flatnonzero((arr["size"] <= 0) | (arr["phy"] < 0))
            if len(bad):
                self._damaged_at(mf, int(bad[0]), int(arr["size"][bad[0]]))
                after = files.index(mf) + 1
                for stale in files[after:]:  # out of the queue until the rebuild (finish_recovery)
                    stale.close()
                    self._stale.append(stale.file_name)
                del files[after:]
                break
        for mf in reversed(files):
            arr, used = self._entries_to_end(mf)
            end = used * CQ_STORE_UNIT_SIZE
            if not self.damaged and mf.any_data_after(end):
                self._damaged_at(mf, used, int(arr["size"][used]) if used < len(arr) else 0)
            mf.wrote_position = mf.flushed_position = end
            if used:
                real = arr[:used][arr["size"][:used] != PRE_BLANK_SIZE]
                if len(real):
                    self.max_physic_offset = int(real[-1]["phy"]) + int(real[-1]["size"])
                break
            if mf is not files[0]:  # an empty trailing segment: drop it
                files.remove(mf)
                if self.damaged:
                    mf.close()
                    self._stale.append(mf.file_name)
                else:
                    mf.destroy()
        if not self.min_logic_offset:
            self.min_logic_offset = self._first_entry_past_pre_blank(files[0]) if files else 0

    @staticmethod
    def _entries_to_end(mf: MappedFile) -> tuple[EntryArray, int]:
        """The segment's entries up to its first empty one (included, if any), and how many come
        before it: read in chunks that grow from 4 KB, as a queue's last segment is mostly zeros."""
        parts: list[EntryArray] = []
        used, position, chunk = 0, 0, 204 * CQ_STORE_UNIT_SIZE
        size = mf.file_size - mf.file_size % CQ_STORE_UNIT_SIZE
        while position < size:
            raw = mf.read(position, min(chunk, size - position))
            part = np.frombuffer(raw[: len(raw) - len(raw) % CQ_STORE_UNIT_SIZE], dtype=CQ_ENTRY)
            if not len(part):
                break
            parts.append(part)
            empty = np.flatnonzero((part["size"] <= 0) | (part["phy"] < 0))
            if len(empty):
                return np.concatenate(parts), used + int(empty[0])
            used += len(part)
            position += len(part) * CQ_STORE_UNIT_SIZE
            chunk = min(chunk * 4, 52_428 * CQ_STORE_UNIT_SIZE)  # up to ~1 MB
        return (np.concatenate(parts) if parts else np.empty(0, dtype=CQ_ENTRY)), used

    def _damaged_at(self, mf: MappedFile, entry: int, size: int) -> None:
        log.warning(
            "consume queue %s-%d: the entry at queue offset %d (%s, size %d) is not one; the queue "
            "ends before it until it is rebuilt from the commit log",
            self.topic, self.queue_id, mf.file_from_offset // CQ_STORE_UNIT_SIZE + entry, mf.file_name, size,
        )
        self.damaged = True

    def finish_recovery(self) -> None:
        """After a damaged queue's rebuild (or none): zero what lies past its end, remove segments
        past it. The rebuilt entries were written over the old bytes."""
        if not self.damaged:
            return
        kept = {mf.file_name for mf in self.queue.files}
        for path in self._stale:
            if path not in kept:
                path.unlink(missing_ok=True)
        self._stale = []
        if self.queue.files:
            last = self.queue.files[-1]
            last.cut(last.wrote_position)
        self.damaged = False

    @staticmethod
    def _first_entry_past_pre_blank(mf: MappedFile) -> int:
        """Where the first segment's entries begin (bytes): past its pre-blank entries, if any."""
        head = np.frombuffer(mf.read(0, CQ_STORE_UNIT_SIZE), dtype=CQ_ENTRY)
        if len(head) == 0 or int(head["size"][0]) != PRE_BLANK_SIZE:  # the usual queue: no read past it
            return mf.file_from_offset
        raw = mf.read(0, mf.wrote_position)
        arr = np.frombuffer(raw[: len(raw) - len(raw) % CQ_STORE_UNIT_SIZE], dtype=CQ_ENTRY)
        blank = np.flatnonzero(arr["size"] != PRE_BLANK_SIZE)
        skip = int(blank[0]) if len(blank) else len(arr)
        return mf.file_from_offset + skip * CQ_STORE_UNIT_SIZE

    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    @property
    def max_offset_in_queue(self) -> int:
        """One past the last entry."""
        return self.queue.max_offset // CQ_STORE_UNIT_SIZE

    def put_entries(self, start_offset: int, data: bytes, end_physic_offset: int) -> None:
        """Append entries for queue offsets ``start_offset``... (already present ones skipped)."""
        expected = self.max_offset_in_queue
        if start_offset < expected:  # re-dispatch after recovery: keep what is there
            skip = (expected - start_offset) * CQ_STORE_UNIT_SIZE
            if skip >= len(data):
                return
            data = data[skip:]
            start_offset = expected
        if start_offset > expected:
            if expected == 0 and not self.queue.files:
                # a queue that begins later (its first segments expired, or it was
                # rebuilt from a commit log whose head is gone)
                first = start_offset * CQ_STORE_UNIT_SIZE
                file_start = first - first % self.mapped_file_size
                mf = self.queue.last_mapped_file(create_offset=file_start)
                assert mf is not None
                self._fill_pre_blank(mf, first - file_start)
                self.min_logic_offset = first
            else:
                raise ValueError(
                    f"consume queue {self.topic}#{self.queue_id} expected offset {expected}, "
                    f"got {start_offset}"
                )
        view = memoryview(data)
        while view:
            mf = self.queue.last_mapped_file(create_offset=0)
            assert mf is not None
            n = min(len(view), mf.remaining())
            mf.append(view[:n])
            view = view[n:]
        self.max_physic_offset = max(self.max_physic_offset, end_physic_offset)
        self.dirty = True

    def begin_at(self, offset: int) -> None:
        """A damaged queue's rebuild found its first record in the log at ``offset``: the
        entries before it (expired, or damaged) cannot be read, the queue begins there."""
        first = offset * CQ_STORE_UNIT_SIZE
        last = self.queue.files[-1] if self.queue.files else None
        if last is not None and first < last.file_from_offset + last.file_size:
            gap = (first - self.queue.max_offset) // CQ_STORE_UNIT_SIZE
            last.append(pack_entries([0] * gap, [PRE_BLANK_SIZE] * gap, [0] * gap))
            self.dirty = True
        else:  # past the last segment: the queue starts over where the run begins
            for mf in self.queue.files:  # removed by finish_recovery, once the rebuild is done
                mf.close()
                self._stale.append(mf.file_name)
            self.queue.files = []
            self.put_entries(offset, b"", 0)
        self.min_logic_offset = first

    @staticmethod
    def _fill_pre_blank(mf: MappedFile, until: int) -> None:
        """RocketMQ's fillPreBlank: pre-blank entries up to ``until`` (bytes into ``mf``)."""
        count = until // CQ_STORE_UNIT_SIZE
        mf.append(pack_entries([0] * count, [PRE_BLANK_SIZE] * count, [0] * count))

    def get_entries(self, offset: int, count: int) -> EntryArray:
        """Entries ``offset`` .. ``offset + count`` (fewer at the end of the queue)."""
        count = min(count, self.max_offset_in_queue - offset)
        if count <= 0:
            return np.empty(0, dtype=CQ_ENTRY)
        chunks = []
        pos = offset * CQ_STORE_UNIT_SIZE
        want = count * CQ_STORE_UNIT_SIZE
        while want > 0:
            mf = self.queue.find_mapped_file_by_offset(pos)
            if mf is None:
                break
            rel = pos - mf.file_from_offset
            n = min(want, mf.wrote_position - rel)
            if n <= 0:
                break
            chunks.append(mf.read(rel, n))
            pos += n
            want -= n
        raw = b"".join(chunks)
        return np.frombuffer(raw[: len(raw) - len(raw) % 20], dtype=CQ_ENTRY)

    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """Drop entries that point at or past ``phy_offset`` (a cut commit log tail)."""
        if self.max_physic_offset <= phy_offset or not self.queue.files:
            return
        # binary search over entries for the first with phy >= phy_offset
        lo, hi = self.min_offset_in_queue, self.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.get_entries(mid, 1)
            if len(e) and int(e[0]["phy"]) < phy_offset:
                lo = mid + 1
            else:
                hi = mid
        self.queue.truncate_dirty_files(lo * CQ_STORE_UNIT_SIZE)
        if lo > self.min_offset_in_queue:
            last = self.get_entries(lo - 1, 1)
            self.max_physic_offset = int(last[0]["phy"]) + int(last[0]["size"])
        else:
            self.max_physic_offset = 0

    def correct_min_offset(self, phy_min: int) -> None:
        """After retention: the queue starts at its first entry still in the commit log."""
        if self.queue.files:  # not below its first segment: retention may have deleted those before
            self.min_logic_offset = max(self.min_logic_offset, self.queue.files[0].file_from_offset)
        lo, hi = self.min_offset_in_queue, self.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.get_entries(mid, 1)
            if len(e) and int(e[0]["phy"]) < phy_min:
                lo = mid + 1
            else:
                hi = mid
        self.min_logic_offset = max(self.min_logic_offset, lo * CQ_STORE_UNIT_SIZE)

    def take_expired_files(self, phy_min: int) -> list[MappedFile]:
        """The whole segments whose last entry is below ``phy_min``, taken out of the queue (its min
        offset moved past them) for the caller to destroy."""
        taken = []
        while len(self.queue.files) > 1:
            first = self.queue.files[0]
            last_entry = self.get_entries(
                (first.file_from_offset + first.file_size) // CQ_STORE_UNIT_SIZE - 1, 1
            )
            if len(last_entry) and int(last_entry[0]["phy"]) + int(last_entry[0]["size"]) <= phy_min:
                taken.append(self.queue.take_first())
            else:
                break
        self.correct_min_offset(phy_min)
        return taken

    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            self.queue.flush()

    def destroy(self) -> None:
        for mf in list(self.queue.files):
            mf.destroy()
        self.queue.files = []
        import shutil

        shutil.rmtree(self.queue.store_path, ignore_errors=True)

    def shutdown(self) -> None:
        self.queue.shutdown()
