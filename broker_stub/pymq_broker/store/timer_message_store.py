"""TimerMessageStore: messages delivered at an exact time (RocketMQ 5's timer), and their recall.

A message whose ``TIMER_DELIVER_MS`` is still ahead is written to
``rmq_sys_wheel_timer`` (one queue) with REAL_TOPIC / REAL_QID, its consume-queue
tag code being its delivery time (:meth:`DefaultMessageStore.resolve_delay`).
This service keeps the timers not yet delivered in a heap by time, delivers each
when it is due to its real queue through the schedule service's writer
(:func:`~.schedule_message_service.message_timeup`, its properties kept, so a v2
client reads back its delivery timestamp), and recalls by its real topic and
message id (the id alone is the sender's choice: any topic may hold it) every timer of them not
delivered yet (a producer's retried send stores one message twice).

RocketMQ keeps a time wheel and a timer log on disk; pymq rebuilds the heap from
the timer topic's consume queue at start. What is done is persisted in
``timerCheckpoint.json``: ``lowWater`` (every timer before it is delivered or
recalled) and the ranges of offsets done after it (:class:`DoneRanges`: as many as
there are gaps of pending timers between them, whatever was delivered). A recall is written (on a
thread) before it is answered, so a recalled message never comes back after a restart; a crash between
a delivery and its checkpoint delivers that message again (at-least-once, as the
ScheduleMessageService). A timer is never delivered early.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import logging
import time
from pathlib import Path
from typing import Any

from pymq_proto.record import HEADER, MessageConst, find_property, split_tail

from ..common.mix_all import TIMER_TOPIC
from .delivery_progress import DeliveryProgress
from .message_store import DefaultMessageStore
from .schedule_message_service import message_timeup

log = logging.getLogger(__name__)

SCAN_BATCH = 4096
# timer records read into the heap per delivery round at most (on the event loop): a start read
# every waiting timer's record in the first round, ~1.3 s per million with every client held;
# the rest is read in the next rounds, within milliseconds (a recall still reads all it needs)
SCAN_ROUND = 4 * SCAN_BATCH
# timers delivered per round at most (one put each, on the event loop): the rest of those due go on in
# the next round, within milliseconds (100,000 timers due at one time held every client for seconds)
DELIVER_BATCH = 1024
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_REAL_TOPIC = MessageConst.PROPERTY_REAL_TOPIC.encode()


class DoneRanges:
    """Timer offsets delivered or recalled at or after the low-water mark, as sorted, disjoint and
    non-adjacent ranges ``[start, end)``: their number is bounded by the gaps of pending timers
    between them, not by what was delivered (a set of offsets grew by every delivery while an older
    timer waited: one timer a day away and a flow of short ones made it grow all day)."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def __contains__(self, at: int) -> bool:
        i = bisect.bisect_right(self.starts, at) - 1
        return i >= 0 and at < self.ends[i]

    def add(self, at: int) -> None:
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, at)  # the first range starting after ``at``
        if i and at < ends[i - 1]:
            return  # done already
        joins_left = i > 0 and ends[i - 1] == at
        joins_right = i < len(starts) and starts[i] == at + 1
        if joins_left and joins_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif joins_left:
            ends[i - 1] = at + 1
        elif joins_right:
            starts[i] = at
        else:
            starts.insert(i, at)
            ends.insert(i, at + 1)

    def past(self, at: int) -> int:
        """``at``, or the end of the range that holds it."""
        i = bisect.bisect_right(self.starts, at) - 1
        return self.ends[i] if i >= 0 and at < self.ends[i] else at

    def next_start(self, at: int) -> int | float:
        """Where the first range after ``at`` starts (infinity when none does)."""
        i = bisect.bisect_right(self.starts, at)
        return self.starts[i] if i < len(self.starts) else float("inf")

    def take_from(self, low_water: int) -> int:
        """The low-water mark past a range that starts at it (that range dropped), or as it is."""
        if self.starts and self.starts[0] <= low_water:
            low_water = max(low_water, self.ends[0])
            del self.starts[0], self.ends[0]
        return low_water

    def pairs(self) -> list[list[int]]:
        return [[s, e] for s, e in zip(self.starts, self.ends, strict=True)]

    @classmethod
    def of(cls, pairs: list[list[int]], offsets: list[int], low_water: int) -> DoneRanges:
        """From a checkpoint's ranges (and offsets, as a checkpoint before ranges had them)."""
        done = cls()
        for start, end in sorted((int(s), int(e)) for s, e in pairs):
            start = max(start, low_water)
            if start >= end:
                continue
            if done.ends and start <= done.ends[-1]:
                done.ends[-1] = max(done.ends[-1], end)
            else:
                done.starts.append(start)
                done.ends.append(end)
        for at in offsets:
            if int(at) >= low_water:
                done.add(int(at))
        return done


