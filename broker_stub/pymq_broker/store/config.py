"""MessageStoreConfig: the store's settings, with RocketMQ's names and defaults."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
FLUSH_DISK_TYPES = (ASYNC_FLUSH, SYNC_FLUSH)
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(spec: str) -> list[int]:
    """``messageDelayLevel`` ("1s 5s ... 2h") as milliseconds per level (level 1 first)."""
    if not isinstance(spec, str) or not spec.split():
        raise ValueError(f"messageDelayLevel must be like '1s 5s 10s', got {spec!r}")
    out = []
    for item in spec.split():
        m = _LEVEL.match(item)
        if not m or int(m.group(1)) <= 0:
            raise ValueError(
                f"messageDelayLevel item {item!r} in {spec!r} must be a positive number "
                "with a unit ms, s, m, h or d (e.g. '10s')"
            )
        out.append(int(m.group(1)) * _UNITS_MS[m.group(2)])
    return out


@dataclass
class MessageStoreConfig:
    """Store settings. Sizes in bytes, times in ms unless the name says otherwise."""

    store_path_root_dir: Path = field(default_factory=lambda: Path("store"))
    mapped_file_size_commit_log: int = 256 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    max_message_size: int = 4 * 1024 * 1024
    flush_disk_type: str = ASYNC_FLUSH
    sync_flush_timeout: int = 5_000
    flush_interval_commit_log: int = 500
    flush_interval_consume_queue: int = 1_000
    file_reserved_time: float = 72.0  # hours
    clean_resource_interval: int = 10_000
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    message_index_enable: bool = True
    max_hash_slot_num: int = 1_000_000
    max_index_num: int = 4_000_000
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024 * 1024
    max_transfer_count_on_message_in_disk: int = 100_000
    default_query_max_num: int = 32
    # RocketMQ's accessMessageInMemoryMaxRatio: the newest this percentage of physical memory
    # of the commit log counts as "in memory" (QUERY_CONSUMER_OFFSET's setZeroIfNotFound)
    access_message_in_memory_max_ratio: int = 40
    # RocketMQ's warmMapedFileEnable (there off by default): allocate the commit log's disk
    # blocks ahead of the writer so that appends do not wait for the file system
    # (AllocateMappedFileService); off only costs speed
    warm_mapped_file_enable: bool = True
    # RocketMQ's diskSpaceWarningLevelRatio: above this percentage of its disk used, the store
    # refuses puts with SERVICE_NOT_AVAILABLE until there is room (store/disk_space.py)
    disk_space_warning_level_ratio: int = 90

    def __post_init__(self) -> None:
        self.store_path_root_dir = Path(self.store_path_root_dir)
        if self.flush_disk_type not in FLUSH_DISK_TYPES:
            raise ValueError(
                f"flushDiskType must be one of {FLUSH_DISK_TYPES}, got {self.flush_disk_type!r}"
            )
        if self.max_message_size < 1:
            raise ValueError(f"maxMessageSize must be at least 1 byte, got {self.max_message_size}")
        if self.mapped_file_size_commit_log < 2 * self.max_message_size:
            raise ValueError(
                f"mappedFileSizeCommitLog {self.mapped_file_size_commit_log} must be at least "
                f"twice maxMessageSize ({2 * self.max_message_size})"
            )
        if self.mapped_file_size_consume_queue % 20:
            raise ValueError("mappedFileSizeConsumeQueue must be a multiple of 20 (entry size)")
        if not 0 <= self.access_message_in_memory_max_ratio <= 100:
            raise ValueError(
                "accessMessageInMemoryMaxRatio must be a percentage 0..100, got "
                f"{self.access_message_in_memory_max_ratio}"
            )
        if type(self.disk_space_warning_level_ratio) is not int:
            raise TypeError("diskSpaceWarningLevelRatio must be an int percentage 1..100, got "
                            f"{self.disk_space_warning_level_ratio!r}")
        if not 1 <= self.disk_space_warning_level_ratio <= 100:
            raise ValueError(
                "diskSpaceWarningLevelRatio must be a percentage 1..100 (100: refuse puts only "
                f"when the disk is full), got {self.disk_space_warning_level_ratio}"
            )
        if self.file_reserved_time <= 0:
            raise ValueError(f"fileReservedTime must be > 0 hours, got {self.file_reserved_time}")
        self.delay_levels_ms = parse_delay_levels(self.message_delay_level)

    @property
    def store_path_commit_log(self) -> Path:
        return self.store_path_root_dir / "commitlog"

    @property
    def store_path_consume_queue(self) -> Path:
        return self.store_path_root_dir / "consumequeue"

    @property
    def store_path_index(self) -> Path:
        return self.store_path_root_dir / "index"

    @property
    def store_checkpoint(self) -> Path:
        return self.store_path_root_dir / "checkpoint"

    @property
    def max_delay_level(self) -> int:
        return len(self.delay_levels_ms)
