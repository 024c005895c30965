"""The pymq -> Delta Lake pipeline survives kill -9: every good message lands exactly once.

``examples/delta_pipeline.py`` runs as its own Spark driver (with Delta; the
shared test session has none). It is killed -9 (driver, JVM and workers: the
whole process group) three times at different points, restarted from its
checkpoint each time, and finally runs to completion:

1. between micro-batches: batch N is committed in the checkpoint and N + 1 is
   not planned yet (there is no new data until the test sends more);
2. mid-batch: the listener has run (failures are already back in %RETRY%),
   the Delta table is not written yet;
3. after the Delta commit of batch N, before the checkpoint's commit: the
   restart replays batch N, and Delta must skip it (txnAppId / txnVersion).

The table is then read from its Delta log by this test, without Spark.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark_pymq import Admin, Message, Producer

pytestmark = pytest.mark.spark  # runs its own Spark drivers (with Delta), not the shared session

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "examples" / "delta_pipeline.py"
# Spark's own way to add options to a driver it starts (pyspark's launcher reads it): start-up speed
# over peak speed (C1 only), as each run lives a few micro-batches and C2's compiler threads compete
# for the CPUs with Spark's and Delta's start.
SUBMIT_ARGS = "--conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 pyspark-shell"

FIRST_WAVE, N_ORDERS = 100, 400  # the first wave is clean: no retries follow it
FLAKY = {i for i in range(FIRST_WAVE, N_ORDERS) if i % 10 == 3}
POISON = {i for i in range(FIRST_WAVE, N_ORDERS) if i % 50 == 7}
GOOD = set(range(N_ORDERS)) - POISON


class PipelineRun:
    """One run of the pipeline script in its own process group; its output, line by line."""

    def __init__(self, args: list[str]) -> None:
        self.lines: list[str] = []  # "[elapsed s] line" as they came
        self.started = time.monotonic()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(PIPELINE), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            start_new_session=True, env={**os.environ, "PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS},
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(f"[{time.monotonic() - self.started:6.1f} s] {line.rstrip()}")
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 300.0) -> re.Match[str]:
        """The first line from now on that matches ``pattern`` (fails if the run ends first)."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line matching {pattern!r}:\n" + self.tail()
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"the pipeline ended before {pattern!r}:\n" + self.tail()
            self.lines.append(line)
            m = regex.search(line)
            if m:
                return m

    def kill(self) -> None:
        """kill -9 the driver with its JVM and Python workers."""
        with contextlib.suppress(ProcessLookupError):  # all of them have exited already
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def finish(self, timeout: float = 420.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return rc

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])