class TimerMessageStore(DeliveryProgress):
    """Call :meth:`deliver_due` periodically (it returns seconds until the next timer is due)."""

    COMPACT = True  # written after every delivery round: the C encoder

    def __init__(self, store: DefaultMessageStore, path: Path) -> None:
        super().__init__(store, path)
        self.low_water = 0  # every timer offset below it is delivered or recalled
        self.done = DoneRanges()  # offsets at or after low_water delivered or recalled
        self._scanned = -1  # next consume-queue offset to read into the heap (-1: from low_water)
        self._heap: list[tuple[int, int]] = []  # (delivery time ms, offset)
        # (REAL_TOPIC, message id (UNIQ_KEY)) -> its pending offset, or offsets when several timers
        # carry that id (a producer's retried send stores one message twice: a recall cancels every
        # copy); and back. A list only for a repeated id: one int per timer otherwise
        self._by_id: dict[tuple[str, str], int | list[int]] = {}
        self._id_at: dict[int, tuple[str, str]] = {}
        # (REAL_TOPIC, message id) -> the write of its recall while it runs on its thread: another
        # recall of it is answered only once that cancellation is on disk
        self._recalling: dict[tuple[str, str], asyncio.Future[None]] = {}
        self.delivered = 0

    def encode(self) -> dict[str, Any]:
        # new lists: the snapshot a write on another thread encodes while the ranges change on the loop
        return {"lowWater": self.low_water, "doneRanges": self.done.pairs()}

    def decode(self, data: dict[str, Any]) -> None:
        self.low_water = int(data.get("lowWater", 0))
        # "done": the offsets one by one, as checkpoints written before the ranges hold them
        self.done = DoneRanges.of(data.get("doneRanges", []), data.get("done", []), self.low_water)

    def correct_progress(self) -> bool:
        """As the schedule service's (RocketMQ's ``correctDelayOffset``): progress past the timer
        queue's end goes back to it. A crash that cut the commit log's tail cuts the timer queue too,
        while the checkpoint on disk may count its cut offsets done: the next timers took those
        offsets again and were skipped as delivered, never delivered."""
        cq = self.store.consume_queue(TIMER_TOPIC, 0)
        top = cq.max_offset_in_queue if cq is not None else 0
        if self.low_water <= top and (not self.done.ends or self.done.ends[-1] <= top):
            return False
        done_to = self.done.ends[-1] if self.done.ends else self.low_water
        log.warning("timers: progress (low water %d, done up to %d) is past the timer queue's end %d; "
                    "going on from it", self.low_water, done_to, top)
        self.low_water = min(self.low_water, top)
        kept = DoneRanges()
        for start, end in zip(self.done.starts, self.done.ends, strict=True):
            if start < top:
                kept.starts.append(start)
                kept.ends.append(min(end, top))
        self.done = kept
        self.low_water = self.done.take_from(self.low_water)
        return True

    def pending(self) -> int:
        """How many timers with a message id wait (for stats and tests)."""
        self._scan()
        return len(self._id_at)

    def _scan(self, budget: float = float("inf")) -> bool:
        """Read timers written since the last scan into the heap, about ``budget`` records at most
        (whole batches); whether every one is read."""
        cq = self.store.consume_queue(TIMER_TOPIC, 0)
        if cq is None:
            return True
        offset = max(self.low_water if self._scanned < 0 else self._scanned, cq.min_offset_in_queue)
        read = 0
        while offset < cq.max_offset_in_queue and read < budget:
            # done ranges are not read (a start after one far timer and a million delivered since
            # read every one of their records to find them done)
            offset = self.done.past(offset)
            if offset >= cq.max_offset_in_queue:
                break
            entries = cq.get_entries(offset, int(min(SCAN_BATCH, self.done.next_start(offset) - offset)))
            if not len(entries):
                break
            records = self.store.read_records(entries["phy"], entries["size"])
            pos = 0
            for i, deliver_ms in enumerate(entries["tag"].tolist()):
                h = HEADER.unpack_from(records, pos)
                total, body_len = h[0], h[13]
                at = offset + i
                if not self._is_done(at):
                    _t0, _t1, p0, p1 = split_tail(records, pos, total, body_len)
                    props = records[p0:p1]
                    uniq = find_property(props, _UNIQ)
                    heapq.heappush(self._heap, (int(deliver_ms), at))
                    if uniq:
                        real_topic = find_property(props, _REAL_TOPIC) or b""
                        key = (real_topic.decode("utf-8", "replace"), uniq.decode("utf-8", "replace"))
                        self._index(key, at)
                pos += total
            offset += len(entries)
            read += len(entries)
        self._scanned = offset
        return read < budget or offset >= cq.max_offset_in_queue  # stopped short by the budget alone

    def deliver_due(self, now_ms: int | None = None, *, write: bool = True) -> float:
        """Deliver the timers that are due, at most DELIVER_BATCH; seconds until the next one is due
        (0 while some due wait or timers are left to read (:data:`SCAN_ROUND`), 0.05 when none waits).

        ``write=False``: the progress is left for :meth:`delivered_job` (the controller's, off
        the event loop)."""
        scanned = self._scan(SCAN_ROUND)  # a timer not read yet is due later, never early
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        due: list[int] = []
        while self._heap and self._heap[0][0] <= now_ms and len(due) < DELIVER_BATCH:
            _, at = heapq.heappop(self._heap)
            if not self._is_done(at):
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
                    self.progress_made(write=write)
        while self._heap and self._is_done(self._heap[0][1]):
            heapq.heappop(self._heap)
        if not scanned:
            return 0.0  # the next round reads on at once
        if not self._heap:
            return 0.05
        return max(0.0, (self._heap[0][0] - now_ms) / 1000.0)

    async def recall(self, topic: str, message_id: str) -> bool:
        """Cancel the timers of ``topic`` with ``message_id`` not delivered yet (durably, before
        returning; the write off the event loop); False if there is none. A timer of another topic
        with that message id is none: a caller allowed on one topic must not cancel another's
        (RocketMQ's recall is checked on its topic)."""
        # every waiting timer read (its copies may be anywhere), SCAN_ROUND at a time: the first
        # recall after a start read every one at once on the event loop (~1.3 s per million)
        while not self._scan(SCAN_ROUND):
            await asyncio.sleep(0)
        key = (topic, message_id)
        found = self._by_id.get(key)
        if found is None:
            # a recall of it still writing: answered (not found, as once it is written) only once
            # that cancellation is durable, else a crash meanwhile delivered what this said is gone
            writing = self._recalling.get(key)
            if writing is not None:
                await asyncio.shield(writing)
            return False
        # every copy (list() first: _finish changes it), in the order they were stored
        for at in [found] if isinstance(found, int) else list(found):
            self._finish(at)
        # the store flushed first: this progress also covers the last round's deliveries, whose
        # own write (and flush) may still be running on its thread. On a thread: a flush and an
        # fsync on the event loop held every client of the broker meanwhile. Shielded: a caller
        # cancelled (a client gone) leaves it to end for the recalls that wait for it
        writing = asyncio.ensure_future(self.progress_written())
        self._recalling[key] = writing

        def done(ended: asyncio.Future[None]) -> None:
            if self._recalling.get(key) is writing:
                del self._recalling[key]
            if not ended.cancelled():
                ended.exception()  # its callers were told (or are gone): not "never retrieved"

        writing.add_done_callback(done)
        await asyncio.shield(writing)
        return True

    def _is_done(self, at: int) -> bool:
        """Delivered or recalled: below ``low_water`` (then no longer in ``done``) or in ``done``.

        A heap entry may outlive its offset's place in ``done``: finishing the oldest
        timer moves ``low_water`` past it and drops it from ``done``.
        """
        return at < self.low_water or at in self.done

    def _index(self, key: tuple[str, str], at: int) -> None:
        """A pending timer ``at`` with message id ``key``: its recall finds it, with any other copy."""
        self._id_at[at] = key
        found = self._by_id.get(key)
        if found is None:
            self._by_id[key] = at
        elif isinstance(found, int):
            self._by_id[key] = [found, at]
        else:
            found.append(at)

    def _finish(self, at: int) -> None:
        self.done.add(at)
        key = self._id_at.pop(at, None)
        if key is not None:  # another timer with the same key stays, for a recall
            found = self._by_id[key]
            if isinstance(found, int):
                del self._by_id[key]
            else:
                found.remove(at)
                if len(found) == 1:
                    self._by_id[key] = found[0]
        self.low_water = self.done.take_from(self.low_water)
