"""ScheduleMessageService: delivers delayed messages when their level's delay has passed.

A message with delay level L waits in queue L-1 of SCHEDULE_TOPIC_XXXX; its
consume-queue entry holds the delivery time. Each level's queue is in delivery
order, so only its head is ever checked. When the head is due the message is
written again to REAL_TOPIC / REAL_QID with its properties as they were: RocketMQ
clears the delay level on the message object only after its properties string is
made, so the delivered copy keeps DELAY, REAL_TOPIC and REAL_QID (it is written
straight to its queue, not delayed again). Progress per
level is persisted (delayOffset.json) after each delivery round: a restart
neither loses nor skips a delayed message (at-least-once: a crash between a
delivery and its progress write delivers that message again).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    MessageConst,
    find_property,
    split_tail,
)

from ..common.mix_all import SCHEDULE_TOPIC
from .commit_log import MessageToStore
from .delivery_progress import DeliveryProgress
from .encoded_batch import EncodedRecords
from .message_store import DefaultMessageStore
from .results import PutMessageError, PutMessageStatus

log = logging.getLogger(__name__)

DELIVER_BATCH = 4096
RUN_MAX_BYTES = 1024 * 1024
_REAL_TOPIC = MessageConst.PROPERTY_REAL_TOPIC.encode()
_REAL_QID = MessageConst.PROPERTY_REAL_QUEUE_ID.encode()


class ScheduleMessageService(DeliveryProgress):
    """Call :meth:`deliver_due` periodically; it returns seconds until the next due message."""

    def __init__(self, store: DefaultMessageStore, path: Path) -> None:
        super().__init__(store, path)
        self.offset_table: dict[int, int] = {}  # delay level -> next schedule-queue offset
        self.delivered = 0

    def encode(self) -> dict[str, Any]:
        return {"offsetTable": {str(k): v for k, v in sorted(self.offset_table.items())}}

    def decode(self, data: dict[str, Any]) -> None:
        self.offset_table = {int(k): int(v) for k, v in data.get("offsetTable", {}).items()}

    def correct_progress(self) -> bool:
        """As RocketMQ's ``correctDelayOffset``: a level's progress past its queue's end goes back to it.

        A crash that cut the commit log's tail cuts the schedule queues too; the next delayed
        messages take the cut offsets again and would never be delivered.
        """
        moved = False
        for level, offset in sorted(self.offset_table.items()):
            cq = self.store.consume_queue(SCHEDULE_TOPIC, level - 1)
            top = cq.max_offset_in_queue if cq is not None else 0
            if offset > top:
                log.warning("delay level %d: progress %d is past its queue's end %d; going on from %d",
                            level, offset, top, top)
                self.offset_table[level] = top
                moved = True
        return moved

    def deliver_due(self, now_ms: int | None = None, *, write: bool = True) -> float:
        """Deliver every due message of every level; seconds until the next one is due.

        Raises PutMessageError when the store refuses a delivery for now (its progress, up to
        the last message written, is kept). ``write=False``: the progress is left for
        :meth:`delivered_job` (the controller's, off the event loop).
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        next_due: int | None = None
        before = self.delivered
        try:
            for level in range(1, self.store.config.max_delay_level + 1):
                due = self._deliver_level(level, now_ms)
                if due is not None:
                    next_due = due if next_due is None else min(next_due, due)
        finally:
            if self.delivered != before:
                self.progress_made(write=write)
        if next_due is None:
            return 0.05
        return max(0.0, (next_due - now_ms) / 1000.0)

    def _deliver_level(self, level: int, now_ms: int) -> int | None:
        """Deliver the due head of one level: the next due time, None if drained."""
        cq = self.store.consume_queue(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return None
        offset = max(self.offset_table.get(level, 0), cq.min_offset_in_queue)
        if offset >= cq.max_offset_in_queue:
            return None
        entries = cq.get_entries(offset, DELIVER_BATCH)
        tags = entries["tag"]
        not_due = np.flatnonzero(tags > now_ms)
        due = int(not_due[0]) if len(not_due) else len(entries)
        if due:
            records = self.store.read_records(entries["phy"][:due], entries["size"][:due])
            try:
                message_timeup(self.store, records)
            except PutMessageError as err:  # those written are done: never delivered twice
                self._delivered(level, offset + err.written, err.written)
                raise
            self._delivered(level, offset + due, due)
        if due < len(entries):
            return int(tags[due])
        return now_ms if len(entries) == DELIVER_BATCH else None

    def _delivered(self, level: int, next_offset: int, count: int) -> None:
        self.offset_table[level] = next_offset
        self.delivered += count


def message_timeup(store: DefaultMessageStore, records: bytes) -> None:
    """Write each record again to its REAL_TOPIC / REAL_QID, its properties kept (delayed and timer
    messages alike; consecutive ones for one queue share a write).

    Raises PutMessageError when the store refuses a write for now; its ``written`` says how many
    records (a prefix) were written before it.
    """
    pos = 0
    run: list[MessageToStore] = []
    run_key: tuple[str, int] | None = None
    run_bytes = 0
    written = 0
    while pos < len(records):
        h = HEADER.unpack_from(records, pos)
        total, flag, born, reconsume, sys_flag, body_len = h[0], h[4], h[8], h[11], h[7], h[13]
        _t0, _t1, p0, p1 = split_tail(records, pos, total, body_len)
        props = records[p0:p1]
        real_topic = (find_property(props, _REAL_TOPIC) or b"").decode()
        real_qid = int(find_property(props, _REAL_QID) or 0)
        body = records[pos + HEADER_SIZE : pos + HEADER_SIZE + body_len]
        key = (real_topic, real_qid)
        if run and (key != run_key or run_bytes + body_len > RUN_MAX_BYTES):
            _put(store, run_key, run, written)
            written += len(run)
            run, run_bytes = [], 0
        run_bytes += body_len
        run_key = key
        run.append(MessageToStore(body, flag, props, born, reconsume, sys_flag))
        pos += total
    if run:
        _put(store, run_key, run, written)


def _put(
    store: DefaultMessageStore, key: tuple[str, int] | None, run: list[MessageToStore], written: int
) -> None:
    assert key is not None
    topic, qid = key
    if not topic:
        log.error("delayed message without REAL_TOPIC dropped")
        return
    # put_records: the DELAY or TIMER_DELIVER_MS they keep must not delay them again
    result = store.put_records(topic, qid, EncodedRecords.from_messages(topic, run))
    if result.status == PutMessageStatus.SERVICE_NOT_AVAILABLE:  # for now (a full disk): they wait
        raise PutMessageError(result, f"delivering {len(run)} delayed message(s) to {topic}", written)
    if not result.ok:  # never storable (over a lowered maxMessageSize, say): waiting would stall the level
        log.error("delivering %d delayed message(s) to %s failed, dropped: %s",
                  len(run), topic, result.remark)
