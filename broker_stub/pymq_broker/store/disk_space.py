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
- The partitions are checked from the put path, once a second while more than
  :data:`NEAR_BYTES` are free and at every put below that. An append that still runs out
  of space (another process filled the disk, a quota) marks the disk full at once and is
  answered the same way, never with a part of a record left behind.
- RocketMQ also deletes commit-log segments that are not expired yet once the disk is
  above ``diskSpaceCleanForciblyRatio`` (85%, ``cleanFileForciblyEnable``). pymq never
  deletes a message before ``fileReservedTime``: a full disk refuses new messages and
  loses none.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
NEAR_BYTES = 1 << 30  # less free than this: look at every put (a second of puts could take it)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_partition_space(path: Path) -> tuple[float, int]:
    """The file system holding ``path``: percent used as ``df`` shows it, and bytes available."""
    st = os.statvfs(_existing(path))
    used = st.f_blocks - st.f_bfree
    usable = used + st.f_bavail
    return (100.0 * used / usable if usable > 0 else 100.0), st.f_bavail * st.f_frsize


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

    ``paths``: the store's directories (commit log, consume queues). ``space``: percent used
    and bytes available on the partition holding a path (tests may pass their own).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        warning_level_ratio: int,
        reserve_bytes: int,
        *,
        space: Callable[[Path], tuple[float, int]] = disk_partition_space,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = list(paths)
        self.warning_level_ratio = warning_level_ratio
        self.reserve_bytes = reserve_bytes
        self._space = space
        self._clock = clock
        self._next_check = 0.0
        self.full = False
        self.remark = ""

    def is_writeable(self) -> bool:
        """False while the disk is full (see the module for how often it is looked at)."""
        now = self._clock()
        if now >= self._next_check:
            self.check()
        return not self.full

    def check(self) -> None:
        """Look at the partitions now: mark the disk full or writable again."""
        now = self._clock()
        try:
            spaces = [(*self._space(p), p) for p in self.paths]
        except OSError as err:  # the store's directory cannot be looked at: keep what we knew
            self._next_check = now + CHECK_INTERVAL_S
            log.warning("cannot read the free space of the store: %s", err)
            return
        ratio, _, path = max(spaces, key=lambda s: s[0])
        available, tight = min((a, p) for _r, a, p in spaces)
        self._next_check = now + (CHECK_INTERVAL_S if available > NEAR_BYTES else 0.0)
        if ratio > self.warning_level_ratio:
            self._mark_full(
                f"{_existing(path)} is {ratio:.1f}% used, over diskSpaceWarningLevelRatio "
                f"{self.warning_level_ratio}%; free space there or raise diskSpaceWarningLevelRatio "
                "(up to 100)"
            )
        elif available < self.reserve_bytes:
            self._mark_full(
                f"{_existing(tight)} has {available} bytes free, under the {self.reserve_bytes} the "
                "store keeps for its consume queues and indexes (twice maxMessageSize); free space there"
            )
        elif self.full:
            self.full = False
            self.remark = ""
            log.info("disk space OK again (%.1f%% used of %s): the store takes messages", ratio, path)

    def mark_full(self, err: OSError) -> None:
        """A write ran out of space (:func:`is_disk_full`): refuse puts until a check finds room."""
        self._next_check = self._clock() + CHECK_INTERVAL_S
        where = err.filename or (self.paths[0] if self.paths else "the store")
        self._mark_full(f"writing {where} failed: {err.strerror or err}; free space there")

    def _mark_full(self, why: str) -> None:
        self.remark = f"the broker's disk is full: {why}"
        if not self.full:
            log.error("%s; puts are refused (SERVICE_NOT_AVAILABLE) until there is room", self.remark)
        self.full = True
