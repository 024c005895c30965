"""IndexService: look messages up by KEYS and UNIQ_KEY (RocketMQ's IndexFile).

An index file is a fixed hash table on disk: a 40-byte header, ``max_hash_slot_num``
4-byte slots holding the newest entry of each slot, then ``max_index_num`` 20-byte
entries (key hash, physical offset, seconds since the file began, previous
entry) chained per slot. The slots of the file being written live in memory
(a fixed size, whatever is stored) and reach the disk at each flush; older files
are read with pread. Hash collisions are resolved by the caller, which checks
the record itself.
"""

from __future__ import annotations

import array
import logging
import os
import struct
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
from pymq_proto.crc32 import crc32

log = logging.getLogger(__name__)

INDEX_HEADER = struct.Struct("<qqqqii")  # begin ts, end ts, begin phy, end phy, slots, count
INDEX_ENTRY = struct.Struct("<iqii")  # key hash, phy offset, time diff (s), prev index
SLOT = struct.Struct("<i")
INDEX_ENTRY_DTYPE = np.dtype([("hash", "<i4"), ("phy", "<i8"), ("diff", "<i4"), ("prev", "<i4")])
assert INDEX_ENTRY_DTYPE.itemsize == INDEX_ENTRY.size
SCALAR_MAX_KEYS = 32  # puts of at most this many keys are chained key by key (numpy costs more)

IntColumn = list[int] | npt.NDArray[np.int64] | npt.NDArray[np.uint32]
"""Hashes or offsets of a put: arrays from a batch's columns, lists from the per-key paths."""


def _as_list(column: IntColumn) -> list[int]:
    return column if isinstance(column, list) else column.tolist()


def key_seed(topic: str) -> int:
    """The CRC every key hash of ``topic`` starts from."""
    return crc32(f"{topic}#".encode())


def key_hash(topic: str, key: str) -> int:
    return crc32(key.encode(), key_seed(topic)) & 0x7FFFFFFF