def delta_log(table: Path) -> list[list[dict[str, Any]]]:
    """The table's commits, each a list of actions, in version order."""
    files = sorted((table / "_delta_log").glob("[0-9]*.json"))
    return [[json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files]


def delta_rows(table: Path) -> list[dict[str, Any]]:
    """The table's rows: the data files added and not removed by the log (orphans of a
    killed write are not in it)."""
    live: set[str] = set()
    for commit in delta_log(table):
        for action in commit:
            if "add" in action:
                live.add(action["add"]["path"])
            elif "remove" in action:
                live.discard(action["remove"]["path"])
    rows: list[dict[str, Any]] = []
    for path in sorted(live):
        rows.extend(pq.read_table(table / path, columns=["order_id", "msg_id"]).to_pylist())
    return rows


def txn_versions(table: Path) -> list[int]:
    """The txnVersion of every commit, in commit order (there is one writer)."""
    return [a["txn"]["version"] for commit in delta_log(table) for a in commit if "txn" in a]


def txn_app_ids(table: Path) -> set[str]:
    return {a["txn"]["appId"] for commit in delta_log(table) for a in commit if "txn" in a}


def committed_batches(checkpoint: Path) -> set[int]:
    return {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}


def planned_batches(checkpoint: Path) -> set[int]:
    return {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}


def test_pipeline_killed_between_and_mid_batch_writes_every_good_message_once(
    shared_broker: Any, tmp_path: Path
) -> None:
    ep = shared_broker.endpoint
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"orders-{suffix}", f"billing-{suffix}"
    table, checkpoint = tmp_path / "orders_delta", tmp_path / "ckpt"
    Admin(ep).create_topic(topic, queues=2)

    def send(ids: range) -> None:
        with Producer(ep) as producer:
            producer.send_batch([
                Message(topic, json.dumps({"order_id": i, "customer": "c", "flaky": i in FLAKY,
                                           "amount": -1.0 if i in POISON else 10.0 + i}))
                for i in ids
            ])

    base = ["--endpoint", ep, "--topic", topic, "--group", group, "--table", str(table),
            "--checkpoint", str(checkpoint), "--max-reconsume", "2", "--max-per-trigger", "100"]

    # 1. Between micro-batches: the first wave is written and committed, and with no
    # new data (no retries either) no next batch is planned; then kill.
    send(range(FIRST_WAVE))
    run = PipelineRun(base)
    try:
        query_id = run.wait_for(r"started query (\S+) ").group(1)
        written = 0
        while written < FIRST_WAVE:
            wrote = run.wait_for(r"batch (\d+): wrote (\d+) new row")
            n, written = int(wrote.group(1)), written + int(wrote.group(2))
        deadline = time.monotonic() + 60
        while n not in committed_batches(checkpoint) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        run.kill()
    assert n in committed_batches(checkpoint), run.tail()
    assert max(planned_batches(checkpoint)) == n  # nothing was planned after it
    assert len(delta_rows(table)) == FIRST_WAVE

    send(range(FIRST_WAVE, N_ORDERS))

    # 2. Mid-batch: the listener ran (failures went back to %RETRY%), Delta not written.
    run = PipelineRun([*base, "--hold-before-write-ms", "60000"])  # killed in the pause
    try:
        m = int(run.wait_for(r"batch (\d+): consumed [1-9]").group(1))
    finally:
        run.kill()
    assert m not in txn_versions(table), run.tail()
    assert m not in committed_batches(checkpoint)

    # 3. After the Delta commit of batch K, before the checkpoint's commit of it.
    run = PipelineRun([*base, "--hold-after-write-ms", "60000"])  # killed in the pause
    try:
        k = int(run.wait_for(r"batch (\d+): wrote \d+ new row").group(1))
    finally:
        run.kill()
    assert k in txn_versions(table), run.tail()
    assert k in planned_batches(checkpoint) and k not in committed_batches(checkpoint)

    # 4. Run to the end: batch K is replayed first and must be a no-op.
    run = PipelineRun([*base, "--expect-good", str(len(GOOD)), "--expect-dead", str(len(POISON))])
    rc = run.finish()
    assert rc == 0, run.tail()
    assert any("] pipeline: done:" in line for line in run.lines), run.tail()
    replay = f"] pipeline: batch {k}: already in the table (a replay: Delta skipped txnVersion {k})"
    assert any(line.endswith(replay) for line in run.lines), run.tail()

    rows = delta_rows(table)
    counts = Counter(r["order_id"] for r in rows)
    assert set(counts) == GOOD
    assert [o for o, c in counts.items() if c > 1] == []  # each good order exactly once
    assert len({r["msg_id"] for r in rows}) == len(rows)
    versions = txn_versions(table)
    assert len(versions) == len(set(versions)), versions  # a replayed batch committed nothing
    assert len(versions) == len(delta_log(table))  # every commit is one batch of this query
    assert txn_app_ids(table) == {f"pymq-delta-pipeline:{query_id}"}
    dead = Admin(ep).dead_letter_messages(group)
    assert {json.loads(d.body)["order_id"] for d in dead} == POISON
    assert {d.reconsume_times for d in dead} == {3}  # after --max-reconsume 2 retries
