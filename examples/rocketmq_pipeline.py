"""The pymq pipeline against a real Apache RocketMQ cluster (``namesrvAddr``): good rows to a
table, failed rows back to RocketMQ's own ``%RETRY%`` topic, poison to ``%DLQ%``.

    python examples/rocketmq_pipeline.py --namesrv-addr 127.0.0.1:9876 [--topic orders] [--out out]

What it does, with nothing but RocketMQ's name servers and brokers:

1. A pymq ``Producer(namesrv_addr=...)`` sends orders to ``--topic`` (1 in 50 is
   poison: its amount is invalid, it always fails). The topic must exist on the
   cluster (``mqadmin updateTopic -n NS -c CLUSTER -t orders``) or the brokers
   must auto-create topics.
2. A Structured Streaming query reads the topic and ``%RETRY%<group>`` with
   ``format("pymq").option("namesrvAddr", ...)`` (every queue of every broker of
   the route); in ``foreachBatch`` valid orders are appended to a parquet table
   and invalid ones are written back with ``action=reconsumeLater``:
   RocketMQ's ``CONSUMER_SEND_MSG_BACK``, so the brokers' own retry ladder
   (``SCHEDULE_TOPIC_XXXX`` delay levels) applies and, after
   ``--max-reconsume-times``, ``%DLQ%<group>``.
3. It stops when every good order is in the table and every poison one in the
   DLQ, then prints a summary. The group's progress is on the brokers:
   ``mqadmin consumerProgress -n NS -g <group>`` shows its lag.

How long the retries take depends on the brokers' ``messageDelayLevel`` (a first
retry waits level 3, 10 s by default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "connector" / "pyspark_pymq").is_dir():  # a checkout: its pymq, for Spark's workers too
    SOURCE_DIRS = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
    sys.path[:0] = SOURCE_DIRS
    os.environ["PYTHONPATH"] = os.pathsep.join([*SOURCE_DIRS, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark_pymq import Message, Producer, PullConsumer  # noqa: E402
from pyspark_pymq.errors import TopicNotExistError  # noqa: E402

POISON_EVERY = 50
TABLE_SCHEMA = "order string, msg_id string, reconsume_times int"


def produce(namesrv: str, topic: str, orders: int) -> int:
    """Send the orders; returns how many are poison."""
    with Producer(namesrv_addr=namesrv) as producer:
        producer.send_batch([
            Message(topic, json.dumps({"id": i, "amount": -1 if i % POISON_EVERY == 7 else 10 + i})
                    .encode(), keys=[f"order-{i}"], tags="created")
            for i in range(orders)
        ])
    return sum(1 for i in range(orders) if i % POISON_EVERY == 7)


def dead_letters(namesrv: str, group: str) -> int:
    consumer = PullConsumer(group=f"{group}-dlq-reader", namesrv_addr=namesrv)
    try:
        queues = consumer.queues(f"%DLQ%{group}")
    except TopicNotExistError:
        return 0
    return sum(consumer.max_offset(mq) - consumer.min_offset(mq) for mq in queues)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="pymq on Apache RocketMQ: stream, retry, dead letters")
    p.add_argument("--namesrv-addr", required=True, help="RocketMQ name servers, host:9876;host2:9876")
    p.add_argument("--topic", default="orders")
    p.add_argument("--group", default=f"billing-{uuid.uuid4().hex[:6]}")
    p.add_argument("--orders", type=int, default=500)
    p.add_argument("--max-reconsume-times", type=int, default=2)
    p.add_argument("--out", default="out/rocketmq")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    ns, topic, group = args.namesrv_addr, args.topic, args.group
    out = Path(args.out).resolve()
    table, checkpoint = out / "orders", out / "checkpoint"
    shutil.rmtree(out, ignore_errors=True)

    from pyspark.sql import SparkSession
    from pyspark.sql.utils import is_remote

    spark = (SparkSession.builder.master("local[2]").appName("pymq-rocketmq")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    if not is_remote():  # Spark Connect (SPARK_API_MODE=connect) has no SparkContext
        spark.sparkContext.setLogLevel("ERROR")
    poison = produce(ns, topic, args.orders)
    print(f"sent {args.orders} orders to {topic!r} on {ns} ({poison} poison)", flush=True)

    def each_batch(df: Any, batch_id: int) -> None:
        df = df.selectExpr("*", "get_json_object(CAST(body AS STRING), '$.amount') AS amount")
        df.filter("amount > 0").selectExpr("CAST(body AS STRING) AS order", "msg_id", "reconsume_times") \
            .write.mode("append").parquet(str(table))
        (df.filter("amount <= 0").withColumn("error", df.amount.cast("string")).drop("amount")
         .write.format("pymq").option("namesrvAddr", ns).option("action", "reconsumeLater")
         .option("consumerGroup", group).option("maxReconsumeTimes", args.max_reconsume_times)
         .mode("append").save())

    query = (spark.readStream.format("pymq").option("namesrvAddr", ns).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(each_batch).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="1 second").start())
    good = args.orders - poison
    deadline = time.monotonic() + args.timeout
    delivered = dead = 0
    try:
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            delivered = spark.read.schema(TABLE_SCHEMA).parquet(str(table)).count() if table.exists() else 0
            dead = dead_letters(ns, group)
            if delivered >= good and dead >= poison:
                break
            time.sleep(1.0)
    finally:
        query.stop()
    print("summary")
    print(f"  delivered      {delivered} (in the parquet table {table})")
    print(f"  dead-lettered  {dead} (in %DLQ%{group}, after {args.max_reconsume_times} retries each)")
    print(f"  progress       mqadmin consumerProgress -n '{ns}' -g {group}")
    spark.stop()
    if delivered < good or dead < poison:
        sys.exit(f"timed out after {args.timeout:.0f} s: {delivered}/{good} delivered, {dead}/{poison} dead")


if __name__ == "__main__":
    main()
