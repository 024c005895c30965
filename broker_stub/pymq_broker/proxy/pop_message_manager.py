"""PopMessageManager: receive, ack and change invisible duration (RocketMQ's pop consumption).

A v2 consumer does not keep offsets: the broker hands it messages and hides
each one for its *invisible duration*. An ack within that time consumes the
message; otherwise it becomes visible again and is delivered anew with
``delivery_attempt`` + 1. A message that is not acked after the group's
max delivery attempts (retryMaxTimes + 1) goes to ``%DLQ%<group>`` (the
caller's job: see :meth:`due`).

The bookkeeping, per (group, topic, queue):

- ``next_offset``: the next queue offset never handed out;
- ``pending``: messages handed out and not acked, by queue offset;
- the group's committed offset (ConsumerOffsetManager) is the lowest pending
  offset, or ``next_offset`` when none is pending: what a restart starts from.

What differs from RocketMQ: invisibility is indexed in memory (RocketMQ writes
checkpoints and acks to ``rmq_sys_REVIVE_LOG``). What a restart needs of it is on
disk: :class:`DeliveryAttempts` (``popDeliveryAttempts.json``, written by the
broker within a second of a change and at shutdown) keeps each pending message
(its delivery attempts, receipt handle, invisible time and auto-renew owner) and
each queue's ``next_offset``. A restart reads from the committed offset again, and
below the stored ``next_offset`` delivers no message as new: the others were acked
(or filtered out), and the pending ones are in flight again as they were: hidden
until their invisible time, acked by the receipt handles their consumers hold
(RocketMQ's handles stay valid across a restart too), then delivered again with
their attempts counted on, so a message that makes its consumers crash still
reaches the DLQ. A kill -9 forgets what changed in its last second: a message acked
or received then is delivered again, a handle given then (a change of invisible
duration) is refused and the message's earlier invisible time stands (at-least-once,
nothing lost); a clean shutdown forgets nothing. Redelivery
re-reads the original record; RocketMQ writes a copy to ``%RETRY%<group>`` first.

Receipt handles are opaque strings; a handle that is unknown, already acked,
replaced (by a change of invisible duration or a redelivery) or past its
invisible time is refused with INVALID_RECEIPT_HANDLE.

FIFO groups (``consumeMessageOrderly``, RocketMQ's orderly pop): a queue with a
message in flight for the group is held: nothing new is popped from it until every
message handed out from it is acked or dead-lettered, and a message whose invisible
time passes is delivered again before anything after it, and only while nothing else of
its queue is in flight (the orderly pop re-reads a queue from its first unacked offset).
pymq sends a FIFO message group to one queue, so each message group is consumed in order.

Auto renew (a push consumer's receive): the message stays invisible while the
client that received it is connected (``renewable``), as the proxy renews its
receipt handles, up to ``max_renew_ms`` after the delivery: each renewal hides it
for longer (:data:`RENEW_NEXT_MS`, RocketMQ's RenewStrategyPolicy). A client that
unregisters (NotifyClientTermination) has its messages visible again within a second
(:meth:`PopMessageManager.clear_owner`, as DefaultReceiptHandleManager.clearGroup changes
their invisible time to invisibleTimeMillisWhenClear); one whose Telemetry streams all close
is no longer renewed and leaves them to their invisible time (it may reconnect at once and
ack them, as RocketMQ clears a channel's handles only once it expires).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymq_proto.rocketmq_v2 import definition_pb2 as v2

from ..common.config_manager import ConfigManager
from ..manager.consumer_offset_manager import ConsumerOffsetManager
from ..store.message_store import DefaultMessageStore
from ..store.results import GetMessageStatus
from .message_converter import StoredMessage, split_records
from .status import ProxyException

# RocketMQ's RenewStrategyPolicy (the proxy's RENEW_POLICY): renewal N of an auto-renewed message hides
# it for entry N (the last one from then on): a client that holds a message long is asked less often
RENEW_NEXT_MS: tuple[int, ...] = tuple(m * 60_000 for m in (1, 3, 5, 10, 30, 60))


@dataclass(slots=True)
class InFlight:
    """A message handed out and not acked yet; ``invisible_until`` is ms since the epoch."""

    handle: str
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    delivery_attempt: int
    invisible_until: int
    invisible_ms: int
    owner: str = ""  # a push consumer's client id (auto renew): renewed while that client is connected
    delivered_at: int = 0
    renew_times: int = 0
    # its queue's offset was reset while it was in flight: nothing of it may touch the new state
    # (a due message taken by a receive that awaits a DLQ write when the reset comes)
    forgotten: bool = False


@dataclass(slots=True)
class _QueueState:
    next_offset: int
    pending: dict[int, InFlight] = field(default_factory=dict)
    # after a restart: below ``done_below`` (the stored next offset) only the offsets of ``redo``
    # (pending then, sorted) are delivered; the others were acked before it
    done_below: int = 0
    redo: list[int] = field(default_factory=list)

    def skip_done(self) -> None:
        """Move ``next_offset`` past the offsets acked before a restart (up to the next one to redo)."""
        if self.next_offset >= self.done_below:
            self.done_below, self.redo = 0, []
            return
        later = bisect.bisect_left(self.redo, self.next_offset)
        self.next_offset = self.redo[later] if later < len(self.redo) else self.done_below

    def done(self, queue_offset: int) -> bool:
        """Acked before a restart: not delivered again."""
        if queue_offset >= self.done_below:
            return False
        i = bisect.bisect_left(self.redo, queue_offset)
        return i == len(self.redo) or self.redo[i] != queue_offset


class DeliveryAttempts(ConfigManager):
    """What a restart needs of the pop state, persisted: each message handed out and not yet
    acked (how often it was delivered, and how it is in flight), and where each queue's next
    new message is.

    ``{"deliveryAttempts": {"group@topic": {"queueId:queueOffset": [attempts, commitLogOffset,
    receiptHandle, invisibleUntil, invisibleMs, owner, deliveredAt, renewTimes]}},
    "nextOffsets": {"group@topic": {"queueId": nextOffset}}}`` (an entry of a file written
    before the in-flight fields is the attempts alone: that message is delivered again at once,
    as it was then); an attempts entry goes
    when its message is acked or dead-lettered, so its keys are the pending messages,
    and with the next offset they tell which messages above the committed offset were
    acked (RocketMQ's pop checkpoints and acks). One document, so one snapshot holds
    both as they were together. ``path`` None: kept in memory only.
    A change only marks it dirty: the controller writes it every ``persist_interval_s``
    when dirty (a write on each change was skipped within a second of the last one,
    and nothing wrote it later: a crash after any idle time lost the change).
    """

    COMPACT = True  # 100k messages in flight: ~15 MB a second, 1.2 s of the event loop indented

    def __init__(self, path: Path | None, persist_interval_s: float = 1.0) -> None:
        super().__init__(path or Path("/dev/null"))
        self.enabled = path is not None
        self.table: dict[str, dict[str, int | list[Any]]] = {}
        self.next_offsets: dict[str, dict[str, int]] = {}
        self.persist_interval_s = persist_interval_s

    def load(self) -> None:
        if self.enabled:  # kept in memory only: nothing to read
            super().load()

    def encode(self) -> dict[str, Any]:
        return {"deliveryAttempts": self.table, "nextOffsets": self.next_offsets}

    def decode(self, data: dict[str, Any]) -> None:
        stored = data.get("deliveryAttempts", {})
        self.table = {k: {q: n if isinstance(n, list) else int(n) for q, n in v.items()}
                      for k, v in stored.items()}
        offsets = data.get("nextOffsets", {})
        self.next_offsets = {k: {q: int(n) for q, n in v.items()} for k, v in offsets.items()}

    def next_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The queue's next offset never handed out, as stored; -1 if none is."""
        return self.next_offsets.get(f"{group}@{topic}", {}).get(str(queue_id), -1)

    def set_next_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        entries = self.next_offsets.setdefault(f"{group}@{topic}", {})
        if entries.get(str(queue_id)) != offset:
            entries[str(queue_id)] = offset
            self.dirty = True

    def pending_offsets(self, group: str, topic: str, queue_id: int) -> list[int]:
        """The queue offsets of the messages of the queue pending (as stored), sorted."""
        prefix = f"{queue_id}:"
        entries = self.table.get(f"{group}@{topic}", {})
        return sorted(int(k[len(prefix):]) for k in entries if k.startswith(prefix))

    def bound_next_offsets(self, max_offset: Callable[[str, int], int]) -> None:
        """No stored next offset or pending message past its queue's end: messages lost in a crash
        (an async flush, the OS gone) are not in the store, and new ones written at their offsets
        must neither pass for acked nor be skipped to a pending offset past them, nor inherit
        the lost ones' delivery attempts."""
        for group_topic, entries in self.next_offsets.items():
            topic = group_topic.rpartition("@")[2]
            for queue, offset in entries.items():
                entries[queue] = min(offset, max_offset(topic, int(queue)))
        for group_topic, attempts in self.table.items():
            topic = group_topic.rpartition("@")[2]
            ends: dict[str, int] = {}
            for key in list(attempts):
                queue, _, queue_offset = key.partition(":")
                if queue not in ends:
                    ends[queue] = max_offset(topic, int(queue))
                if int(queue_offset) >= ends[queue]:
                    del attempts[key]
                    self.dirty = True

    def forget_below(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Drop the stored attempts of the queue's messages below ``offset``, which a restart's
        read passed without delivering (a committed offset moved past them, expired from the
        store): nothing acks them any more, and the file must not keep them for ever."""
        entries = self.table.get(f"{group}@{topic}")
        if not entries:
            return
        prefix = f"{queue_id}:"
        stale = [k for k in entries if k.startswith(prefix) and int(k[len(prefix):]) < offset]
        for key in stale:
            del entries[key]
        if stale:
            if not entries:
                del self.table[f"{group}@{topic}"]
            self.dirty = True

    def forget_queue(self, group: str, topic: str, queue_id: int) -> None:
        """Drop what is stored of the group's reading of one queue (its offset was reset): its next
        offset would make the messages below it pass for acked, its attempts would count on."""
        group_topic, prefix = f"{group}@{topic}", f"{queue_id}:"
        entries = self.table.get(group_topic, {})
        for key in [k for k in entries if k.startswith(prefix)]:
            del entries[key]
            self.dirty = True
        if group_topic in self.table and not entries:
            del self.table[group_topic]
        if self.next_offsets.get(group_topic, {}).pop(str(queue_id), None) is not None:
            self.dirty = True
            if not self.next_offsets[group_topic]:
                del self.next_offsets[group_topic]

    def get(self, inflight: InFlight) -> int:
        entry = self.table.get(f"{inflight.group}@{inflight.topic}", {}).get(_key(inflight), 0)
        if isinstance(entry, list):
            return int(entry[0]) if entry and isinstance(entry[0], int) else 1
        return entry

    def set(self, inflight: InFlight) -> None:
        """Keep a pending message as it is in flight now (after each change of its handle or time)."""
        entries = self.table.setdefault(f"{inflight.group}@{inflight.topic}", {})
        entries[_key(inflight)] = [
            inflight.delivery_attempt, inflight.commit_log_offset, inflight.handle, inflight.invisible_until,
            inflight.invisible_ms, inflight.owner, inflight.delivered_at, inflight.renew_times,
        ]
        self.dirty = True

    def in_flight(self, group: str, topic: str, queue_id: int, offsets: Iterable[int]) -> dict[int, InFlight]:
        """Those of the queue's pending messages at ``offsets`` stored with their in-flight state, by
        queue offset (those of an older file, attempts alone, are not among them)."""
        entries = self.table.get(f"{group}@{topic}", {})
        out: dict[int, InFlight] = {}
        for offset in offsets:
            entry = entries.get(f"{queue_id}:{offset}")
            if not isinstance(entry, list):
                continue
            try:
                attempts, phy, handle, until, invisible_ms, owner, delivered_at, renew_times = entry
                if not isinstance(handle, str) or not handle:
                    continue
                out[offset] = InFlight(
                    handle, group, topic, queue_id, offset, int(phy), int(attempts), int(until),
                    int(invisible_ms), str(owner), int(delivered_at), int(renew_times),
                )
            except (TypeError, ValueError, OverflowError):  # not as written here: delivered again at once
                continue
        return out

    def queues(self) -> list[tuple[str, str, int]]:
        """(group, topic, queue id) of every stored pending message, sorted."""
        found: dict[tuple[str, str, int], None] = {}
        for group_topic, entries in self.table.items():
            group, _, topic = group_topic.rpartition("@")
            found.update(((group, topic, int(key.partition(":")[0])), None) for key in entries)
        return sorted(found)

    def drop(self, inflight: InFlight) -> None:
        group_topic = f"{inflight.group}@{inflight.topic}"
        entries = self.table.get(group_topic)
        if entries is not None and entries.pop(_key(inflight), None) is not None:
            if not entries:
                del self.table[group_topic]
            self.dirty = True

    def remove_topic(self, topic: str) -> None:
        """Forget a deleted topic's attempts, on disk too: a message of the topic created again
        at the same queue offset is a first delivery."""
        stale = False
        for table in (self.table, self.next_offsets):
            for key in [k for k in table if k.rpartition("@")[2] == topic]:
                del table[key]
                stale = True
        if stale and self.enabled:
            self.persist()

    def flush(self) -> None:
        """Write the attempts at shutdown (whether changed or not: a cancelled periodic write may
        still run on its thread; this newer one makes it a no-op)."""
        if self.enabled:
            self.persist()


def _key(inflight: InFlight) -> str:
    return f"{inflight.queue_id}:{inflight.queue_offset}"


@dataclass(frozen=True, slots=True)
class Popped:
    """One message of a receive: the stored record and its in-flight entry."""

    message: StoredMessage
    inflight: InFlight


class PopMessageManager:
    """In-flight messages of every v2 consumer group of this broker (see the module's docstring)."""

    def __init__(
        self, store: DefaultMessageStore, offsets: ConsumerOffsetManager,
        renewable: Callable[[str], bool] | None = None, max_renew_ms: int = 3 * 3600 * 1000,
        attempts: DeliveryAttempts | None = None,
    ) -> None:
        self.store = store
        self.offsets = offsets
        self.attempts = attempts or DeliveryAttempts(None)
        self.attempts.bound_next_offsets(store.get_max_offset_in_queue)
        self.renewable = renewable or (lambda _client_id: False)
        self.max_renew_ms = max_renew_ms
        self._queues: dict[tuple[str, str, int], _QueueState] = {}
        self._handles: dict[str, InFlight] = {}
        self._expiry: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
        self._seq = itertools.count()
        self._run = secrets.token_hex(4)  # a new run's handles never repeat an earlier run's
        for group, topic, queue_id in self.attempts.queues():
            # in flight again at once: a consumer may ack with its handle before the queue is read
            self._state(group, topic, queue_id)

    # -- new messages ---------------------------------------------------------------------------
    def _state(self, group: str, topic: str, queue_id: int) -> _QueueState:
        key = (group, topic, queue_id)
        state = self._queues.get(key)
        if state is None:
            stored_next = self.attempts.next_offset(group, topic, queue_id)  # -1: none (not read before)
            redo = [o for o in self.attempts.pending_offsets(group, topic, queue_id) if o < stored_next]
            start = self._start_offset(group, topic, queue_id, stored_next, redo)
            state = self._queues[key] = _QueueState(start)
            if stored_next > state.next_offset:  # a restart: what was acked above the committed offset
                restored = self.attempts.in_flight(group, topic, queue_id, redo)
                for offset in redo:
                    inflight = restored.get(offset)
                    # in flight as before the restart (a handle seen twice only in a damaged file)
                    if inflight is not None and offset >= start and inflight.handle not in self._handles:
                        state.pending[offset] = inflight
                        self._track(inflight)
                # below the stored next offset, only what was pending without its in-flight state
                # (an older file's) is read again as new
                state.done_below = stored_next
                state.redo = [o for o in redo if o not in state.pending]
            # pending before a restart below where the read starts (the group committed past them):
            # never read, so never acked
            self.attempts.forget_below(group, topic, queue_id, state.next_offset)
        return state

    def _start_offset(self, group: str, topic: str, queue_id: int, stored_next: int, redo: list[int]) -> int:
        """The committed offset; for a new group RocketMQ pop's init mode MAX, except that a young
        queue whose first message is still in memory is read from 0 (initPopOffsetByCheckMsgInMem).

        A group read before a restart (``stored_next``) whose offset was not written yet (the two
        files are written apart: a kill -9 between them) starts at its first pending message
        (``redo``), or where it had got to: not at the queue's end, past messages it never acked."""
        committed = self.offsets.query_offset(group, topic, queue_id)
        min_offset = self.store.get_min_offset_in_queue(topic, queue_id)
        if committed < 0 and stored_next >= 0:
            committed = min(redo, default=stored_next)
        if committed >= 0:
            return max(committed, min_offset)
        store = self.store
        if (min_offset <= 0
                and store.check_in_mem_by_consume_offset(topic, queue_id, 0)):
            return 0
        return store.get_max_offset_in_queue(topic, queue_id)

    def next_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Where the next receive reads the queue (for long polling)."""
        return self._state(group, topic, queue_id).next_offset

    def pop_new(
        self, group: str, topic: str, queue_id: int, max_nums: int, invisible_ms: int, now_ms: int,
        tag_hashes: frozenset[int] | None = None, tags: frozenset[str] | None = None,
        property_filter: Callable[[bytes], bool] | None = None, owner: str = "", fifo: bool = False,
    ) -> list[Popped]:
        """Up to ``max_nums`` messages of one queue never handed out, now invisible.

        Messages the filter skips are consumed as they are passed (RocketMQ's
        pop acks them too); ``tags`` re-checks what the tag hash let through.
        ``owner``: the client id of an auto-renewing receive. ``fifo``: none while
        a message of the queue is in flight for the group (the queue is held).
        """
        state = self._state(group, topic, queue_id)
        if fifo and state.pending:
            return []
        redoing = state.done_below
        state.skip_done()
        min_offset = self.store.get_min_offset_in_queue(topic, queue_id)
        if state.next_offset < min_offset:  # expired from the store meanwhile
            state.next_offset = min_offset
        if redoing:  # what a restart's read passes without delivering is never acked: forget it
            self.attempts.forget_below(group, topic, queue_id, min(
                [state.next_offset, *(f.queue_offset for f in state.pending.values())]))
        result = self.store.get_message(
            topic, queue_id, state.next_offset, max_nums, 0, tag_hashes, property_filter
        )
        if result.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
            if result.status == GetMessageStatus.OFFSET_OVERFLOW_BADLY:
                state.next_offset = result.max_offset
                self._store_next_offset(state, group, topic, queue_id)
            return []
        out = []
        for m in split_records(result.records):
            if (tags is not None and m.tag not in tags) or state.done(m.queue_offset):
                continue
            inflight = InFlight(
                self._new_handle(), group, topic, queue_id, m.queue_offset, m.commit_log_offset,
                m.reconsume_times + 1, now_ms + invisible_ms, invisible_ms, owner, now_ms,
            )
            before = self.attempts.get(inflight)  # delivered before a restart
            if before:
                inflight.delivery_attempt = max(inflight.delivery_attempt, before + 1)
            self.attempts.set(inflight)
            state.pending[m.queue_offset] = inflight
            self._track(inflight)
            out.append(Popped(m, inflight))
        state.next_offset = max(state.next_offset, result.next_begin_offset)
        self._store_next_offset(state, group, topic, queue_id)
        self._commit(state, group, topic, queue_id)
        return out

    def _store_next_offset(self, state: _QueueState, group: str, topic: str, queue_id: int) -> None:
        """Persist where the queue's new messages begin. While a restart's re-read is below the
        stored one, that stays: the messages acked before the restart are still told by it (a
        second restart would deliver them again), and the ones to re-read are still pending."""
        self.attempts.set_next_offset(group, topic, queue_id, max(state.next_offset, state.done_below))

    # -- redelivery -----------------------------------------------------------------------------
    def due(self, group: str, topic: str, now_ms: int, limit: int, fifo: bool = False) -> list[InFlight]:
        """Up to ``limit`` in-flight messages whose invisible time has passed, oldest first.

        They stay pending: the caller redelivers each (:meth:`redeliver`) or,
        past the group's max delivery attempts, dead-letters it and calls
        :meth:`remove`; one it does not get to goes back with :meth:`put_back`
        (else it would never be due again: the expiry heap and the handles no
        longer know it). ``fifo`` (an orderly group): a queue's due messages come
        only when none of its messages is in flight, lowest queue offset first,
        as the orderly pop hands a queue out from its first unacked offset.
        """
        heap = self._expiry.get((group, topic))
        out: list[InFlight] = []
        ready: dict[int, list[InFlight]] = {}  # fifo: due messages by queue id
        while heap and heap[0][0] <= now_ms and (fifo or len(out) < limit):
            _, _, handle = heapq.heappop(heap)
            inflight = self._handles.get(handle)
            if inflight is None or inflight.invisible_until > now_ms:  # done, or a later entry stands
                continue
            if self._renew(inflight, now_ms):
                continue
            if fifo:  # every due one of the group: a queue's lowest offset may be due last
                ready.setdefault(inflight.queue_id, []).append(inflight)
                continue
            del self._handles[handle]
            out.append(inflight)
        for queue_id, entries in ready.items():
            out.extend(self._fifo_due(group, topic, queue_id, entries, now_ms, limit - len(out)))
        return out

    def _fifo_due(
        self, group: str, topic: str, queue_id: int, entries: list[InFlight], now_ms: int, limit: int
    ) -> list[InFlight]:
        """The due ``entries`` of one queue an orderly group may have now, from its lowest pending
        offset on; the others go back to the heap. Nothing while a message of the queue is in
        flight: hidden, or taken by another receive (not among the handles) that is dead-lettering it."""
        pending = self._state(group, topic, queue_id).pending
        handles = {f.handle for f in entries}
        out: list[InFlight] = []
        if not any(f.invisible_until > now_ms or f.handle not in self._handles for f in pending.values()):
            for offset in sorted(pending):
                inflight = pending[offset]
                if len(out) >= limit or inflight.handle not in handles:
                    break
                out.append(inflight)
        for inflight in out:
            del self._handles[inflight.handle]
        taken = {f.handle for f in out}
        for inflight in entries:
            if inflight.handle not in taken:
                self._track(inflight)
        return out

    def _renew(self, inflight: InFlight, now_ms: int) -> bool:
        """Auto renew: hidden for the next renewal's time (:data:`RENEW_NEXT_MS`) while its client is
        connected."""
        if (not inflight.owner or not self.renewable(inflight.owner)
                or now_ms - inflight.delivered_at >= self.max_renew_ms):
            return False
        inflight.invisible_until = now_ms + RENEW_NEXT_MS[min(inflight.renew_times, len(RENEW_NEXT_MS) - 1)]
        inflight.renew_times += 1
        self.attempts.set(inflight)
        heap = self._expiry.setdefault((inflight.group, inflight.topic), [])
        heapq.heappush(heap, (inflight.invisible_until, next(self._seq), inflight.handle))
        return True

    def clear_owner(self, owner: str, invisible_ms: int, now_ms: int) -> int:
        """A client gone: the messages it received with auto renew are no longer renewed and are
        visible again after ``invisible_ms`` (RocketMQ's clearGroup), not after their invisible time
        (60 s): its cached, unconsumed messages go to the group's other consumers soon. How many."""
        cleared = [f for f in self._handles.values() if f.owner == owner]
        for inflight in cleared:
            inflight.owner = ""
            inflight.invisible_until = min(inflight.invisible_until, now_ms + invisible_ms)
            self.attempts.set(inflight)
            heap = self._expiry.setdefault((inflight.group, inflight.topic), [])
            heapq.heappush(heap, (inflight.invisible_until, next(self._seq), inflight.handle))
        return len(cleared)

    def next_due_ms(self, group: str, topic: str) -> int | None:
        """When the next in-flight message of (group, topic) becomes visible again (ms), if any."""
        heap = self._expiry.get((group, topic))
        while heap and heap[0][2] not in self._handles:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def redeliver(self, inflight: InFlight, invisible_ms: int, now_ms: int, owner: str = "") -> InFlight:
        """A due message handed out again: a new handle, delivery attempt + 1 (not one
        :attr:`InFlight.forgotten`: the caller skips those)."""
        again = InFlight(
            self._new_handle(), inflight.group, inflight.topic, inflight.queue_id, inflight.queue_offset,
            inflight.commit_log_offset, inflight.delivery_attempt + 1, now_ms + invisible_ms, invisible_ms,
            owner, now_ms,
        )
        self._state(inflight.group, inflight.topic, inflight.queue_id).pending[inflight.queue_offset] = again
        self._track(again)
        self.attempts.set(again)
        return again

    def remove(self, inflight: InFlight) -> None:
        """A due message is done (dead-lettered): no longer pending, the offset may move on."""
        if inflight.forgotten:
            return
        state = self._state(inflight.group, inflight.topic, inflight.queue_id)
        if state.pending.get(inflight.queue_offset) is inflight:
            del state.pending[inflight.queue_offset]
        self._handles.pop(inflight.handle, None)
        self.attempts.drop(inflight)
        self._commit(state, inflight.group, inflight.topic, inflight.queue_id)

    def postpone(self, inflight: InFlight, delay_ms: int, now_ms: int) -> None:
        """A due message the caller could not dead-letter now: due again after ``delay_ms``."""
        if inflight.forgotten:
            return
        inflight.invisible_until = now_ms + delay_ms
        self._track(inflight)
        self.attempts.set(inflight)

    def put_back(self, inflight: InFlight) -> None:
        """A due message the caller did not get to (a receive cancelled, a FIFO queue stalled
        behind an earlier message): due again at once, for the next receive."""
        if not inflight.forgotten:
            self._track(inflight)

    # -- ack / change invisible duration --------------------------------------------------------
    def find(self, group: str, topic: str, handle: str, now_ms: int) -> InFlight:
        """The in-flight message of a receipt handle; INVALID_RECEIPT_HANDLE if it is not one (now)."""
        inflight = self._handles.get(handle)
        if inflight is None or inflight.group != group or inflight.topic != topic:
            raise ProxyException(
                v2.INVALID_RECEIPT_HANDLE,
                f"receipt handle {handle[:64]!r} is unknown for group {group!r} and topic {topic!r}: "
                "acked already, replaced by a later one, or given in the last second before a broker crash",
            )
        if inflight.invisible_until <= now_ms and not self._renew(inflight, now_ms):
            raise ProxyException(
                v2.INVALID_RECEIPT_HANDLE,
                f"receipt handle {handle[:64]!r} expired {now_ms - inflight.invisible_until} ms ago: "
                "the message is visible again and will be delivered anew",
            )
        return inflight

    def ack(self, group: str, topic: str, handle: str, now_ms: int) -> InFlight:
        """The message is consumed; the group's offset moves past it once nothing before it is pending."""
        inflight = self.find(group, topic, handle, now_ms)
        del self._handles[handle]
        state = self._state(group, topic, inflight.queue_id)
        if state.pending.get(inflight.queue_offset) is inflight:
            del state.pending[inflight.queue_offset]
        self.attempts.drop(inflight)
        self._commit(state, group, topic, inflight.queue_id)
        return inflight

    def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int, now_ms: int
    ) -> InFlight:
        """Hidden for ``invisible_ms`` from now, under a new handle (the old one is void)."""
        inflight = self.find(group, topic, handle, now_ms)
        del self._handles[handle]
        renewed = InFlight(
            self._new_handle(), group, topic, inflight.queue_id, inflight.queue_offset,
            inflight.commit_log_offset, inflight.delivery_attempt, now_ms + invisible_ms, invisible_ms,
        )
        self._state(group, topic, inflight.queue_id).pending[inflight.queue_offset] = renewed
        self._track(renewed)
        self.attempts.set(renewed)
        return renewed

    def clean_by_topic(self, topic: str) -> None:
        """A deleted topic's pop state goes with its queues and offsets (RocketMQ's deleteTopicInBroker:
        cleanOffsetByTopic, clearInFlightMessageNumByTopicName): else a group kept reading the topic
        created again from its old next offset, past the new messages, and counted their deliveries
        on from the old messages' attempts at the same offsets."""
        for key in [k for k in self._queues if k[1] == topic]:
            del self._queues[key]
        for handle in [h for h, f in self._handles.items() if f.topic == topic]:
            del self._handles[handle]
        for group_topic in [k for k in self._expiry if k[1] == topic]:
            del self._expiry[group_topic]
        self.attempts.remove_topic(topic)

    def reset_offset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """ResetOffset moved the group's offsets on these queues (queue id -> offset, committed and
        written by the caller first): the next receive reads each from there. The group's messages
        in flight on them are forgotten (their receipt handles are refused from now on; one a
        receive has taken meanwhile is dropped, not delivered) and the stored state of its
        reading goes: with it, what was acked above a new offset would be skipped, not read again
        (RocketMQ's resetOffset clears the queue's in-flight count and pop offset too)."""
        for queue_id in offsets:
            state = self._queues.pop((group, topic, queue_id), None)
            for inflight in state.pending.values() if state is not None else ():
                inflight.forgotten = True
                self._handles.pop(inflight.handle, None)
            self.attempts.forget_queue(group, topic, queue_id)
        self.attempts.flush()  # at once: the next start must not read the old state

    def in_flight(self, group: str, topic: str) -> int:
        """How many messages of (group, topic) are handed out and not acked (for tests and stats)."""
        return sum(len(s.pending) for (g, t, _), s in self._queues.items() if g == group and t == topic)

    # -- internals ------------------------------------------------------------------------------
    def _new_handle(self) -> str:
        return f"{self._run}{next(self._seq):x}{secrets.token_hex(4)}"

    def _track(self, inflight: InFlight) -> None:
        self._handles[inflight.handle] = inflight
        heap = self._expiry.setdefault((inflight.group, inflight.topic), [])
        heapq.heappush(heap, (inflight.invisible_until, next(self._seq), inflight.handle))

    def _commit(self, state: _QueueState, group: str, topic: str, queue_id: int) -> None:
        committed = min(state.pending) if state.pending else state.next_offset
        if committed != self.offsets.query_offset(group, topic, queue_id):
            self.offsets.commit_offset(group, topic, queue_id, committed)
