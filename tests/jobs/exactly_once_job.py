"""A Spark driver for the exactly-once crash tests: pymq topic -> pymq topic, deliveryGuarantee=exactly-once.

    python exactly_once_job.py ENDPOINT SRC DST GROUP CHECKPOINT (run|finish)

``run`` streams micro-batches of at most 400 messages until killed (the test
sets PYMQ_SINK_CRASH_AT, so the sink kills this driver at one stage of a
batch); ``finish`` drains what is left (Trigger.AvailableNow), then stays until
the broker has no unresolved transaction left (this driver answers the
check-backs of the killed run's half messages) and exits.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC_DIRS = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
sys.path[:0] = SRC_DIRS
os.environ["PYTHONPATH"] = os.pathsep.join([*SRC_DIRS, os.environ.get("PYTHONPATH", "")])
os.environ["PYSPARK_PYTHON"] = sys.executable


def main() -> None:
    endpoint, src, dst, group, checkpoint, mode = sys.argv[1:7]
    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin

    spark = (SparkSession.builder.master("local[2]").appName("pymq-exactly-once")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.format("pymq").option("endpoint", endpoint).option("topic", src)
          .option("consumerGroup", group).option("startingOffsets", "earliest")
          .option("maxMessagesPerTrigger", 400).load()
          .selectExpr("body", "keys"))
    writer = (df.writeStream.format("pymq").option("endpoint", endpoint).option("topic", dst)
              .option("deliveryGuarantee", "exactly-once").option("checkpointLocation", checkpoint))
    if mode == "finish":
        writer.trigger(availableNow=True).start().awaitTermination()
        deadline = time.monotonic() + 90
        while Admin(endpoint).broker_info()["transactionsPending"] != "0":
            if time.monotonic() > deadline:
                sys.exit("transactions still unresolved after 90 s")
            time.sleep(0.2)
    else:
        query = writer.trigger(processingTime="100 milliseconds").start()
        query.awaitTermination()


if __name__ == "__main__":
    main()
