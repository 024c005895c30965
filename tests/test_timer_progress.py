"""The timer's progress (TimerMessageStore): what it keeps and writes does not grow with what it has
delivered while an older timer waits.

``timerCheckpoint.json`` held every timer delivered after the oldest pending one: one timer a day
away and a steady flow of short ones made the set grow by every delivery (in memory and in the file
written, sorted and indented, after each delivery round on the event loop: 30 ms at 50,000 timers,
100 ms at 200,000).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from pymq_broker.store.timer_message_store import TimerMessageStore
from test_store import make_store, msg, records


def _timer(body: bytes, at: int) -> object:
    return msg(body, TIMER_DELIVER_MS=str(at), UNIQ_KEY=body.decode(), REAL_TOPIC="real", REAL_QID="0")


def _bodies(store: object, topic: str = "real") -> list[bytes]:
    return [r[3] for r in records(store.get_message(topic, 0, 0, 10_000).records)]  # type: ignore[attr-defined]


def test_one_far_timer_does_not_make_the_progress_grow_with_every_delivery(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    path = tmp_path / "timerCheckpoint.json"
    timers = TimerMessageStore(store, path)
    now = int(time.time() * 1000)
    try:
        assert store.put_messages("real", 0, [_timer(b"far", now + 86_400_000)]).ok
        for i in range(2_000):
            assert store.put_messages("real", 0, [_timer(b"s%d" % i, now + 1_000 + i)]).ok
        store.do_reput()
        for step in range(0, 2_000, 100):  # delivered in rounds, as the broker's schedule loop does
            timers.deliver_due(now + 1_000 + step + 99)
        assert len(_bodies(store)) == 2_000 and timers.pending() == 1
        assert path.stat().st_size < 200, path.read_text()[:200]  # not 2,000 offsets
        # far and s0..s1999 in one range of offsets each side of nothing: what is done is one range
        restarted = TimerMessageStore(store, path)
        restarted.load()
        read: list[int] = []
        real_read = store.read_records
        store.read_records = lambda phy, size: (read.append(len(phy)), real_read(phy, size))[1]  # type: ignore[method-assign]
        assert restarted.pending() == 1  # the far one; none of the delivered comes back
        assert sum(read) == 1  # the delivered ones' records are not read again to find them done
        store.read_records = real_read  # type: ignore[method-assign]
        restarted.deliver_due(now + 1_000 + 3_000)
        assert len(_bodies(store)) == 2_000
        restarted.deliver_due(now + 86_400_000)
        assert _bodies(store)[-1] == b"far" and restarted.pending() == 0
        assert json.loads(path.read_text())["lowWater"] == 2_001
    finally:
        store.shutdown()


def test_done_ranges_merge_and_read_a_checkpoint_of_single_offsets(tmp_path: Path) -> None:
    from pymq_broker.store.timer_message_store import DoneRanges

    done = DoneRanges()
    for at in (5, 9, 7, 6, 8, 20):
        done.add(at)
    assert done.pairs() == [[5, 10], [20, 21]] and 7 in done and 10 not in done and 4 not in done
    assert done.take_from(5) == 10 and done.pairs() == [[20, 21]]
    assert done.take_from(10) == 10  # a gap (a pending timer at 10)
    old = TimerMessageStore(None, tmp_path / "timerCheckpoint.json")  # type: ignore[arg-type]
    old.decode({"lowWater": 5, "done": [3, 7, 8, 10]})  # as checkpoints before the ranges were
    assert old.done.pairs() == [[7, 9], [10, 11]]


def test_timers_due_at_one_time_are_delivered_in_bounded_rounds(tmp_path: Path) -> None:
    """deliver_due runs on the event loop and delivered every due timer in one call: 100,000 timers
    due at the same time (a 'deliver at midnight' campaign, or those that fell due while a broker was
    down) held every client for seconds. Bounded rounds, each asking again at once, deliver every one
    exactly once and in order."""
    from pymq_broker.store import timer_message_store

    store = make_store(tmp_path / "store")
    timers = TimerMessageStore(store, tmp_path / "timerCheckpoint.json")
    now = int(time.time() * 1000)
    n = 3 * timer_message_store.DELIVER_BATCH + 5
    try:
        for i in range(n):
            assert store.put_messages("real", 0, [_timer(b"t%d" % i, now + 1_000)]).ok
        store.do_reput()
        rounds = 0
        while timers.pending():
            before = len(_bodies(store))
            wait = timers.deliver_due(now + 1_000)
            rounds += 1
            assert len(_bodies(store)) - before <= timer_message_store.DELIVER_BATCH
            assert wait == 0.0 or timers.pending() == 0
        assert rounds == 4
        assert _bodies(store) == [b"t%d" % i for i in range(n)]
    finally:
        store.shutdown()


def test_progress_past_the_timer_queue_after_a_cut_tail_does_not_skip_new_timers(tmp_path: Path) -> None:
    """A crash that cut the commit log's tail (a torn page, or what ASYNC_FLUSH had not flushed at a
    power loss) cuts the timer queue, while timerCheckpoint.json, written and fsynced, counts the cut
    offsets done. The next timers took those offsets again and were skipped as delivered: sent,
    acknowledged, never delivered. The schedule service's correctDelayOffset handles this for delay
    levels; timers now go back to the queue's end as well."""
    path = tmp_path / "timerCheckpoint.json"
    store = make_store(tmp_path / "store")
    now = int(time.time() * 1000)
    try:
        timers = TimerMessageStore(store, path)
        for i in range(5):
            assert store.put_messages("real", 0, [_timer(b"old%d" % i, now + 1_000)]).ok
        store.do_reput()
        timers.deliver_due(now + 1_000)
        assert json.loads(path.read_text())["lowWater"] == 5
    finally:
        store.shutdown()
    # the store's tail lost (here: all of it), the checkpoint kept
    store = make_store(tmp_path / "store-after-the-cut")
    try:
        timers = TimerMessageStore(store, path)
        timers.load()
        assert store.put_messages("real", 0, [_timer(b"new", now + 2_000)]).ok
        store.do_reput()
        assert timers.pending() == 1
        # a second crash before any round wrote the progress (review helper-109): the corrected
        # progress was in memory only, and the restart skipped "new" as delivered
        again = TimerMessageStore(store, path)
        again.load()
        assert again.pending() == 1
        again.deliver_due(now + 2_000)
        assert _bodies(store) == [b"new"]
    finally:
        store.shutdown()


