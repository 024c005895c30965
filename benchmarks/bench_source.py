"""Throughput of the pymq Spark source: readStream -> noop sink, in messages per second.

For each body size, the script fills a topic on a local broker process, then
runs the same Trigger.AvailableNow query twice against two sources with the same
schema and the same number of partitions:

- ``pymq``: the real source, pulling from the broker on this machine;
- ``synthetic``: an in-memory Python data source that yields ready-made Arrow
  batches of the same rows: what Spark itself can take in from a Python source
  (the ceiling for any Python connector on this machine).

It prints msgs/s for both and their ratio. Throughput is rows over the time of
the batches that read data (``triggerExecution`` in query progress), so query
start-up is left out; the wall time of the whole query is printed as well, and
the CPU time per message of every process involved (broker, JVM, Python
workers; Linux), which other load on the machine disturbs much less than msgs/s.
After one warm-up query (JIT, Python workers), each query runs ``--runs``
times, alternating (fresh checkpoint each time), and the best run counts.

Usage::

    .venv/bin/python benchmarks/bench_source.py                 # 1M messages, 200 B and 1 KiB
    .venv/bin/python benchmarks/bench_source.py --messages 300000 --sizes 200
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = [str(ROOT / "connector"), str(ROOT / "broker_stub"), str(ROOT / "proto")]
sys.path[:0] = [*SOURCE_DIRS, str(ROOT / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join(
    SOURCE_DIRS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: E402

SYNTHETIC_ROWS_PER_BATCH = 8192


class SyntheticPartition(InputPartition):
    def __init__(self, index: int, rows: int, body_size: int, rows_per_batch: int) -> None:
        super().__init__(index)
        self.rows = rows
        self.body_size = body_size
        self.rows_per_batch = rows_per_batch


class SyntheticStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``rows`` messages in ``partitions`` partitions, as prebuilt Arrow batches."""

    def __init__(self, options: dict[str, str]) -> None:
        self.rows = int(options["rows"])
        self.partitions_n = int(options["partitions"])
        self.body_size = int(options["bodysize"])
        self.rows_per_batch = int(options.get("rowsperbatch", SYNTHETIC_ROWS_PER_BATCH))

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"rows": self.rows}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        total = end["rows"] - start["rows"]
        share, extra = divmod(total, self.partitions_n)
        return [
            SyntheticPartition(
                i, share + (1 if i < extra else 0), self.body_size, self.rows_per_batch
            )
            for i in range(self.partitions_n)
            if share or i < extra
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SyntheticPartition)
        batch = _synthetic_batch(partition.body_size, partition.rows_per_batch)
        left = partition.rows
        while left > 0:
            take = min(left, batch.num_rows)
            yield batch if take == batch.num_rows else batch.slice(0, take)
            left -= take


_BATCHES: dict[tuple[int, int], Any] = {}


def _synthetic_batch(body_size: int, rows: int) -> Any:
    """One batch of the source schema, built once per worker from real records."""
    batch = _BATCHES.get((body_size, rows))
    if batch is None:
        from pymq_proto.record import encode_properties, encode_record, store_host_bytes
        from pyspark_pymq.backend.pymq_arrow import decode_to_arrow

        host = store_host_bytes("127.0.0.1", 8081)
        records = b"".join(
            encode_record(
                topic=b"bench", queue_id=0, flag=0, body=b"x" * body_size,
                properties=encode_properties(
                    {"TAGS": "bench", "UNIQ_KEY": f"{i:032X}"}
                ),
                queue_offset=i, physical_offset=i * 400, sys_flag=0,
                born_timestamp=1_700_000_000_000, store_timestamp=1_700_000_000_001,
                store_host=host, reconsume_times=0,
            )
            for i in range(rows)
        )
        batch = decode_to_arrow(records, topic="bench", broker_name="broker-a", retry=False)
        _BATCHES[(body_size, rows)] = batch
    return batch


class SyntheticSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pymq_synthetic"

    def schema(self) -> Any:
        from pyspark_pymq.spark.schema import source_schema

        return source_schema()

    def streamReader(self, schema: Any) -> SyntheticStream:
        return SyntheticStream(dict(self.options))


