"""Quickstart: an embedded broker, a producer, and a Spark stream that reads it.

    python examples/quickstart.py

The stream's offsets live in its checkpoint: the second run of the same query
reads only what was sent since the first one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# A clone works without an install: the driver and Spark's Python workers import
# pymq from the repository, and workers run this interpreter.
_ROOT = Path(__file__).resolve().parent.parent
_PATHS = [str(_ROOT / d) for d in ("connector", "broker_stub", "proto") if (_ROOT / d).is_dir()]
for _p in reversed(_PATHS):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join([*_PATHS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
os.environ["PYSPARK_PYTHON"] = sys.executable

import json  # noqa: E402

from pymq_broker import EmbeddedBroker  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.utils import is_remote  # noqa: E402
from pyspark_pymq import Admin, Message, Producer  # noqa: E402


def send_orders(endpoint: str, ids: range) -> None:
    with Producer(endpoint) as producer:  # one by one: spread over the topic's queues
        for i in ids:
            producer.send(Message("orders", json.dumps({"id": i, "amount": 10 + i % 7}),
                                  tags="created", keys=[f"order-{i}"]))


def main() -> None:
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        endpoint = broker.endpoint
        Admin(endpoint).create_topic("orders", queues=4)
        send_orders(endpoint, range(100))
        print(f"sent 100 orders to 'orders' on {endpoint}")

        spark = (SparkSession.builder.master("local[2]").appName("pymq-quickstart")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        if not is_remote():  # Spark Connect (SPARK_API_MODE=connect) has no SparkContext
            spark.sparkContext.setLogLevel("ERROR")
        print(f"Spark {spark.version} ({'Spark Connect' if is_remote() else 'classic'})")
        orders = (spark.readStream.format("pymq")
                  .option("endpoint", endpoint)
                  .option("topic", "orders")
                  .option("consumerGroup", "quickstart")
                  .option("startingOffsets", "earliest")
                  .load()
                  .selectExpr("queue_id", "queue_offset", "CAST(body AS STRING) AS body", "tags",
                              "keys[0] AS key"))

        def run() -> int:
            """Run the stream over what is there now (Trigger.AvailableNow) into Parquet files."""
            before = spark.read.parquet(f"{tmp}/orders").count() if os.path.isdir(f"{tmp}/orders") else 0
            query = (orders.writeStream.format("parquet")
                     .option("checkpointLocation", f"{tmp}/checkpoint")
                     .trigger(availableNow=True).start(f"{tmp}/orders"))
            query.awaitTermination()
            return int(spark.read.parquet(f"{tmp}/orders").count()) - before

        print(f"first run: read {run()} orders")
        table = spark.read.parquet(f"{tmp}/orders")
        table.groupBy("queue_id").agg(F.count("*").alias("orders"),
                                      F.max("queue_offset").alias("last_offset")) \
            .orderBy("queue_id").show()
        table.orderBy("queue_id", "queue_offset").show(3, truncate=False)

        send_orders(endpoint, range(100, 150))
        print(f"second run (same checkpoint): read {run()} new orders")
        print("the group's progress on the broker is one run behind (Spark commits a batch's "
              "offsets when it plans the next one; the checkpoint is the source of truth):")
        print(Admin(endpoint).group_progress("quickstart", "orders").to_string(index=False))
        spark.stop()


if __name__ == "__main__":
    main()