def test_a_restart_finds_every_waiting_timer_between_the_delivered_ones(tmp_path: Path) -> None:
    """Timers far and near, interleaved: the scan at a start skips the delivered ranges and still
    finds each waiting timer between them."""
    store = make_store(tmp_path / "store")
    path = tmp_path / "timerCheckpoint.json"
    timers = TimerMessageStore(store, path)
    now = int(time.time() * 1000)
    try:
        far = {i for i in range(300) if i % 7 in (0, 3)}
        for i in range(300):
            at = now + 86_400_000 + i if i in far else now + 1_000
            assert store.put_messages("real", 0, [_timer(b"t%d" % i, at)]).ok
        store.do_reput()
        timers.deliver_due(now + 2_000)
        assert timers.pending() == len(far)
        restarted = TimerMessageStore(store, path)
        restarted.load()
        assert restarted.pending() == len(far)
        restarted.deliver_due(now + 2_000)
        assert len(_bodies(store)) == 300 - len(far)  # none delivered twice
        restarted.deliver_due(now + 86_400_000 + 300)
        assert sorted(_bodies(store)[300 - len(far):]) == sorted(b"t%d" % i for i in far)
    finally:
        store.shutdown()


def test_a_recall_under_sync_flush_writes_its_progress_after_the_store_is_flushed(tmp_path: Path) -> None:
    """A recall's write also covers the last round's deliveries, whose own write (a flush of the
    commit log, then the progress) may still run on its thread: written first, a power loss could
    leave timers counted delivered that the commit log never kept (review helper-109)."""
    store = make_store(tmp_path / "store", flush_disk_type="SYNC_FLUSH")
    timers = TimerMessageStore(store, tmp_path / "timerCheckpoint.json")
    now = int(time.time() * 1000)
    events: list[str] = []
    try:
        for name in (b"a", b"b"):
            assert store.put_messages("real", 0, [_timer(name, now + 60_000)]).ok
        store.do_reput()
        assert timers.pending() == 2
        real_flush, real_write = store.commit_log.flush, timers.write
        store.commit_log.flush = lambda: (events.append("flush"), real_flush())[1]  # type: ignore[method-assign]
        timers.write = lambda snapshot: (events.append("write"), real_write(snapshot))[1]  # type: ignore[method-assign]
        assert asyncio.run(timers.recall("real", "a"))
        assert events == ["flush", "write"]
    finally:
        store.shutdown()


