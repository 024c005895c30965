"""A Spark driver for crash tests: pymq topic -> pymq topic, through the source and the sink.

    python forward_job.py ENDPOINT SRC DST GROUP CHECKPOINT (run|finish)

``run`` streams small micro-batches until killed; ``finish`` drains what is left
(Trigger.AvailableNow) and exits.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC_DIRS = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
sys.path[:0] = SRC_DIRS
os.environ["PYTHONPATH"] = os.pathsep.join([*SRC_DIRS, os.environ.get("PYTHONPATH", "")])
os.environ["PYSPARK_PYTHON"] = sys.executable


def main() -> None:
    endpoint, src, dst, group, checkpoint, mode = sys.argv[1:7]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("pymq-forward")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.format("pymq").option("endpoint", endpoint).option("topic", src)
          .option("consumerGroup", group).option("startingOffsets", "earliest")
          .option("maxMessagesPerTrigger", 300).load()
          .selectExpr("body", "keys", "tags"))
    writer = (df.writeStream.format("pymq").option("endpoint", endpoint).option("topic", dst)
              .option("checkpointLocation", checkpoint))
    if mode == "finish":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        query = writer.trigger(processingTime="100 milliseconds").start()
        print("started", flush=True)
        query.awaitTermination()


if __name__ == "__main__":
    main()
