"""UNIQ_KEY de-duplication window, per topic (off unless a topic sets dedup_window_ms).

Producers keep a message's UNIQ_KEY across retries, and pymq's Spark sink makes
it deterministic per row, so dropping a key seen within the window makes
retried sends and replayed batches idempotent. The window is in memory and
bounded: after a broker restart it starts empty.
"""

from __future__ import annotations

import time

MAX_KEYS_PER_TOPIC = 2_000_000


class DedupWindow:
    def __init__(self) -> None:
        self._seen: dict[str, dict[bytes, int]] = {}

    def seen_recently(self, topic: str, key: bytes, window_ms: int, now_ms: int | None = None) -> bool:
        """True if ``key`` was stored on ``topic`` within ``window_ms``; else records it."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        table = self._seen.setdefault(topic, {})
        # dicts keep insertion order, and insertion times only grow: expire from the front
        while table:
            first = next(iter(table))
            if table[first] > now_ms and len(table) < MAX_KEYS_PER_TOPIC:
                break
            del table[first]
        expires = table.get(key)
        if expires is not None and expires > now_ms:
            return True
        table[key] = now_ms + window_ms
        return False

    def forget_topic(self, topic: str) -> None:
        self._seen.pop(topic, None)