@pytest.mark.parametrize("restart", [False, True], ids=["running", "after-a-restart"])
def test_a_recall_cancels_every_copy_of_a_message_id(tmp_path: Path, restart: bool) -> None:
    """A producer's retried send stores one timer message twice (the same UNIQ_KEY): the recall
    answered success and cancelled the later copy only, the earlier one was delivered. The copies
    read as they arrive and those read from the queue by a start's scan are all recalled."""
    store = make_store(tmp_path / "store")
    path = tmp_path / "timerCheckpoint.json"
    now = int(time.time() * 1000)
    try:
        for body, at in ((b"first send", now + 60_000), (b"kept", now + 60_000),
                         (b"retried send", now + 60_500), (b"third send", now + 61_000)):
            uniq = "kept" if body == b"kept" else "retried"
            m = msg(body, TIMER_DELIVER_MS=str(at), UNIQ_KEY=uniq, REAL_TOPIC="real", REAL_QID="0")
            assert store.put_messages("real", 0, [m]).ok
        store.do_reput()
        timers = TimerMessageStore(store, path)
        timers.pending()  # the copies read as they arrive
        if restart:
            timers = TimerMessageStore(store, path)
            timers.load()
        assert asyncio.run(timers.recall("real", "retried"))
        assert not asyncio.run(timers.recall("real", "retried"))  # every copy gone: nothing left to recall
        on_disk = TimerMessageStore(store, path)  # the checkpoint holds every copy recalled
        on_disk.load()
        timers.deliver_due(now + 61_000)
        assert _bodies(store) == [b"kept"]
        assert on_disk.pending() == 1 and not asyncio.run(on_disk.recall("real", "retried"))
    finally:
        store.shutdown()


