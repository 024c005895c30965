"""TimerMessageStore: messages delivered at an exact time (RocketMQ 5's timer), and their recall.

A message whose ``TIMER_DELIVER_MS`` is still ahead is written to
``rmq_sys_wheel_timer`` (one queue) with REAL_TOPIC / REAL_QID, its consume-queue
tag code being its delivery time (:meth:`DefaultMessageStore.resolve_delay`).
This service keeps the timers not yet delivered in a heap by time, delivers each
when it is due to its real queue through the schedule service's writer
(:func:`~.schedule_message_service.message_timeup`, its properties kept, so a v2
client reads back its delivery timestamp), and recalls one by its message id.

RocketMQ keeps a time wheel and a timer log on disk; pymq rebuilds the heap from
the timer topic's consume queue at start. What is done is persisted in
``timerCheckpoint.json``: ``lowWater`` (every timer before it is delivered or
recalled) and the offsets done after it. A recall is written before it is
answered, so a recalled message never comes back after a restart; a crash between
a delivery and its checkpoint delivers that message again (at-least-once, as the
ScheduleMessageService). A timer is never delivered early.
"""

from __future__ import annotations

import heapq
import logging
import time
from pathlib import Path
from typing import Any

from pymq_proto.record import HEADER, MessageConst, find_property, split_tail

from ..common.config_manager import ConfigManager
from ..common.mix_all import TIMER_TOPIC
from .config import SYNC_FLUSH
from .message_store import DefaultMessageStore
from .schedule_message_service import message_timeup

log = logging.getLogger(__name__)

SCAN_BATCH = 4096
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()


class TimerMessageStore(ConfigManager):
    """Call :meth:`deliver_due` periodically (it returns seconds until the next timer is due)."""

    def __init__(self, store: DefaultMessageStore, path: Path) -> None:
        super().__init__(path)
        self.store = store
        self.low_water = 0  # every timer offset below it is delivered or recalled
        self.done: set[int] = set()  # offsets at or after low_water delivered or recalled
        self._scanned = -1  # next consume-queue offset to read into the heap (-1: from low_water)
        self._heap: list[tuple[int, int]] = []  # (delivery time ms, offset)
        self._by_id: dict[str, int] = {}  # message id (UNIQ_KEY) -> offset, while pending
        self._id_at: dict[int, str] = {}  # and back
        self.delivered = 0

    def encode(self) -> dict[str, Any]:
        return {"lowWater": self.low_water, "done": sorted(self.done)}

    def decode(self, data: dict[str, Any]) -> None:
        self.low_water = int(data.get("lowWater", 0))
        self.done = {int(o) for o in data.get("done", []) if int(o) >= self.low_water}

    def pending(self) -> int:
        """How many timers wait (for stats and tests)."""
        self._scan()
        return len(self._by_id)

    def _scan(self) -> None:
        """Read timers written since the last scan into the heap."""
        cq = self.store.consume_queue(TIMER_TOPIC, 0)
        if cq is None:
            return
        offset = max(self.low_water if self._scanned < 0 else self._scanned, cq.min_offset_in_queue)
        while offset < cq.max_offset_in_queue:
            entries = cq.get_entries(offset, SCAN_BATCH)
            if not len(entries):
                break
            records = self.store.read_records(entries["phy"], entries["size"])
            pos = 0
            for i, deliver_ms in enumerate(entries["tag"].tolist()):
                h = HEADER.unpack_from(records, pos)
                total, body_len = h[0], h[13]
                at = offset + i
                if at not in self.done:
                    _t0, _t1, p0, p1 = split_tail(records, pos, total, body_len)
                    uniq = find_property(records[p0:p1], _UNIQ)
                    heapq.heappush(self._heap, (int(deliver_ms), at))
                    if uniq:
                        key = uniq.decode("utf-8", "replace")
                        self._by_id[key] = at
                        self._id_at[at] = key
                pos += total
            offset += len(entries)
        self._scanned = offset

    def deliver_due(self, now_ms: int | None = None) -> float:
        """Deliver every timer that is due; seconds until the next one (0.05 when none waits)."""
        self._scan()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        due: list[int] = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, at = heapq.heappop(self._heap)
            if at not in self.done:
                due.append(at)
        if due:
            cq = self.store.consume_queue(TIMER_TOPIC, 0)
            assert cq is not None  # its entries were read when they were scheduled
            due.sort()
            finished = 0
            try:
                for at in due:
                    entry = cq.get_entries(at, 1)
                    if len(entry):
                        message_timeup(self.store, self.store.read_records(entry["phy"], entry["size"]))
                    self._finish(at)
                    finished += 1
            except Exception:  # not delivered (a full disk): they wait in the heap for the next round
                for again in due[finished:]:
                    heapq.heappush(self._heap, (now_ms, again))
                raise
            finally:
                if finished:
                    self.delivered += finished
                    if self.store.config.flush_disk_type == SYNC_FLUSH:
                        self.store.commit_log.flush()
                    self.persist()
        while self._heap and self._heap[0][1] in self.done:
            heapq.heappop(self._heap)
        if not self._heap:
            return 0.05
        return max(0.0, (self._heap[0][0] - now_ms) / 1000.0)

    def recall(self, message_id: str) -> bool:
        """Cancel a timer not delivered yet (durably, before returning); False if there is none."""
        self._scan()
        at = self._by_id.get(message_id)
        if at is None or at in self.done:
            return False
        self._finish(at)
        self.persist()
        return True

    def _finish(self, at: int) -> None:
        self.done.add(at)
        key = self._id_at.pop(at, None)
        if key is not None:
            self._by_id.pop(key, None)
        while self.low_water in self.done:
            self.done.discard(self.low_water)
            self.low_water += 1
