"""A Spark driver for crash tests: pymq topic -> pymq topic, through the source and the sink.

    python forward_job.py ENDPOINT SRC DST GROUP CHECKPOINT (run|finish) [exactly-once]

``run`` streams small micro-batches until killed; ``finish`` drains what is left
(Trigger.AvailableNow) and exits. With ``exactly-once`` the sink uses
deliveryGuarantee=exactly-once, and ``finish`` stays until the broker has no
unresolved transaction left (this driver answers the check-backs of a killed
run's half messages).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for source_tree
from source_tree import use_source_tree

use_source_tree()


def main() -> None:
    endpoint, src, dst, group, checkpoint, mode = sys.argv[1:7]
    exactly_once = sys.argv[7:] == ["exactly-once"]
    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin

    # Start-up speed over peak speed (C1 only): each driver lives for a few micro-batches of a crash
    # test, and C2's compiler threads compete for the CPUs with Spark's start.
    spark = (SparkSession.builder.master("local[2]").appName("pymq-forward")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.format("pymq").option("endpoint", endpoint).option("topic", src)
          .option("consumerGroup", group).option("startingOffsets", "earliest")
          .option("maxMessagesPerTrigger", 300).load()
          .selectExpr("body", "keys", "tags"))
    writer = (df.writeStream.format("pymq").option("endpoint", endpoint).option("topic", dst)
              .option("checkpointLocation", checkpoint))
    if exactly_once:
        writer = writer.option("deliveryGuarantee", "exactly-once")
    if mode == "finish":
        writer.trigger(availableNow=True).start().awaitTermination()
        deadline = time.monotonic() + 90
        while exactly_once and Admin(endpoint).broker_info()["transactionsPending"] != "0":
            if time.monotonic() > deadline:
                sys.exit("transactions still unresolved after 90 s")
            time.sleep(0.2)
    else:
        query = writer.trigger(processingTime="100 milliseconds").start()
        print("started", flush=True)
        query.awaitTermination()


if __name__ == "__main__":
    main()
