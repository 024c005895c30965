#!/usr/bin/env python
"""Sink benchmark (issue 5): df.write.format("pymq") msgs/s per send mode, and send back rows/s.

The same query written to Spark's ``noop`` sink in the same run is the ceiling
(what Spark itself costs to produce the rows); each figure is also given as a
ratio of it. The broker runs as a separate process on loopback.

    python benchmarks/bench_sink.py            # 1,000,000 rows of 200 B
    python benchmarks/bench_sink.py --quick    # 200,000 rows
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
os.environ["PYTHONPATH"] = os.pathsep.join([*SRC, os.environ.get("PYTHONPATH", "")])
os.environ["PYSPARK_PYTHON"] = sys.executable

from broker_process import BrokerProcess  # noqa: E402
from pyspark_pymq import Admin  # noqa: E402


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--body", type=int, default=200)
    args = ap.parse_args()
    n = 200_000 if args.quick else args.rows
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-sink")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(n, numPartitions=2).selectExpr(f"CAST(repeat('x', {args.body}) AS BINARY) AS body")
    df = df.cache()
    df.count()
    results: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "b").start()
        try:
            ep = broker.endpoint
            noop = timed(lambda: df.write.format("noop").mode("overwrite").save())
            results.append(("noop sink (ceiling)", n / noop))
            for mode in ("sync", "async", "oneway"):
                topic = f"bench-{mode}"
                Admin(ep).create_topic(topic, queues=4)
                secs = timed(lambda t=topic, m=mode: df.write.format("pymq").option("endpoint", ep)
                             .option("topic", t).option("sendMode", m).mode("append").save())
                results.append((f"pymq sink, sendMode={mode}", n / secs))
            rows = (spark.read.format("pymq").option("endpoint", ep).option("topic", "bench-sync")
                    .load().cache())
            rows.count()
            secs = timed(lambda: rows.write.format("pymq").option("endpoint", ep)
                         .option("action", "reconsumeLater").option("consumerGroup", "bench")
                         .option("delayLevel", 18).mode("append").save())
            results.append(("send back (action=reconsumeLater)", n / secs))
        finally:
            broker.stop()
    ceiling = results[0][1]
    print(f"rows: {n:,} of {args.body} B, local[2]\n")
    print("| figure | msgs/s | of noop ceiling |\n|---|---|---|")
    for name, rate in results:
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.0%} |")
    spark.stop()


if __name__ == "__main__":
    main()
