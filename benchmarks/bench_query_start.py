#!/usr/bin/env python
"""What a notebook user waits for on a small topic: the wall clock of one pymq query, start to end.

On 10,000 rows (``--rows``), each figure is one call as a user makes it, timed from the call to
its end: ``spark.read ... .count()``, a ``readStream`` -> ``noop`` query with
``Trigger.AvailableNow`` (from ``start()`` to its end), and a ``df.write`` into pymq. On so few
rows the time is almost all fixed cost: Spark plans the query and runs the Python data source's
planning steps (the schema, the batch read's partitions, the write's commit) in Python
processes, most forked from its worker daemon; a streaming query starts its source runner as a
fresh process.

The comparison: those processes importing pip's pyspark with its bytecode (what pymq's
``pyspark_pymq-pyspark-path.pth`` arranges, see ``_pyspark_pymq_path``) against the same
code from ``pyspark.zip`` (``PYMQ_KEEP_PYSPARK_ZIP=1``: Spark's plain behaviour, compiling the
modules again in every process). Each configuration runs in its own driver process (the
setting must be in place before the JVM starts), taking turns for ``--rounds`` rounds; in each,
one unmeasured call of every kind warms the JVM, then ``--repeats`` calls of each kind count.
Medians of every counted call, and CPU seconds of all processes per call (JVM, Python
workers and planners, the broker).

    .venv/bin/python benchmarks/bench_query_start.py            # 3 rounds x 3 calls (~3 min)
    .venv/bin/python benchmarks/bench_query_start.py --quick    # 1 round x 2 calls (make bench)

Needs the project installed in its interpreter (``make setup``: the ``.pth`` file lives in
site-packages); the broker is the embedded one, a process on loopback.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import side_by_side as sbs

CONFIGS = {"installed pyspark (pymq's .pth)": "0", "pyspark.zip (Spark's default)": "1"}
CALLS = ("spark.read → count()", "readStream → noop, start() to end", "df.write → pymq")


def _cpu_seconds() -> float:
    from bench_source import tree_cpu_seconds

    return float(tree_cpu_seconds())


def child(rows: int, repeats: int, out: Path) -> None:
    """One driver: a broker, a topic of ``rows``, one session; every call timed, as JSON lines."""
    sbs.use_repository()
    from bench_source import fill_topic
    from broker_process import BrokerProcess
    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin

    work = Path(tempfile.mkdtemp(prefix="pymq-bench-start-"))
    spark = (SparkSession.builder.master("local[2]").appName("pymq-bench-query-start")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with BrokerProcess(work / "broker") as broker, out.open("a") as sink:
            ep = broker.endpoint
            fill_topic(ep, "start", rows, 200, 4)
            Admin(ep).create_topic("start-out", queues=4)
            data = spark.range(rows).selectExpr("cast(id as string) as body")
            counter = itertools.count()

            def read() -> None:
                n = (spark.read.format("pymq").option("endpoint", ep).option("topic", "start")
                     .load().count())
                if n != rows:
                    raise RuntimeError(f"spark.read counted {n} rows, expected {rows}")

            def stream() -> None:
                ck = work / f"ck-{next(counter)}"
                q = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", "start")
                     .option("startingOffsets", "earliest").option("consumerGroup", "start").load()
                     .writeStream.format("noop").option("checkpointLocation", str(ck))
                     .trigger(availableNow=True).start())
                q.awaitTermination()
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))

            def write() -> None:
                data.write.format("pymq").option("endpoint", ep).option("topic", "start-out") \
                    .mode("append").save()

            calls: dict[str, Callable[[], None]] = dict(zip(CALLS, (read, stream, write), strict=True))
            for name, call in calls.items():
                call()  # warm-up: the JVM's JIT, the worker daemon
                for _ in range(repeats):
                    cpu0, t0 = _cpu_seconds(), time.perf_counter()
                    call()
                    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
                    sink.write(json.dumps({"call": name, "wall": wall, "cpu": cpu}) + "\n")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round x 2 calls")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.rows, args.repeats, args.child)
        return 0
    if args.quick:
        args.rounds, args.repeats = 1, 2
    print(f"# `{' '.join(['python', *sys.argv])}`")
    print(f"# {sbs.machine_line()}; load average {os.getloadavg()[0]:.2f} before")
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="pymq-bench-start-") as tmp:
        for r in range(args.rounds):
            order = list(CONFIGS.items()) if r % 2 == 0 else list(reversed(CONFIGS.items()))
            for config, keep in order:
                out = Path(tmp) / f"{r}-{keep}.jsonl"
                env = {**os.environ, "PYMQ_KEEP_PYSPARK_ZIP": keep}
                subprocess.run([sys.executable, __file__, "--child", str(out), "--rows", str(args.rows),
                                "--repeats", str(args.repeats)], env=env, check=True)
                results[config] += [json.loads(line) for line in out.read_text().splitlines()]
    base, other = CONFIGS
    print(f"\n{args.rows:,} rows of 200 B, 4 queues; {args.rounds} rounds x {args.repeats} calls, "
          "medians (min-max) of wall seconds; CPU s of all processes per call\n")
    print(f"| call | {base} | {other} | wall ratio | CPU s, {base.split(' (')[0]} / {other.split(' (')[0]} |")
    print("|---|---|---|---|---|")
    for call in CALLS:
        cells, cpus, medians = [], [], []
        for config in CONFIGS:
            walls = [s["wall"] for s in results[config] if s["call"] == call]
            cpu = statistics.median(s["cpu"] for s in results[config] if s["call"] == call)
            medians.append(statistics.median(walls))
            cells.append(f"{medians[-1]:.2f} ({min(walls):.2f}-{max(walls):.2f})")
            cpus.append(f"{cpu:.2f}")
        print(f"| {call} | {cells[0]} | {cells[1]} | {medians[0] / medians[1]:.2f} | {' / '.join(cpus)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