def fill_topic(endpoint: str, topic: str, messages: int, body_size: int, queues: int) -> float:
    """Send ``messages`` bodies of ``body_size`` bytes; returns msgs/s of the fill."""
    from pymq_proto.record import encode_properties
    from pyspark_pymq import Admin, Producer
    from pyspark_pymq.client.message import new_uniq_key

    Admin(endpoint).create_topic(topic, queues=queues)
    producer = Producer(endpoint)
    body = b"x" * body_size
    chunk = max(1, min(4096, (2 << 20) // (body_size + 100)))
    started = time.perf_counter()
    sent = 0
    queue = 0
    while sent < messages:
        n = min(chunk, messages - sent)
        keys = [new_uniq_key() for _ in range(n)]
        props = [encode_properties({"TAGS": "bench", "UNIQ_KEY": k}) for k in keys]
        producer.send_encoded(topic, [body] * n, props, keys, queue_id=queue)
        queue = (queue + 1) % queues
        sent += n
    return messages / (time.perf_counter() - started)


def tree_cpu_seconds() -> float:
    """CPU time of this process and all its descendants (broker, JVM, Python workers).

    Linux only (0.0 elsewhere). Each live process counts its own time plus its
    reaped children's (cutime), so short-lived workers are not lost.
    """
    proc = Path("/proc")
    if not proc.exists():
        return 0.0
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    me = os.getpid()
    total = 0
    for pid, t in ticks.items():
        p = pid
        while p > 1 and p != me:
            p = parent.get(p, 0)
        if p == me:
            total += t
    return total / os.sysconf("SC_CLK_TCK")


def run_query(spark: Any, reader: Any, checkpoint: Path) -> tuple[int, float, float, float]:
    """(rows, msgs/s over the data batches, wall seconds, CPU µs per message) of one
    AvailableNow query; CPU counts every process of the run (broker, JVM, workers)."""
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
    cpu_before = tree_cpu_seconds()
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - started
    cpu = tree_cpu_seconds() - cpu_before
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = 0
    busy_ms = 0
    for progress in query.recentProgress:
        if progress["numInputRows"]:
            rows += progress["numInputRows"]
            busy_ms += progress["durationMs"]["triggerExecution"]
    rate = rows / (busy_ms / 1000.0) if busy_ms else 0.0
    return rows, rate, wall, cpu * 1e6 / rows if rows else 0.0


def best(results: Sequence[tuple[int, float, float, float]]) -> tuple[int, float, float, float]:
    return max(results, key=lambda r: r[1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sizes", default="200,1024", help="body sizes in bytes")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pull-batch-size", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--quick", action="store_true", help="100,000 messages, 1 run (CI-scale)")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.runs = 100_000, 1

    from broker_process import BrokerProcess
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="pymq-bench-source-"))
    spark = (
        SparkSession.builder.master(args.master)
        .appName("pymq-bench-source")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(SyntheticSource)
    print(f"# pymq source benchmark  {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"Spark {spark.version}, master {args.master}")
    print(f"# load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# {args.messages} messages per run, {args.queues} queues, best of {args.runs} runs")
    print()
    header = (f"{'body':>6}  {'pymq msgs/s':>12}  {'MB/s':>6}  {'synthetic msgs/s':>16}  "
              f"{'ratio':>6}  {'pymq wall s':>11}  {'CPU us/msg pymq':>15}  "
              f"{'synthetic':>9}  {'fill msgs/s':>11}")
    print(header)
    try:
        with BrokerProcess(work / "broker") as broker:
            for size in (int(s) for s in args.sizes.split(",")):
                topic = f"bench-{size}"
                fill = fill_topic(broker.endpoint, topic, args.messages, size, args.queues)
                pymq = spark.readStream.format("pymq").option("endpoint", broker.endpoint) \
                    .option("topic", topic).option("consumerGroup", f"bench-{size}") \
                    .option("startingOffsets", "earliest")
                if args.pull_batch_size:
                    pymq = pymq.option("pullBatchSize", args.pull_batch_size)
                synthetic = spark.readStream.format("pymq_synthetic") \
                    .option("rows", args.messages).option("partitions", args.queues) \
                    .option("bodySize", size)
                # Warm up the JVM's JIT and the Python workers, then alternate the two
                # queries so that both see the same machine state.
                run_query(spark, synthetic, work / f"warm-{size}")
                runs_real, runs_ceiling = [], []
                for i in range(args.runs):
                    runs_real.append(run_query(spark, pymq, work / f"ck-{size}-{i}"))
                    runs_ceiling.append(run_query(spark, synthetic, work / f"cks-{size}-{i}"))
                real, ceiling = best(runs_real), best(runs_ceiling)
                if real[0] != args.messages:
                    raise RuntimeError(f"pymq read {real[0]} rows, expected {args.messages}")
                ratio = real[1] / ceiling[1] if ceiling[1] else 0.0
                mb = real[1] * size / 1e6
                print(f"{size:>6}  {real[1]:>12,.0f}  {mb:>6.0f}  {ceiling[1]:>16,.0f}  "
                      f"{ratio:>6.0%}  {real[2]:>11.1f}  {real[3]:>15.2f}  {ceiling[3]:>9.2f}  "
                      f"{fill:>11,.0f}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
