#!/usr/bin/env python
"""Sink benchmark (issue 5): df.write.format("pymq") msgs/s per send mode, and send back rows/s.

The same query written to Spark's ``noop`` sink in the same run is the ceiling
(what Spark itself costs to produce the rows); each figure is also given as a
ratio of it. A Python data source that discards its rows (``null_sink.py``) shows
what handing the rows to a Python writer costs before anything is sent. The
broker runs as a separate process on loopback.

    python benchmarks/bench_sink.py            # 1,000,000 rows of 200 B
    python benchmarks/bench_sink.py --quick    # 200,000 rows
    python benchmarks/bench_sink.py --modes async --repeats 3
    python benchmarks/bench_sink.py --modes async,oneway --max-in-flight 2,4,8,64 --no-send-back

Besides msgs/s, each figure has the CPU time per message of every process of
the run (JVM, Python workers, broker) and of the broker alone, steadier than
msgs/s on a shared machine, and the cores other processes used meanwhile.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
sys.path[:0] = [*SRC, str(ROOT / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join([*SRC, str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])
os.environ["PYSPARK_PYTHON"] = sys.executable

from broker_process import BrokerProcess  # noqa: E402
from null_sink import NullDataSource  # noqa: E402
from pyspark_pymq import Admin  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_ticks() -> tuple[dict[int, int], dict[int, int]]:
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return parent, ticks


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and its descendants (Linux; 0.0 elsewhere)."""
    if not Path("/proc").exists():
        return 0.0
    parent, ticks = _cpu_ticks()
    total = 0
    for pid, t in ticks.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += t
    return total / CLK_TCK


def machine_busy_seconds() -> float:
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK  # all but idle and iowait


class Measure:
    """Wall time, CPU µs/msg of the run (broker included) and of the broker, others' load."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid

    def run(self, fn: object, n: int) -> tuple[float, float, float, float]:
        """(msgs/s, CPU µs/msg all, CPU µs/msg broker, other load in cores) of ``fn()``."""
        me, broker = tree_cpu_seconds(os.getpid()), tree_cpu_seconds(self.broker_pid)
        busy = machine_busy_seconds()
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        secs = time.perf_counter() - t0
        me = tree_cpu_seconds(os.getpid()) - me
        broker = tree_cpu_seconds(self.broker_pid) - broker
        others = max(0.0, machine_busy_seconds() - busy - me) / secs
        return n / secs, me / n * 1e6, broker / n * 1e6, others


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--body", type=int, default=200)
    ap.add_argument("--modes", default="sync,async,oneway", help="send modes to measure")
    ap.add_argument("--repeats", type=int, default=1, help="runs per figure; the fastest is shown")
    ap.add_argument("--no-send-back", action="store_true", help="skip action=reconsumeLater")
    ap.add_argument("--tag", default="", help="a tags column of this value on every row (TAGS)")
    ap.add_argument("--max-in-flight", default="",
                    help="maxInFlight values to measure each mode with (default: the sink's default)")
    args = ap.parse_args()
    n = 200_000 if args.quick else args.rows
    modes = [m for m in args.modes.split(",") if m]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-sink")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(n, numPartitions=2).selectExpr(f"CAST(repeat('x', {args.body}) AS BINARY) AS body")
    if args.tag:  # a literal, not SQL text: any tag value works
        from pyspark.sql.functions import lit

        df = df.withColumn("tags", lit(args.tag))
    df = df.cache()
    df.count()
    results: list[tuple[str, tuple[float, float, float, float]]] = []

    def best(name: str, fn: object, count: int = n) -> None:
        runs = [measure.run(fn, count) for _ in range(args.repeats)]
        results.append((name, max(runs)))

    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "b").start()
        measure = Measure(broker.pid)
        try:
            ep = broker.endpoint
            best("noop sink (ceiling)", lambda: df.write.format("noop").mode("overwrite").save())
            Admin(ep).create_topic("bench-warmup", queues=4)
            # starts the Python workers, so that the first measured mode does not pay for it
            (df.limit(1000).write.format("pymq").option("endpoint", ep).option("topic", "bench-warmup")
             .mode("append").save())
            spark.dataSource.register(NullDataSource)
            df.limit(1000).write.format("pymq-bench-null").mode("append").save()  # its warm-up too
            best("Python sink that discards its rows", lambda: df.write.format("pymq-bench-null")
                 .mode("append").save())
            windows = [w for w in args.max_in_flight.split(",") if w] or [""]
            for mode in modes:
                for window in windows:
                    topic = f"bench-{mode}{window}"
                    Admin(ep).create_topic(topic, queues=4)
                    writer = df.write.format("pymq").option("endpoint", ep).option("topic", topic)
                    if window:
                        writer = writer.option("maxInFlight", window)
                    best(f"pymq sink, sendMode={mode}" + (f", maxInFlight={window}" if window else ""),
                         lambda w=writer, m=mode: w.option("sendMode", m).mode("append").save())
            if not args.no_send_back:
                source = f"bench-sync{windows[0]}" if "sync" in modes else f"bench-{modes[0]}{windows[0]}"
                # every row the source topic holds (n per repeat), one partition per queue
                rows = (spark.read.format("pymq").option("endpoint", ep).option("topic", source)
                        .load().cache())
                best("send back (action=reconsumeLater)",
                     lambda: rows.write.format("pymq").option("endpoint", ep)
                     .option("action", "reconsumeLater").option("consumerGroup", "bench")
                     .option("delayLevel", 18).mode("append").save(), rows.count())
        finally:
            broker.stop()
    ceiling = results[0][1][0]
    print(f"rows: {n:,} of {args.body} B, local[2], best of {args.repeats}\n")
    print("| figure | msgs/s | of noop ceiling | CPU µs/msg (all) | CPU µs/msg (broker) "
          "| other load (cores) |")
    print("|---|---|---|---|---|---|")
    for name, (rate, cpu_all, cpu_broker, others) in results:
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.0%} | {cpu_all:.2f} | {cpu_broker:.2f} | "
              f"{others:.2f} |")
    spark.stop()


if __name__ == "__main__":
    main()
