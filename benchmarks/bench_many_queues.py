#!/usr/bin/env python
"""A trickle over many queues: what a batch read (and so each micro-batch) costs when every queue
holds a few new messages.

A Spark task of a Python data source costs ~50 ms whatever it reads, so one task per queue made
a batch of a few hundred messages over 256 queues take seconds. pymq reads queues with fewer than
1,000 messages together (``offset_range.pack_ranges``); ``minPartitions`` set to the number of
queues gives each queue its task again, as before. Both run in one session, taking turns:
``spark.read ... .count()`` of ``--per-queue`` messages in each of ``--queues`` queues, medians
of ``--repeats`` calls after one unmeasured call each.

    .venv/bin/python benchmarks/bench_many_queues.py            # 256 queues x 3 messages, 5 calls
    .venv/bin/python benchmarks/bench_many_queues.py --quick    # 64 queues, 2 calls (make bench)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import side_by_side as sbs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=256)
    parser.add_argument("--per-queue", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="64 queues, 2 calls each")
    args = parser.parse_args()
    if args.quick:
        args.queues, args.repeats = 64, 2
    sbs.use_repository()
    from broker_process import BrokerProcess
    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin, Producer
    from pyspark_pymq.client.message import Message

    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp) / "broker") as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("trickle", queues=args.queues)
        with Producer(ep) as producer:  # a batch goes to one queue, the next batch to the next
            for q in range(args.queues):
                producer.send_batch([Message("trickle", f"m{q}-{i}") for i in range(args.per_queue)])
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        reads = {
            "small queues read together (default)": {},
            f"one task a queue (minPartitions={args.queues})": {"minPartitions": str(args.queues)},
        }
        times: dict[str, list[float]] = {name: [] for name in reads}
        rows = args.queues * args.per_queue
        for round_ in range(args.repeats + 1):
            for name, extra in reads.items():
                df = (spark.read.format("pymq").option("endpoint", ep).option("topic", "trickle")
                      .options(**extra).load())
                started = time.perf_counter()
                assert df.count() == rows
                if round_:  # the first of each is a warm-up
                    times[name].append(time.perf_counter() - started)
        spark.stop()
    print(f"`{' '.join(sys.argv)}`")
    print(sbs.machine_line())
    print(f"spark.read .count() of {rows} messages on {args.queues} queues, median of {args.repeats}:")
    base = statistics.median(times[next(iter(reads))])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {name:<45} {median:6.2f} s  ({min(seconds):.2f}-{max(seconds):.2f})  x{median / base:.1f}")


if __name__ == "__main__":
    main()