class IndexFile:
    def __init__(self, path: Path, slots: int, max_index: int, *, load: bool) -> None:
        self.path = path
        self.slots_num = slots
        self.max_index = max_index
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.entries_pos = INDEX_HEADER.size + slots * SLOT.size
        self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = 0
        self.index_count = 1  # entry 0 means "none", as in RocketMQ
        self.slots: array.array[int] | None = None
        if load:
            head = os.pread(self.fd, INDEX_HEADER.size, 0)
            if len(head) == INDEX_HEADER.size:
                (self.begin_ts, self.end_ts, self.begin_phy, self.end_phy, _n,
                 count) = INDEX_HEADER.unpack(head)
                self.index_count = max(1, count)
        else:
            os.ftruncate(self.fd, self.entries_pos + max_index * INDEX_ENTRY.size)

    def is_full(self) -> bool:
        return self.index_count >= self.max_index

    def load_slots(self) -> None:
        """Bring the slot table into memory (the file being written)."""
        raw = os.pread(self.fd, self.slots_num * SLOT.size, INDEX_HEADER.size)
        self.slots = array.array("i", raw.ljust(self.slots_num * SLOT.size, b"\0"))

    def rebuild_slots(self) -> None:
        """The slot table from the entries the header counts (after a crash).

        The table and the header are written one after the other at a flush, so
        after a crash the table on disk may point past the header's count or miss
        entries it counts; the entries themselves are authoritative. Each slot is
        headed by its newest entry.
        """
        n = self.index_count - 1
        raw = os.pread(self.fd, n * INDEX_ENTRY.size, self.entries_pos + INDEX_ENTRY.size)
        hashes = np.frombuffer(raw, dtype=INDEX_ENTRY_DTYPE, count=len(raw) // INDEX_ENTRY.size)["hash"]
        slots = np.zeros(self.slots_num, dtype=np.int32)
        newest_first = (hashes.astype(np.int64) % self.slots_num)[::-1]
        used, first = np.unique(newest_first, return_index=True)
        slots[used] = len(hashes) - first  # entry i of the file is hashes[i - 1]
        self.slots = array.array("i", slots.tobytes())

    def release_slots(self) -> None:
        self.flush()
        self.slots = None

    def room(self) -> int:
        return self.max_index - self.index_count

    def put_keys(self, hashes: IntColumn, phys: IntColumn, store_ts: int) -> None:
        """Index ``hashes[i]`` at physical offset ``phys[i]``: one write for all."""
        slots = self.slots
        assert slots is not None
        if self.begin_ts == 0:
            self.begin_ts, self.begin_phy = store_ts, int(phys[0])
        diff = max(0, (store_ts - self.begin_ts) // 1000)
        first = self.index_count
        count = len(hashes)
        if count <= SCALAR_MAX_KEYS:  # the same chaining, key by key (numpy costs more for a few)
            pack, nslots = INDEX_ENTRY.pack, self.slots_num
            parts = []
            for i, (h, phy) in enumerate(zip(_as_list(hashes), _as_list(phys), strict=True)):
                s = h % nslots
                parts.append(pack(h, phy, diff, slots[s]))
                slots[s] = first + i
            raw = b"".join(parts)
        else:
            raw = self._entries(hashes, phys, diff, first)
        os.pwrite(self.fd, raw, self.entries_pos + first * INDEX_ENTRY.size)
        self.index_count = first + count
        self.end_ts, self.end_phy = store_ts, int(phys[-1])

    def _entries(self, hashes: IntColumn, phys: IntColumn, diff: int, first: int) -> bytes:
        """The entries of many keys at once, chained into (and updating) the slots with numpy."""
        slots = self.slots
        assert slots is not None
        count = len(hashes)
        entries = np.empty(count, dtype=INDEX_ENTRY_DTYPE)
        entries["hash"] = hashes
        entries["phy"] = phys
        entries["diff"] = diff
        # Chaining as if the keys were added one by one: a key's "prev" is the last
        # earlier key of this put in its slot, else the slot's head; the slot's new
        # head is its last key. Sorting by slot (stably) groups each slot's keys in order.
        slot_arr = np.frombuffer(slots, dtype=np.int32)
        slot_of = entries["hash"].astype(np.int64) % self.slots_num
        order = np.argsort(slot_of, kind="stable")
        sorted_slots = slot_of[order]
        same = sorted_slots[1:] == sorted_slots[:-1]
        idx_sorted = first + order
        prev_sorted = slot_arr[sorted_slots]
        prev_sorted[1:] = np.where(same, idx_sorted[:-1], prev_sorted[1:])
        prev = np.empty(count, dtype=np.int32)
        prev[order] = prev_sorted
        entries["prev"] = prev
        last = np.append(~same, True)
        slot_arr[sorted_slots[last]] = idx_sorted[last]
        return entries.tobytes()

    def lookup(self, h: int, max_num: int, begin_ms: int, end_ms: int) -> list[int]:
        """Physical offsets of entries with hash ``h`` stored in [begin_ms, end_ms]."""
        s = h % self.slots_num
        if self.slots is not None:
            idx = self.slots[s]
        else:
            idx = SLOT.unpack(os.pread(self.fd, SLOT.size, INDEX_HEADER.size + s * SLOT.size))[0]
        out: list[int] = []
        seen = 0
        while 0 < idx < self.index_count and len(out) < max_num and seen < 100_000:
            seen += 1
            raw = os.pread(self.fd, INDEX_ENTRY.size, self.entries_pos + idx * INDEX_ENTRY.size)
            eh, phy, diff, prev = INDEX_ENTRY.unpack(raw)
            ts = self.begin_ts + diff * 1000
            if eh == h and begin_ms - 1000 <= ts <= end_ms + 1000:
                out.append(phy)
            if prev >= idx:
                break
            idx = prev
        return out

    def flush(self) -> None:
        if self.slots is not None:
            os.pwrite(self.fd, self.slots.tobytes(), INDEX_HEADER.size)
        os.pwrite(
            self.fd,
            INDEX_HEADER.pack(self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
                              self.slots_num, self.index_count),
            0,
        )
        os.fdatasync(self.fd)

    def destroy(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        os.close(self.fd)


class IndexService:
    """Index files by time; only the newest one is written."""

    def __init__(self, root: Path, slots: int, max_index: int) -> None:
        self.root = root
        self.slots = slots
        self.max_index = max_index
        self.files: list[IndexFile] = []
        self.dirty = False

    def load(self, *, crashed: bool = False) -> None:
        """Open the index files; after a crash, rebuild the newest one's slot table."""
        self.root.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.root.iterdir()):
            if path.name.isdigit():
                self.files.append(IndexFile(path, self.slots, self.max_index, load=True))
        if self.files:
            if crashed:
                self.files[-1].rebuild_slots()
            else:
                self.files[-1].load_slots()

    @property
    def indexed_upto(self) -> int:
        """The physical offset of the last record the index files hold for sure, -1 if none.

        Entries are written as they come, but the newest file's slot table and
        header only at each flush: after a crash, the entries past its header
        are unreachable, and the store indexes those records again.
        """
        return max((f.end_phy for f in self.files if f.end_ts), default=-1)

    def _writable(self) -> IndexFile:
        if not self.files or self.files[-1].is_full():
            if self.files:
                self.files[-1].release_slots()
            name = f"{time.strftime('%Y%m%d%H%M%S')}{int(time.time() * 1000) % 1000:03d}"
            while (self.root / name).exists():
                name = str(int(name) + 1)
            f = IndexFile(self.root / name, self.slots, self.max_index, load=False)
            f.load_slots()
            self.files.append(f)
        return self.files[-1]

    def build_index(self, topic: str, keys: list[str], phys: list[int], store_ts: int) -> None:
        """Index ``keys[i]`` of ``topic`` at ``phys[i]`` (several keys may share an offset)."""
        seed = key_seed(topic)
        self.build_index_hashes([crc32(k.encode(), seed) & 0x7FFFFFFF for k in keys], phys, store_ts)

    def build_index_hashes(self, hashes: IntColumn, phys: IntColumn, store_ts: int) -> None:
        """:meth:`build_index` with the keys' hashes (:func:`key_hash`) already computed."""
        start = 0
        while start < len(hashes):
            f = self._writable()
            stop = start + max(1, min(f.room(), len(hashes) - start))
            f.put_keys(hashes[start:stop], phys[start:stop], store_ts)
            start = stop
        self.dirty = True

    def query_offsets(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> list[int]:
        h = key_hash(topic, key)
        out: list[int] = []
        for f in reversed(self.files):
            if f.end_ts and f.end_ts < begin_ms - 1000:
                break
            out.extend(f.lookup(h, max_num - len(out), begin_ms, end_ms))
            if len(out) >= max_num:
                break
        return out

    def flush(self) -> None:
        if self.dirty and self.files:
            self.dirty = False
            self.files[-1].flush()

    def take_expired_files(self, phy_min: int) -> list[IndexFile]:
        """The files (never the last) that index only records below ``phy_min``, taken out for the
        caller to destroy."""
        taken = []
        while len(self.files) > 1 and self.files[0].end_phy < phy_min:
            taken.append(self.files.pop(0))
        return taken

    def shutdown(self) -> None:
        self.flush()
        for f in self.files:
            f.close()