def test_a_recall_after_one_copy_was_delivered_cancels_the_one_still_waiting(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    timers = TimerMessageStore(store, tmp_path / "timerCheckpoint.json")
    now = int(time.time() * 1000)
    try:
        for body, at in ((b"early copy", now + 1_000), (b"late copy", now + 60_000)):
            m = msg(body, TIMER_DELIVER_MS=str(at), UNIQ_KEY="id", REAL_TOPIC="real", REAL_QID="0")
            assert store.put_messages("real", 0, [m]).ok
        store.do_reput()
        timers.deliver_due(now + 1_000)
        assert _bodies(store) == [b"early copy"] and timers.pending() == 1
        assert asyncio.run(timers.recall("real", "id"))
        assert timers.pending() == 0 and not asyncio.run(timers.recall("real", "id"))
        timers.deliver_due(now + 60_000)
        assert _bodies(store) == [b"early copy"]
    finally:
        store.shutdown()


def test_a_delivery_round_reads_a_bounded_number_of_waiting_timers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start read every waiting timer's record in its first delivery round, on the event loop
    (~1.3 s per million, every client held): each round reads SCAN_ROUND of them now, and asks
    again at once while some are left. A due timer not read yet is delivered a round later, never
    early; a recall reads what it needs."""
    from pymq_broker.store import timer_message_store

    monkeypatch.setattr(timer_message_store, "SCAN_BATCH", 10)
    monkeypatch.setattr(timer_message_store, "SCAN_ROUND", 20, raising=False)
    store = make_store(tmp_path / "store")
    now = int(time.time() * 1000)
    try:
        for i in range(95):
            assert store.put_messages("real", 0, [_timer(b"far%d" % i, now + 86_400_000)]).ok
        assert store.put_messages("real", 0, [_timer(b"due", now + 1_000)]).ok
        assert store.put_messages("real", 0, [_timer(b"later", now + 5_000)]).ok
        store.do_reput()
        timers = TimerMessageStore(store, tmp_path / "timerCheckpoint.json")
        read: list[int] = []
        real_read = store.read_records
        store.read_records = lambda phy, size: (read.append(len(phy)), real_read(phy, size))[1]  # type: ignore[method-assign]
        for _ in range(4):  # 97 timers, 20 a round
            before = sum(read)
            assert timers.deliver_due(now + 1_000) == 0.0  # more to read: asked again at once
            assert sum(read) - before <= 20
            assert _bodies(store) == []  # "due" not read yet
        before = sum(read)
        assert timers.deliver_due(now + 1_000) == 4.0  # all read: "later" is next, in 4 s
        assert sum(read) - before <= 17 + 1  # the last timers' records, and "due"'s to deliver it
        assert _bodies(store) == [b"due"]
        assert asyncio.run(timers.recall("real", "far3")) and timers.pending() == 95
    finally:
        store.shutdown()


def test_a_second_recall_is_answered_once_the_first_ones_cancellation_is_on_disk(tmp_path: Path) -> None:
    """The recall's write runs on a thread: a second recall of the same message (a client's retry)
    meanwhile found no timer and was answered MESSAGE_NOT_FOUND at once, before the cancellation was
    on disk: a crash then delivered the message that answer said was delivered or recalled."""
    store = make_store(tmp_path / "store")
    path = tmp_path / "timerCheckpoint.json"
    timers = TimerMessageStore(store, path)
    now = int(time.time() * 1000)
    try:
        assert store.put_messages("real", 0, [_timer(b"X", now + 3_600_000)]).ok
        store.do_reput()
        real_write = timers.write

        def slow_write(snapshot: tuple[int, bytes]) -> None:  # a busy disk's fsync
            time.sleep(0.3)
            real_write(snapshot)

        timers.write = slow_write  # type: ignore[method-assign]

        async def recalls() -> tuple[bool, bool, int]:
            first = asyncio.create_task(timers.recall("real", "X"))
            await asyncio.sleep(0.05)
            second = await timers.recall("real", "X")
            after_a_crash = TimerMessageStore(store, path)  # what a restart would read now
            after_a_crash.load()
            return await first, second, after_a_crash.pending()

        assert asyncio.run(recalls()) == (True, False, 0)
        assert not timers._recalling
    finally:
        store.shutdown()


def test_a_recall_reads_the_waiting_timers_a_round_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall reads every waiting timer (a copy may be anywhere): the first one after a start read
    them all at once on the event loop, ~1.3 s per million with every client held."""
    from pymq_broker.store import timer_message_store

    monkeypatch.setattr(timer_message_store, "SCAN_BATCH", 5)
    monkeypatch.setattr(timer_message_store, "SCAN_ROUND", 10)
    store = make_store(tmp_path / "store")
    now = int(time.time() * 1000)
    try:
        for i in range(100):
            assert store.put_messages("real", 0, [_timer(b"t%d" % i, now + 3_600_000)]).ok
        store.do_reput()
        timers = TimerMessageStore(store, tmp_path / "timerCheckpoint.json")
        seen: list[int] = []

        async def recall_while_serving() -> bool:
            recall = asyncio.create_task(timers.recall("real", "t99"))
            while not recall.done():
                seen.append(timers._scanned)  # what the loop saw between the recall's reads
                await asyncio.sleep(0)
            return recall.result()

        assert asyncio.run(recall_while_serving())
        assert len({at for at in seen if 0 < at < 100}) >= 5, seen
        assert timers.pending() == 99
    finally:
        store.shutdown()
