"""Disk space: RocketMQ's DISK_FULL running flag, and the check that sets and clears it.

RocketMQ marks its store's disk full when the partition holding the commit log or the
consume queues is used above ``diskSpaceWarningLevelRatio`` (90%); the store then answers
every put SERVICE_NOT_AVAILABLE ("the broker's disk is full") until space comes back,
while reads, offsets and everything else go on. pymq does the same, with differences a
broker that shares a laptop's disk needs:

- The ratio is the one ``df`` shows: used / (used + available to unprivileged users), so
  100% is the point where the broker's writes fail. RocketMQ caps the setting at 90;
  pymq takes 1..100.
- The store also keeps ``reserve_bytes`` free (twice maxMessageSize): the consume queues and
  indexes of what the commit log took must still be written, or acknowledged messages
  would stay invisible, and a broker restarted on a full disk could not recover.
- The partitions are looked at from the put path: once a second, and as soon as the bytes
  appended since the last look (counted twice: the consume queues and indexes grow too)
  could have reached either limit. An append that still runs out of space (another process
  filled the disk, a quota) marks the disk full at once and is answered the same way, never
  with a part of a record left behind; so does a consume-queue or index write.
- RocketMQ also deletes commit-log segments that are not expired yet once the disk is
  above ``diskSpaceCleanForciblyRatio`` (85%, ``cleanFileForciblyEnable``). pymq never
  deletes a message before ``fileReservedTime``: a full disk refuses new messages and
  loses none.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_partition_space(path: Path) -> tuple[int, int]:
    """The file system holding ``path``: bytes used, and bytes available to unprivileged users
    (``df``'s Used and Avail; its Use% is used / (used + available)). (0, 0): it does not say."""
    st = os.statvfs(_existing(path))
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize


def used_ratio(used: int, available: int) -> float:
    """RocketMQ's UtilAll.getDiskPartitionSpaceUsedPercent: df's Use%, rounded up, as a fraction
    (0.19 for 18.2%); -1.0 for a file system that does not say."""
    total = used + available
    return -1.0 if total <= 0 else -(-used * 100 // total) / 100


def human_readable_byte_count(n: int) -> str:
    """RocketMQ's MixAll.humanReadableByteCount (binary units, Java's half-up rounding): "252.0 GiB"."""
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n, 1024)), 6)
    value = Decimal(n / 1024**exp).quantize(Decimal("0.1"), ROUND_HALF_UP)
    return f"{value} {'KMGTPE'[exp - 1]}iB"


def is_disk_full(err: OSError) -> bool:
    """Whether a failed write ran out of space (or of the user's quota)."""
    return err.errno in DISK_FULL_ERRNOS


def _existing(path: Path) -> Path:
    # a store's directories appear with their first write: ask about the nearest that exists
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


class DiskSpaceService:
    """Whether the store may write: its partitions against ``warning_level_ratio`` and ``reserve_bytes``.

    ``paths``: the store's directories (commit log, consume queues). ``space``: bytes used
    and available on the partition holding a path (tests may pass their own).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        warning_level_ratio: int,
        reserve_bytes: int,
        *,
        space: Callable[[Path], tuple[int, int]] = disk_partition_space,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = list(paths)
        self.warning_level_ratio = warning_level_ratio
        self.reserve_bytes = reserve_bytes
        self._space = space
        self._clock = clock
        self._next_check = 0.0
        self._budget = 0  # bytes the store may append before it must look again
        self.full = False
        self.remark = ""

    def is_writeable(self, size: int) -> bool:
        """Whether a put of ``size`` bytes may be written (False while the disk is full)."""
        if (self._budget < 2 * size and not self.full) or self._clock() >= self._next_check:
            self.check()
        if self.full:
            return False
        self._budget -= 2 * size
        return True

    def check(self) -> None:
        """Look at the partitions now: mark the disk full or writable again."""
        self._next_check = self._clock() + CHECK_INTERVAL_S
        try:
            spaces = [(*self._space(p), p) for p in self.paths]
        except OSError as err:  # the store's directory cannot be looked at: keep what we knew
            self._budget = 0
            log.warning("cannot read the free space of the store: %s", err)
            return
        spaces = [s for s in spaces if s[0] + s[1] > 0]  # a file system that tells nothing: no limit
        if not spaces:
            self._budget = 1 << 62
            self._mark_ok()
            return
        level = self.warning_level_ratio
        budget = 1 << 62
        for used, available, path in spaces:
            ratio = 100.0 * used / (used + available)
            if ratio > level:
                self._budget = 0
                self._mark_full(
                    f"the disk holding {_existing(path)} is {ratio:.1f}% used, over "
                    f"diskSpaceWarningLevelRatio {level}%; free space there or raise "
                    "diskSpaceWarningLevelRatio (up to 100)"
                )
                return
            if available < self.reserve_bytes:
                self._budget = 0
                self._mark_full(
                    f"the disk holding {_existing(path)} has {available} bytes free, under the "
                    f"{self.reserve_bytes} the store keeps for its consume queues and indexes (twice "
                    "maxMessageSize); free space there"
                )
                return
            to_level = (used + available) * level // 100 - used
            budget = min(budget, available - self.reserve_bytes, to_level)
        self._budget = budget
        self._mark_ok()

    def runtime_info(self) -> dict[str, str]:
        """The disk figures of RocketMQ's BrokerRuntimeInfo (``commitLogDiskRatio``, its per-path
        ``commitLogDiskRatio_<path>``, ``consumeQueueDiskRatio``, ``commitLogDirCapacity`` of the
        store's root, in RocketMQ's formats) and pymq's own ``diskSpaceWarningLevelRatio``,
        ``diskFull`` and ``diskFullReason``."""
        info = {"diskSpaceWarningLevelRatio": str(self.warning_level_ratio),
                "diskFull": str(self.full).lower()}
        if self.full:
            info["diskFullReason"] = self.remark
        try:
            commit_log, consume_queue = self.paths[0], self.paths[-1]
            ratio = str(used_ratio(*self._space(commit_log)))
            # RocketMQ's key names the path as configured, which its config makes absolute
            info["commitLogDiskRatio"] = info[f"commitLogDiskRatio_{os.path.abspath(commit_log)}"] = ratio
            info["consumeQueueDiskRatio"] = str(used_ratio(*self._space(consume_queue)))
            # RocketMQ: File.getTotalSpace() / getFreeSpace() of storePathRootDir (blocks reserved
            # for root count as free there)
            st = os.statvfs(_existing(commit_log.parent))
            total, free = (human_readable_byte_count(n * st.f_frsize) for n in (st.f_blocks, st.f_bfree))
            info["commitLogDirCapacity"] = f"Total : {total}, Free : {free}."
        except OSError as err:  # the figures are left out; the rest of the runtime info still answers
            log.warning("cannot read the free space of the store: %s", err)
        return info

    def mark_full(self, err: OSError) -> None:
        """A write ran out of space (:func:`is_disk_full`): refuse puts until a look finds room."""
        self._next_check = self._clock() + CHECK_INTERVAL_S
        self._budget = 0
        where = err.filename or "the store"
        self._mark_full(f"writing {where} failed: {err.strerror or err}; free space there")

    def _mark_full(self, why: str) -> None:
        self.remark = f"the broker's disk is full: {why}"
        if not self.full:
            log.error("%s; puts are refused (SERVICE_NOT_AVAILABLE) until there is room", self.remark)
        self.full = True

    def _mark_ok(self) -> None:
        if self.full:
            log.info("there is room on the store's disk again: it takes messages")
        self.full = False
        self.remark = ""
