"""Offset ranges per MessageQueue, and how they become Spark partitions.

Pure functions (no broker calls): planning a batch must give the same answer
when Spark replays it from the checkpoint, so everything here depends only on
the start and end offsets it is given.

- :func:`plan_ranges`: one ``[start, end)`` range per queue with data.
- :func:`split_ranges`: large ranges cut into several partitions
  (``minPartitions``, ``maxMessagesPerPartition``), as Spark's Kafka source does.
- :func:`pack_ranges`: small ranges of several queues put together into one partition: a
  Spark task of a Python source costs ~50 ms whatever it reads, so a trickle over 256 queues
  made 256 tasks a micro-batch.
- :func:`limit_offsets`: a ``maxMessagesPerTrigger`` budget shared among queues
  in proportion to what each has waiting (a budget below the number of queues behind goes
  round robin, :class:`Turn`: a batch's end is computed once and checkpointed, so that state
  never changes a replay).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping
from dataclasses import dataclass

from ..client.message import MessageQueue
from .data_loss import report_data_loss

__all__ = ["PACK_MESSAGES", "OffsetRange", "Turn", "limit_offsets", "pack_ranges", "plan_ranges",
           "split_ranges"]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Queue offsets ``[start, end)`` of one MessageQueue."""

    mq: MessageQueue
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def _order(mq: MessageQueue) -> tuple[str, str, int]:
    return (mq.topic, mq.broker_name, mq.queue_id)


