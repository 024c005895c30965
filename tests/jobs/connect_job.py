"""A Spark Connect client (``remote("local[2]")``) that uses every Spark path of pymq once.

    python connect_job.py ENDPOINT TOPIC GROUP WORKDIR

TOPIC holds messages keyed ``ok-N`` and ``bad-N`` (made by the test). Under Spark Connect
there is no SparkContext and no accumulator, and a ``foreachBatch`` function runs on the
server: the batch read, the listener (concurrent and orderly), the stream into Parquet
through a ``foreachBatch`` that writes back with ``writeId``, a view and the stream sink
must all work there. Prints one JSON object of what Spark saw; the test checks the broker's side.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for source_tree
from source_tree import use_source_tree

use_source_tree()


def main() -> None:
    endpoint, topic, group, workdir = sys.argv[1:5]
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.utils import is_remote
    from pyspark_pymq import MessageExt
    from pyspark_pymq.spark.listener import (
        ConsumeConcurrentlyStatus,
        ConsumeOrderlyStatus,
        MessageListener,
    )

    spark = (SparkSession.builder.remote("local[2]").appName("pymq-connect")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
             .getOrCreate())
    out: dict[str, object] = {"remote": is_remote()}

    def source() -> DataFrame:
        return (spark.read.format("pymq").option("endpoint", endpoint).option("topic", topic)
                .load())

    def concurrently(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        if any((m.keys or [""])[0].startswith("bad") for m in msgs):
            raise ValueError("bad order")
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def orderly(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        bad = any((m.keys or [""])[0].startswith("bad") for m in msgs)
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT if bad else ConsumeOrderlyStatus.SUCCESS

    out["read"] = source().count()

    # Straight to the DLQ (delay level -1): the test finds each failure there at once.
    listener = MessageListener(endpoint, f"{group}-batch", concurrently, delay_level=-1)
    out["listener_good"] = listener.process(source(), "b1").count()
    out["listener_stats"] = vars(listener.last_stats)

    ordered = MessageListener(endpoint, f"{group}-orderly", orderly, orderly=True,
                              max_reconsume_times=1, suspend_current_queue_time_millis=0)
    out["orderly_good"] = ordered.process(source(), "b1").count()
    out["orderly_stats"] = vars(ordered.last_stats)

    def stream(consumer_group: str) -> DataFrame:  # small micro-batches: several batch ids
        return (spark.readStream.format("pymq").option("endpoint", endpoint).option("topic", topic)
                .option("consumerGroup", consumer_group).option("startingOffsets", "earliest")
                .option("maxMessagesPerTrigger", 7).load())

    streamed = MessageListener(endpoint, f"{group}-stream", concurrently, delay_level=-1)
    table = f"{workdir}/good"

    def each_batch(df: DataFrame, batch_id: int) -> None:  # runs on the Connect server
        good = streamed.process(df, batch_id)
        good.write.mode("append").parquet(table)
        (good.selectExpr("body", "keys").write.format("pymq").option("endpoint", endpoint)
         .option("topic", f"{topic}-good").option("writeId", f"good-{batch_id}").mode("append").save())

    (stream(f"{group}-stream").writeStream.foreachBatch(each_batch).trigger(availableNow=True)
     .option("checkpointLocation", f"{workdir}/checkpoint-listener").start().awaitTermination())
    out["parquet"] = spark.read.parquet(table).count()
    dead = (spark.read.format("pymq").option("endpoint", endpoint).option("view", "deadLetters")
            .option("consumerGroup", f"{group}-stream").load())
    out["dead_letter_keys"] = sorted(row["keys"][0] for row in dead.collect())

    (stream(f"{group}-copy").selectExpr("body", "keys").writeStream.format("pymq")
     .option("endpoint", endpoint).option("topic", f"{topic}-copy")
     .option("checkpointLocation", f"{workdir}/checkpoint-sink")
     .trigger(availableNow=True).start().awaitTermination())
    print(json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
