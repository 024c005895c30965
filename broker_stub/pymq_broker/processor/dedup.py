"""UNIQ_KEY de-duplication window, per topic (off unless a topic sets dedup_window_ms).

Producers keep a message's UNIQ_KEY across retries, and pymq's Spark sink makes
it deterministic per row, so dropping a key seen within the window makes
retried sends and replayed batches idempotent. The window is in memory and
bounded; a restarted broker refills it from the messages stored within each
topic's window (:meth:`DedupWindow.recover`), so a batch replayed after a
broker crash is still dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from pymq_proto.record import BODYLEN, HEADER, STORETIMESTAMP, MessageConst, find_property, split_tail

from ..store.consume_queue import ConsumeQueue
from ..store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()

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

    def recover(self, store: DefaultMessageStore, windows: Iterable[tuple[str, int]],
                now_ms: int | None = None) -> int:
        """Refill the window of each (topic, window_ms) from its messages stored within it.

        Reads each queue backwards from its end until a message is older than the
        window; returns the number of keys remembered.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        total = 0
        for topic, window_ms in windows:
            recent: list[tuple[int, bytes]] = []
            for cq in store.consume_queue_table.get(topic, {}).values():
                recent.extend(_recent_keys(store, cq, now_ms - window_ms, MAX_KEYS_PER_TOPIC))
            recent.sort()
            table = self._seen.setdefault(topic, {})
            for stored, key in recent[-MAX_KEYS_PER_TOPIC:]:
                table.pop(key, None)  # keep insertion order = expiry order
                table[key] = stored + window_ms
            total += len(table)
            if table:
                log.info("dedup window of %s: %d key(s) recovered", topic, len(table))
        return total

    def forget(self, topic: str, keys: Iterable[bytes]) -> None:
        """``keys`` were not stored after all (the put was refused): a retry must not be dropped."""
        table = self._seen.get(topic)
        if table:
            for key in keys:
                table.pop(key, None)

    def forget_topic(self, topic: str) -> None:
        self._seen.pop(topic, None)


def _recent_keys(
    store: DefaultMessageStore, cq: ConsumeQueue, since_ms: int, limit: int
) -> list[tuple[int, bytes]]:
    """(store timestamp, UNIQ_KEY) of a queue's messages stored at or after ``since_ms``, oldest first."""
    out: list[tuple[int, bytes]] = []
    end = cq.max_offset_in_queue
    step = 4096
    while end > cq.min_offset_in_queue and len(out) < limit:
        start = max(cq.min_offset_in_queue, end - step)
        entries = cq.get_entries(start, end - start)
        for rec in reversed(store.look_messages_by_offsets(entries["phy"].tolist())):
            if rec is None:
                continue
            h = HEADER.unpack_from(rec)
            if h[STORETIMESTAMP] < since_ms:
                return out[::-1]
            _t0, _t1, p0, p1 = split_tail(rec, 0, h[0], h[BODYLEN])
            key = find_property(rec[p0:p1], _UNIQ)
            if key:
                out.append((h[STORETIMESTAMP], key))
        end = start
    return out[::-1]
