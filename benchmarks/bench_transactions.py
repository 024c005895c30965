#!/usr/bin/env python
"""Transactions and filters benchmark (issue 7), each next to its plain figure in the same run.

1. Exactly-once sink: a stream pymq topic -> pymq topic (200 B bodies,
   Trigger.AvailableNow, ``maxMessagesPerTrigger`` rows per micro-batch) with
   ``deliveryGuarantee=exactly-once`` (half messages, commit marker,
   EndTransactionBatch), next to the same query at-least-once (sync and async)
   and to Spark's ``noop`` sink (the ceiling: reading the source alone).
2. SQL92-filtered pull: ``pull_raw`` of a whole queue with a property filter
   that matches half of the messages, next to the same pull unfiltered
   (broker started with ``--enable-property-filter``).

    python benchmarks/bench_transactions.py            # 400,000 rows / messages
    python benchmarks/bench_transactions.py --quick    # 100,000
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
from pyspark_pymq import Admin, Message, Producer, PullConsumer  # noqa: E402


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def fill(ep: str, topic: str, n: int, body: int, queues: int, with_props: bool = False) -> None:
    Admin(ep).create_topic(topic, queues=queues)
    payload = b"x" * body
    with Producer(ep, send_mode="async") as producer:
        for start in range(0, n, 1000):
            producer.send_batch([
                Message(topic, payload, properties={"a": str(i % 10)} if with_props else {})
                for i in range(start, min(n, start + 1000))
            ])


def sink_figures(ep: str, n: int, body: int, per_trigger: int, tmp: Path) -> list[tuple[str, float]]:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-transactions")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    fill(ep, "tx-src", n, body, 4)

    def stream(name: str, fmt: str, **options: str) -> float:
        df = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", "tx-src")
              .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", per_trigger)
              .option("consumerGroup", f"g-{name}").option("includeRetry", "false").load()
              .select("body"))
        writer = df.writeStream.format(fmt).option("checkpointLocation", str(tmp / name))
        if fmt == "pymq":
            Admin(ep).create_topic(f"tx-{name}", queues=4)
            writer = writer.option("endpoint", ep).option("topic", f"tx-{name}")
        for key, value in options.items():
            writer = writer.option(key, value)
        return n / timed(lambda: writer.trigger(availableNow=True).start().awaitTermination())

    stream("warm-up", "noop")  # the first query of a session pays for JIT and Python workers
    results = [("noop sink (ceiling: the source alone)", stream("noop", "noop"))]
    results.append(("at-least-once, sendMode=sync", stream("sync", "pymq", sendMode="sync")))
    results.append(("at-least-once, sendMode=async", stream("async", "pymq", sendMode="async")))
    results.append(("exactly-once, sendMode=sync", stream("eo-sync", "pymq", sendMode="sync",
                                                          deliveryGuarantee="exactly-once")))
    results.append(("exactly-once, sendMode=async", stream("eo-async", "pymq", sendMode="async",
                                                           deliveryGuarantee="exactly-once")))
    spark.stop()
    return results


def pull_figures(ep: str, n: int, body: int) -> list[tuple[str, float]]:
    fill(ep, "filter-src", n, body, 1, with_props=True)
    consumer = PullConsumer(ep, "bench-filter")
    mq = consumer.queues("filter-src")[0]

    def drain(subscription: str, expression_type: str) -> tuple[float, int]:
        offset, got = 0, 0
        t0 = time.perf_counter()
        while offset < n:
            r = consumer.pull_raw(mq, offset, 32768, subscription=subscription,
                                  expression_type=expression_type)
            got += r.message_count
            offset = r.next_begin_offset
        return time.perf_counter() - t0, got

    results = []
    for label, sub, kind in (("plain pull (TAG *)", "*", "TAG"),
                             ("SQL92 `a < 5` (half match)", "a < 5", "SQL92")):
        secs, got = drain(sub, kind)
        results.append((f"{label}: messages scanned", n / secs))
        results.append((f"{label}: messages delivered ({got:,})", got / secs))
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--body", type=int, default=200)
    ap.add_argument("--per-trigger", type=int, default=100_000)
    args = ap.parse_args()
    n = 100_000 if args.quick else args.messages
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "b", ["--enable-property-filter"]).start()
        try:
            sink = sink_figures(broker.endpoint, n, args.body, args.per_trigger, Path(tmp))
            pull = pull_figures(broker.endpoint, n, args.body)
        finally:
            broker.stop()
    print(f"{n:,} messages of {args.body} B, {args.per_trigger:,} per micro-batch, local[2], "
          f"{time.strftime('%Y-%m-%d')}\n")
    ceiling = sink[0][1]
    print("| stream pymq -> sink | msgs/s | of noop |\n|---|---|---|")
    for name, rate in sink:
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.0%} |")
    print("\n| pull | msgs/s |\n|---|---|")
    for name, rate in pull:
        print(f"| {name} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
