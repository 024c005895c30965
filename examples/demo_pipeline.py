"""The full demo: an embedded broker, Spark Structured Streaming, retries, dead letters, Delta Lake.

    make demo        # or: python examples/demo_pipeline.py [--out out] [--orders 2000]

1. An embedded broker starts, with fast delay levels so that the whole retry
   ladder runs in seconds instead of hours.
2. A producer sends orders in a few waves: 1 in 10 is flaky (its payment
   times out the first time), 1 in 100 is poison (an invalid amount, it always
   fails).
3. A streaming query reads them with ``format("pymq")`` (consumer group
   ``billing``, ``%RETRY%billing`` included) and, in ``foreachBatch``, a
   RocketMQ-style listener charges each order. Failures go back to
   ``%RETRY%billing`` and come back later; after 3 retries they land in
   ``%DLQ%billing``. The stream never fails.
4. The orders charged go to a Delta table, exactly once (``txnAppId`` /
   ``txnVersion``, see ``examples/delta_pipeline.py``).
5. When every good order is in the table and every poison one in the DLQ, the
   query stops, a summary is printed and two charts are written: lag per queue
   and retries / dead letters per group (with matplotlib, ``pip install
   '.[charts]'`` from the clone; without it the charts are skipped, saying so).

Everything goes under ``--out`` (default ``./out``): the Delta table, the
checkpoint and the charts; a previous run's table and checkpoint are removed
first (the embedded broker is new on every run). The first run downloads the
Delta jars from Maven Central.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from pathlib import Path

from delta_pipeline import (  # first: puts the repository's pymq on the path for Spark too
    delta_spark_session,
    order_json,
    start_pipeline,
    wait_until_done,
)
from pymq_broker import EmbeddedBroker
from pyspark_pymq import Admin, Message, Producer
from pyspark_pymq.charts import INSTALL_HINT, plot_lag, plot_retry_dlq, retry_dlq_counts
from pyspark_pymq.spark.progress import commit_group_progress

FAST_DELAY_LEVELS = " ".join(["50ms"] * 3 + ["100ms"] * 15)
TOPIC, GROUP = "orders", "billing"
FLAKY_EVERY, POISON_EVERY, MAX_RECONSUME, WAVES = 10, 100, 3, 4


def is_poison(i: int) -> bool:
    return i % POISON_EVERY == 7


def is_flaky(i: int) -> bool:
    return i % FLAKY_EVERY == 3


def produce(endpoint: str, orders: int) -> None:
    """Send the orders in a few waves, as a live producer would."""
    per_wave = -(-orders // WAVES)
    with Producer(endpoint) as producer:
        for start in range(0, orders, per_wave):
            producer.send_batch([
                Message(TOPIC, order_json(i, poison=is_poison(i), flaky=is_flaky(i)),
                        keys=[f"order-{i}"])
                for i in range(start, min(orders, start + per_wave))
            ])
            time.sleep(0.5)


def write_charts(admin: Admin, out: Path) -> None:
    """The two charts, into ``out``; without matplotlib (a plain ``pip install .``), one line that
    says how to get them instead of an ImportError after the whole run (pymq is not on PyPI yet:
    the extra is installed from the clone)."""
    print("charts:")
    try:
        import matplotlib  # noqa: F401  (pyspark_pymq.charts imports it only when it draws)
    except ImportError:
        print(f"  skipped: matplotlib is not installed ({INSTALL_HINT})")
        return
    charts = [out / "lag.png", out / "retry_dlq.png"]
    plot_lag(admin, GROUP, path=charts[0])
    plot_retry_dlq(admin, [GROUP], path=charts[1])
    for chart in charts:
        print(f"  {chart}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="pymq demo: broker -> Spark -> Delta Lake")
    p.add_argument("--out", default="out", help="directory for the Delta table and charts")
    p.add_argument("--orders", type=int, default=2000)
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    table, checkpoint, spark_log = out / "orders_delta", out / "checkpoint", out / "spark.log"
    for old in (table, checkpoint):
        shutil.rmtree(old, ignore_errors=True)
    spark_log.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    orders = args.orders
    expected_dead = sum(1 for i in range(orders) if is_poison(i))
    started = time.monotonic()

    with EmbeddedBroker(message_delay_level=FAST_DELAY_LEVELS) as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic(TOPIC, queues=4)
        print(f"broker on {broker.endpoint}; starting Spark with Delta Lake "
              f"(its log: {spark_log})...", flush=True)
        spark = delta_spark_session("pymq-demo", spark_log=spark_log)
        query, progress = start_pipeline(
            spark, broker.endpoint, TOPIC, GROUP, str(table), str(checkpoint),
            max_reconsume=MAX_RECONSUME,
        )
        producer = threading.Thread(target=produce, args=(broker.endpoint, orders), daemon=True)
        producer.start()
        print(f"producing {orders} orders to {TOPIC!r} ({expected_dead} poison, "
              f"1 in {FLAKY_EVERY} flaky)", flush=True)
        try:
            wait_until_done(query, progress, admin, GROUP, orders - expected_dead, expected_dead)
        finally:
            query.stop()
        producer.join()
        commit_group_progress(query, broker.endpoint, GROUP)

        rows = spark.read.format("delta").load(str(table))
        delivered = rows.count()
        distinct = rows.select("msg_id").distinct().count()
        after_retry = rows.filter("reconsume_times > 0").count()
        counts = retry_dlq_counts(admin, [GROUP]).iloc[0]
        dead = admin.dead_letters(GROUP)
        lag = int(admin.group_progress(GROUP)["lag"].sum())
        print()
        print("summary")
        print(f"  delivered      {delivered} (in the Delta table {table}, "
              f"{delivered - distinct} duplicates; {after_retry} after a retry)")
        print(f"  retried        {counts['retried']} (sent back to %RETRY%{GROUP})")
        print(f"  dead-lettered  {counts['dead_letters']} "
              f"(in %DLQ%{GROUP}, each after {MAX_RECONSUME} retries)")
        print(f"  lag            {lag}")
        print(f"  micro-batches  {progress.batches}")
        print(f"  took           {time.monotonic() - started:.1f} s")
        print()
        print("first dead letters:")
        print(dead[["origin_topic", "reconsume_times", "reason"]].head(3).to_string(index=False))
        print(flush=True)
        write_charts(admin, out)
        spark.stop()


if __name__ == "__main__":
    main()