def plan_ranges(
    start: Mapping[MessageQueue, int],
    end: Mapping[MessageQueue, int],
    *,
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The non-empty ranges from ``start`` to ``end``, in queue order.

    - A queue in ``end`` but not in ``start`` is new; the driver adds new queues
      at their first offset, so its range starts where ``end`` says (empty).
    - A queue in ``start`` but not in ``end`` was dropped (deleted, already
      reported as data loss): nothing is read from it.
    - ``end < start`` means the queue's offsets went backwards (its topic was
      recreated): data loss; when allowed, the queue is read from its start.
    """
    ranges: list[OffsetRange] = []
    for mq in sorted(end, key=_order):
        until = end[mq]
        begin = start.get(mq, until)
        if until < begin:
            report_data_loss(
                fail_on_data_loss,
                f"queue {mq}: its offsets went back from {begin} to {until} (was the topic "
                "deleted and created again?), so messages after offset "
                f"{until} may be lost",
                f"read {mq} from its first offset",
            )
            begin = 0
        if until > begin:
            ranges.append(OffsetRange(mq, begin, until))
    return ranges


def split_ranges(
    ranges: list[OffsetRange],
    *,
    min_partitions: int | None = None,
    max_per_partition: int | None = None,
) -> list[OffsetRange]:
    """Cut ranges so that each holds at most ``max_per_partition`` messages and
    there are at least ``min_partitions`` of them (when there are enough
    messages); queue order and offset order are kept.
    """
    total = sum(r.size for r in ranges)
    pieces: list[int] = []
    for r in ranges:
        n = 1
        if max_per_partition:
            n = max(n, -(-r.size // max_per_partition))
        if min_partitions and min_partitions > len(ranges) and total:
            # Kafka's KafkaOffsetRangeCalculator: share min_partitions by size.
            n = max(n, round(r.size * min_partitions / total))
        pieces.append(max(1, min(n, r.size)))
    if min_partitions and total:
        _top_up(pieces, [r.size for r in ranges], min_partitions)
    out: list[OffsetRange] = []
    for r, n in zip(ranges, pieces, strict=True):
        step, extra = divmod(r.size, n)
        begin = r.start
        for i in range(n):
            until = begin + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.mq, begin, until))
            begin = until
    return out


#: At most this many messages of several queues in one partition (a range this size or larger
#: keeps a partition of its own): tasks read ~1,000 small messages in a few ms, a fraction of what
#: a task costs, while a batch of large messages still spreads over several tasks.
PACK_MESSAGES = 1000


def pack_ranges(ranges: list[OffsetRange], capacity: int = PACK_MESSAGES) -> list[list[OffsetRange]]:
    """``ranges`` in partitions of ranges holding ``capacity`` messages at most together (a larger
    range alone, at once), small ones in the order given: the same ranges always give the same
    partitions (a replayed batch, and the msgIds a sink derives from its partitions, stay the
    same)."""
    out: list[list[OffsetRange]] = []
    filling: list[OffsetRange] = []
    held = 0
    for r in ranges:
        if r.size >= capacity:
            out.append([r])
            continue
        if filling and held + r.size > capacity:
            out.append(filling)
            filling, held = [], 0
        filling.append(r)
        held += r.size
    if filling:
        out.append(filling)
    return out


def _top_up(pieces: list[int], sizes: list[int], min_partitions: int) -> None:
    """Kafka's rounding can leave fewer pieces than ``min_partitions`` (3 queues of 10 and 4 asked:
    3): cut the ranges with the most messages per piece once more until there are enough, or
    every piece is one message."""
    heap = [(-size / n, i) for i, (size, n) in enumerate(zip(sizes, pieces, strict=True)) if n < size]
    heapq.heapify(heap)
    missing = min_partitions - sum(pieces)
    while missing > 0 and heap:
        _, i = heapq.heappop(heap)
        pieces[i] += 1
        missing -= 1
        if pieces[i] < sizes[i]:
            heapq.heappush(heap, (-sizes[i] / pieces[i], i))


@dataclass
class Turn:
    """A stream's round robin when its ``maxMessagesPerTrigger`` is below the number of queues
    behind: the next trigger starts after the last queue this one read, whichever queues are
    behind then, so each waits at most about (queues behind / budget) triggers."""

    after: MessageQueue | None = None


def limit_offsets(
    start: Mapping[MessageQueue, int],
    available: Mapping[MessageQueue, int],
    max_messages: int,
    turn: Turn | None = None,
) -> dict[MessageQueue, int]:
    """End offsets that read at most ``max_messages`` in all from ``start``.

    Every queue with a backlog reads at least one message (as Spark's Kafka source rounds a
    share below one up), then the rest of the budget is shared in proportion to what each
    has left (largest remainder, ties by queue order): the total is exactly
    ``min(max_messages, backlog)``, and a queue with a small backlog next to big ones is not
    held back until they are read. When the budget is smaller than the number of queues
    with a backlog, which of them read this time turns: after ``turn``'s queue, else with the
    offsets reached (a queue could then wait ten times longer than its turn). Queues of
    ``available`` missing from ``start`` keep their ``available`` offset (they are new and
    start there).
    """
    queues = sorted(available, key=_order)
    backlog = {mq: max(0, available[mq] - start.get(mq, available[mq])) for mq in queues}
    total = sum(backlog.values())
    if total <= max_messages:
        return {mq: start.get(mq, available[mq]) + backlog[mq] for mq in queues}
    behind = [mq for mq in queues if backlog[mq]]
    share = dict.fromkeys(queues, 0)
    if max_messages < len(behind):
        if turn is not None and turn.after is not None:
            first = bisect.bisect_right([_order(mq) for mq in behind], _order(turn.after))
        else:
            first = sum(start.get(mq, 0) for mq in behind) % len(behind)
        chosen = (behind[first:] + behind[:first])[:max_messages]
        for mq in chosen:
            share[mq] = 1
        if turn is not None and chosen:  # a budget of 0 (a batch held back) reads none
            turn.after = chosen[-1]
        return {mq: start.get(mq, available[mq]) + share[mq] for mq in queues}
    for mq in behind:
        share[mq] = 1
    rest, rest_total = max_messages - len(behind), total - len(behind)
    remainders: list[tuple[int, int, MessageQueue]] = []
    for i, mq in enumerate(behind):
        whole, left_over = divmod((backlog[mq] - 1) * rest, rest_total) if rest_total else (0, 0)
        share[mq] += whole
        remainders.append((-left_over, i, mq))
    left = max_messages - sum(share.values())
    for _, _, mq in sorted(remainders)[:left]:
        share[mq] += 1
    return {mq: start.get(mq, available[mq]) + share[mq] for mq in queues}
