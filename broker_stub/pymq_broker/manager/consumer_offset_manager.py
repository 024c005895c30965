"""ConsumerOffsetManager: each group's progress per MessageQueue.

Kept in memory, persisted atomically every ``flush_interval`` and at shutdown
(RocketMQ persists every 5 s). Keys are RocketMQ's ``topic@group`` and queue id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.config_manager import ConfigManager

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(ConfigManager):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.offset_table: dict[str, dict[int, int]] = {}
        self.dirty = False

    def encode(self) -> dict[str, Any]:
        return {"offsetTable": {k: {str(q): o for q, o in v.items()} for k, v in self.offset_table.items()}}

    def decode(self, data: dict[str, Any]) -> None:
        self.offset_table = {
            k: {int(q): int(o) for q, o in v.items()} for k, v in data.get("offsetTable", {}).items()
        }

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offset_table.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})[queue_id] = offset
        self.dirty = True

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's next offset on the queue, or -1 when it has none."""
        return self.offset_table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {}).get(queue_id, -1)

    def query_group(self, group: str) -> dict[str, dict[int, int]]:
        """topic -> {queue id: offset} for ``group``."""
        out: dict[str, dict[int, int]] = {}
        for key, queues in self.offset_table.items():
            topic, _, g = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if g == group:
                out[topic] = dict(queues)
        return out

    def groups_of_topic(self, topic: str) -> set[str]:
        """The groups with progress on ``topic``."""
        keys = (k.rpartition(TOPIC_GROUP_SEPARATOR) for k in self.offset_table)
        return {g for t, _, g in keys if t == topic}

    def groups(self) -> set[str]:
        return {k.rpartition(TOPIC_GROUP_SEPARATOR)[2] for k in self.offset_table}

    def remove_topic(self, topic: str) -> None:
        for key in [k for k in self.offset_table if k.rpartition(TOPIC_GROUP_SEPARATOR)[0] == topic]:
            del self.offset_table[key]
        self.dirty = True

    def persist_if_dirty(self) -> None:
        if self.dirty:
            self.dirty = False
            self.persist()
