"""A Spark driver whose write task fails once, after part of its rows reached the broker.

    python task_retry_job.py ENDPOINT TOPIC [TOPIC ...]

For each topic, ``df.write.format("pymq")`` of 1000 rows in one partition
(bodies ``"<i>:xxx..."`` of 2 KB, so that the workers' output buffers flush).
The first attempt of the task stops (an upstream error) after 500 rows, once
the broker holds 200 of them (the rest may still be in Spark's buffers); Spark
runs the task again (``local[2,2]``: two attempts), and the second attempt
sends all 1000 rows, with the same UNIQ_KEYs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for source_tree
from source_tree import use_source_tree

use_source_tree()

ROWS, FAIL_AFTER, SENT_BEFORE_FAILURE = 1000, 500, 200
PAD = "x" * 2000


def main() -> None:
    endpoint, topics = sys.argv[1], sys.argv[2:]
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,2]").appName("pymq-task-retry")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    for topic in topics:

        def fail_first_attempt(
            batches: Iterator[pa.RecordBatch], topic: str = topic
        ) -> Iterator[pa.RecordBatch]:
            from pyspark_pymq import Admin

            ctx = TaskContext.get()
            sent = 0
            for batch in batches:
                ids = batch.column(0).to_pylist()
                yield pa.record_batch([pa.array([f"{i}:{PAD}" for i in ids])], names=["body"])
                sent += batch.num_rows
                if ctx is not None and ctx.attemptNumber() == 0 and sent >= FAIL_AFTER:
                    deadline = time.monotonic() + 30  # until the sink has sent what came before
                    while time.monotonic() < deadline:
                        stored = int(Admin(endpoint).topic_stats(topic)["max_offset"].sum())
                        if stored >= SENT_BEFORE_FAILURE:
                            break
                        time.sleep(0.05)
                    raise RuntimeError("injected failure of the first attempt")

        (spark.range(0, ROWS, 1, 1).mapInArrow(fail_first_attempt, "body string")
         .write.format("pymq").option("endpoint", endpoint).option("topic", topic)
         .option("maxBatchBytes", 16384).mode("append").save())
        print(f"wrote {topic}", flush=True)


if __name__ == "__main__":
    main()
