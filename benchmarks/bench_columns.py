#!/usr/bin/env python
"""The pymq source reading all its columns, the ones that match Kafka's, and the body alone.

Spark gives Python data sources no column pruning: ``load().select("body")`` still has
every column decoded in the Python workers and converted by the JVM. ``.schema(...)`` of
some source columns keeps only those. In one run, one Spark session (``local[2]``), one
embedded broker, alternating (the order rotates from round to round), on topics of the
same ``--rows`` x ``--body`` bytes, 4 queues:

- ``all``: the default schema, 15 columns;
- ``kafka``: ``side_by_side.KAFKA_LIKE_COLUMNS`` (keys, body, topic, queue_id,
  queue_offset, store_timestamp: what Kafka's source returns);
- ``body``: ``.schema("body binary")``.

Each round writes its topic (the sink figure is the same for all three) and reads it with
``readStream`` -> ``noop`` (``Trigger.AvailableNow``) and ``spark.read`` -> ``noop``; rows/s
and CPU µs per row of each process kind, medians of ``--runs``.

    .venv/bin/python benchmarks/bench_columns.py                 # 1M rows of 200 B, median of 3
    .venv/bin/python benchmarks/bench_columns.py --quick         # 100k rows, 1 run
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import side_by_side as sbs

sbs.use_repository()

from broker_process import BrokerProcess  # noqa: E402

SCHEMAS = {"all": "", "kafka": sbs.KAFKA_LIKE_COLUMNS, "body": "body binary"}
QUEUES = 4


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=200, help="body size in bytes")
    ap.add_argument("--runs", type=int, default=3)
    sbs.add_wait_quiet_argument(ap)
    ap.add_argument("--quick", action="store_true", help="100,000 rows, 1 run")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.runs, args.wait_quiet = 100_000, 1, min(args.wait_quiet, 20.0)

    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin

    print("# the pymq source: all columns, Kafka's, the body alone (.schema(...))")
    command = [Path(sys.executable).name, "benchmarks/bench_columns.py", *(argv or sys.argv[1:])]
    print(f"command: `{' '.join(command)}`")
    print(sbs.machine_line())
    print(f"{args.rows:,} rows of {args.body} B, {QUEUES} queues, median of {args.runs} run(s) "
          "after 1 warm-up round")
    work = Path(tempfile.mkdtemp(prefix="pymq-bench-columns-"))
    broker = BrokerProcess(work / "broker").start()
    spark = (SparkSession.builder.master("local[2]").appName("pymq-bench-columns")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g").getOrCreate())
    try:
        spark.sparkContext.setLogLevel("ERROR")
        sbs.SPARK_JVM[0] = spark.sparkContext._gateway.proc.pid
        ep = broker.endpoint

        def make_topic(topic: str) -> None:
            Admin(ep).create_topic(topic, queues=QUEUES)

        df = spark.range(args.rows, numPartitions=2).selectExpr(
            f"CAST(repeat('x', {args.body}) AS BINARY) AS body").cache()
        df.count()
        targets = [sbs.PymqTarget(name, "endpoint", ep, {broker.pid}, make_topic, df, schema=schema)
                   for name, schema in SCHEMAS.items()]
        results = sbs.run_rounds(spark, targets, args.rows, work, runs=args.runs, warmups=1,
                                 wait_quiet_s=args.wait_quiet)
        print("\n| figure | columns | rows/s | / all | " + " | ".join(sbs.KINDS) + " | CPU µs/row, all |")
        print("|---|---|---|---|" + "---|" * (len(sbs.KINDS) + 1))
        for figure in ("stream", "stream-wall", "batch"):
            base = results.median(figure, "all")
            for name in SCHEMAS:
                rate = results.median(figure, name) or 0.0
                cpu = results.cpu_median("stream" if figure == "stream-wall" else figure, name) or {}
                us = {k: v * 1e6 / args.rows for k, v in cpu.items()}
                ratio = f"{rate / base:.2f}" if base else "-"
                kinds = " | ".join(f"{us.get(k, 0.0):.2f}" for k in sbs.KINDS)
                print(f"| {sbs.FIGURE_NAMES[figure]} | {name} | {sbs.kilo(rate)} | {ratio} | {kinds} | "
                      f"{us.get('all', 0.0):.2f} |")
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    finally:
        spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
