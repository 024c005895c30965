#!/usr/bin/env python
"""Spark's own Kafka connector on a real Kafka broker, next to the pymq connector on its broker.

Issue 19: what a user would pick instead of pymq is Spark's built-in Kafka source and sink.
In one run, one Spark session (``local[2]``, the same settings for both), alternating, the
same rows (``--rows`` x ``--body`` bytes) into topics of 4 partitions / 4 queues:

- sink: ``df.write`` (Spark's Kafka writer, an explicit ``partition = id % 4`` column, since
  without a key it spreads rows unevenly; pymq with ``sendMode=async``), rows/s over ``save()``;
- source: ``spark.readStream`` from the earliest offsets -> ``noop``, ``Trigger.AvailableNow``:
  rows/s over the micro-batches that read data and over the wall clock from ``start()`` to
  the end;
- batch read: ``spark.read`` of the whole topic -> ``noop``.

Brokers, both started and stopped by the script (also on Ctrl-C or an error), on loopback
with free ports and their data under one temporary directory:

- ``kafka``: Apache Kafka 4.1.2, KRaft combined mode (one JVM is broker and controller),
  G1, 1 GiB heap (what ``kafka-server-start.sh`` uses), default broker settings; Spark's
  connector is spark-sql-kafka-0-10 4.2.0 with kafka-clients 3.9.2, on ``spark.jars``;
- ``pymq``: the embedded broker, a ``python -m pymq_broker`` process, ASYNC_FLUSH.

Each figure is the median of ``--runs`` runs after ``--warmups`` unmeasured rounds (Kafka's
sink keeps getting faster over its first runs: JIT of both JVMs). Besides rows/s: CPU µs per
row of each process kind (Spark JVM, Python workers, the broker, this driver), and the cores
other processes used meanwhile. The report marks issue 19's targets: every pymq / Kafka
ratio ≥ 1.0, CPU per row within 1.2x of Kafka's.

The payloads differ: pymq's rows carry TAGS and UNIQ_KEY properties and its source returns
more columns than Kafka's (the report counts them); ``--pymq-schema kafka`` has pymq read only
the columns that match Kafka's (``.schema(...)``: Spark's Python data sources get no column
pruning from ``select()``).

    .venv/bin/python benchmarks/bench_vs_kafka.py              # 1M rows of 200 B, median of 3
    .venv/bin/python benchmarks/bench_vs_kafka.py --quick      # 100k rows, 1 run (make bench)
    .venv/bin/python benchmarks/bench_vs_kafka.py --rows 300000 --runs 5 --wait-quiet 0
    .venv/bin/python benchmarks/bench_vs_kafka.py --pymq-schema kafka   # pymq reads Kafka's columns

Needs java and the jars (``make kafka``: Maven Central into .venv/kafka-4.1.2).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import side_by_side as sbs

sbs.use_repository()

from broker_process import BrokerProcess  # noqa: E402

KAFKA_VERSION = "4.1.2"
KAFKA_HOME = sbs.ROOT / ".venv" / f"kafka-{KAFKA_VERSION}"  # `make kafka` fills lib/ and spark/
BACKENDS = ("kafka", "pymq")
PARTITIONS = 4
RATIO_TARGET = 1.0  # pymq / Kafka rows/s, every figure
CPU_TARGET = 1.2  # pymq / Kafka CPU per row, at most


# -- the Kafka broker ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when this script dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class KafkaBroker:
    """One KRaft process (broker and controller) on 127.0.0.1, data under ``base_dir``."""

    def __init__(self, base_dir: Path, heap: str = "1g") -> None:
        self.base_dir = base_dir
        self.heap = heap
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = base_dir / "kafka.out"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _classpath(self) -> str:
        lib = KAFKA_HOME / "lib"
        if not (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
            raise SystemExit(f"no Kafka jars in {lib}: run `make kafka` first")
        return str(lib / "*")

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port = controller = _free_port()
        while controller == self.port:  # both were free a moment ago; the kernel may hand one out twice
            controller = _free_port()
        props = self.base_dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.base_dir / 'data'}",
            # one broker: the internal topics cannot have the default 3 replicas
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "",
        ]))
        java = ["java", "-cp", self._classpath()]
        # Kafka's UUIDs are URL-safe base64 without padding, and (as Kafka's Uuid.randomUuid) never
        # begin with "-", which the tool's argument parser would take for an option. With static
        # voters the storage is formatted without --standalone.
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        fmt = subprocess.run([*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
                             capture_output=True, text=True, check=False)
        if fmt.returncode != 0:
            raise RuntimeError(f"kafka storage format failed:\n{fmt.stdout}{fmt.stderr}")
        # The JVM flags kafka-server-start.sh / kafka-run-class.sh use.
        jvm = [f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
               "-Djava.awt.headless=true"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([java[0], *jvm, *java[1:], "kafka.Kafka", str(props)],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kafka exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"kafka did not listen within {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (a clean shutdown takes a few seconds), SIGKILL if it takes longer."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- Spark's Kafka connector as a benchmark target ----------------------------------------------


def spark_kafka_jars() -> list[str]:
    """The four jars of Spark's Kafka connector (its Scala and Hadoop are Spark's own)."""
    jars = sorted(str(j) for j in (KAFKA_HOME / "spark").glob("*.jar"))
    if len(jars) != 4:
        raise SystemExit(f"expected the 4 jars of Spark's Kafka connector in {KAFKA_HOME / 'spark'}, "
                         f"found {len(jars)}: run `make kafka` first")
    return jars


@dataclass
class KafkaTarget:
    """Spark's Kafka source and sink; topics made and counted with kafka-clients' Admin in Spark's JVM
    (no tool JVM to start per topic)."""

    spark: Any
    bootstrap: str
    broker_pids: set[int]
    df: Any  # the rows to write: "value" (binary) and "partition" (int)
    name: str = "kafka"
    _admins: list[Any] = field(default_factory=list)

    def _admin(self) -> Any:
        if not self._admins:
            jvm = self.spark.sparkContext._jvm
            props = jvm.java.util.Properties()
            props.put("bootstrap.servers", self.bootstrap)
            self._admins.append(jvm.org.apache.kafka.clients.admin.Admin.create(props))
        return self._admins[0]

    def close(self) -> None:
        for admin in self._admins:
            with contextlib.suppress(Exception):
                admin.close()
        self._admins.clear()

    def make_topic(self, topic: str, timeout_s: float = 60.0) -> None:
        jvm = self.spark.sparkContext._jvm
        optional = jvm.java.util.Optional
        # replication factor: the broker's default (1); Optional avoids passing a Java short.
        new = jvm.org.apache.kafka.clients.admin.NewTopic(topic, optional.of(PARTITIONS), optional.empty())
        topics = jvm.java.util.ArrayList()
        topics.add(new)
        deadline = time.monotonic() + timeout_s
        while True:  # right after start the controller may not have elected itself yet
            try:
                self._admin().createTopics(topics).all().get()
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kafka: cannot create {topic}: {exc}") from exc
                time.sleep(0.5)
        # wait until every partition has a leader, as Spark's writer looks them up
        self.wait_for(topic, 0)

    def per_partition(self, topic: str) -> list[int]:
        jvm = self.spark.sparkContext._jvm
        admin_pkg = jvm.org.apache.kafka.clients.admin
        specs = jvm.java.util.HashMap()
        parts = [jvm.org.apache.kafka.common.TopicPartition(topic, i) for i in range(PARTITIONS)]
        for tp in parts:
            specs.put(tp, admin_pkg.OffsetSpec.latest())
        got = self._admin().listOffsets(specs).all().get()
        return [int(got.get(tp).offset()) for tp in parts]  # topics are fresh: they start at 0

    def wait_for(self, topic: str, rows: int) -> list[int]:
        def per_queue() -> list[int]:
            try:
                return self.per_partition(topic)
            except Exception:  # a partition without a leader yet
                return []

        return sbs.wait_settled(f"kafka: {topic}", rows, per_queue)

    def write(self, topic: str) -> None:
        (self.df.write.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
         .option("topic", topic).mode("append").save())

    def read(self, builder: Any, topic: str, group: str) -> Any:
        # Spark's Kafka source assigns partitions itself and makes up its own group ids: ``group``
        # has nothing to set. Batch reads default to the earliest offsets too.
        return (builder.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", topic).option("startingOffsets", "earliest").load())


# -- report -------------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def report(results: sbs.Results, runs: int, rows: int, columns: dict[str, int]) -> list[str]:
    """Prints the tables; returns the targets missed."""
    both = all(results.median("sink", b) is not None for b in BACKENDS)
    print(f"\nrows/s, median of {runs} (min-max); pymq / Kafka in the same run; target: every ratio "
          f"≥ {RATIO_TARGET:.1f}\n")
    print("| figure | Kafka rows/s | pymq rows/s | pymq / Kafka | target |")
    print("|---|---|---|---|---|")
    missed: list[str] = []
    for figure in sbs.FIGURES:
        cells = []
        for b in BACKENDS:
            got = results.samples.get((figure, b), [])
            rates = [s.rate for s in got]
            spread = f" ({sbs.kilo(min(rates))}-{sbs.kilo(max(rates))})" if len(rates) > 1 else ""
            cells.append(f"{sbs.kilo(results.median(figure, b) or 0.0)}{spread}" if rates else "-")
        kafka, pymq = results.median(figure, "kafka"), results.median(figure, "pymq")
        ratio = pymq / kafka if pymq and kafka else None
        if ratio is not None and ratio < RATIO_TARGET:
            missed.append(f"{sbs.FIGURE_NAMES[figure]}: {ratio:.2f}")
        verdict = _verdict(ratio >= RATIO_TARGET) if ratio is not None else "-"
        print(f"| {sbs.FIGURE_NAMES[figure]} | {cells[0]} | {cells[1]} | "
              f"{f'{ratio:.2f}' if ratio is not None else '-'} | {verdict} |")

    print(f"\nCPU µs per row per process kind, median over the runs (readStream: the whole query); "
          f"target: pymq's all ≤ {CPU_TARGET:.1f}x Kafka's; other load = cores used by processes "
          f"not of this run\n")
    print("| figure | backend | " + " | ".join(sbs.KINDS) + " | all | pymq / Kafka | target | other load |")
    print("|---|---|" + "---|" * (len(sbs.KINDS) + 4))
    for figure in ("sink", "stream", "batch"):
        per_row = {b: results.cpu_median(figure, b) for b in BACKENDS}
        name = sbs.FIGURE_NAMES[figure].split(",")[0]  # the stream's CPU is the whole query's
        for b in BACKENDS:
            cpu = per_row[b]
            if cpu is None:
                continue
            us = {k: v * 1e6 / rows for k, v in cpu.items()}
            ratio_cell = verdict = ""
            base = per_row["kafka"]
            if b == "pymq" and base is not None and base["all"] > 0:
                cpu_ratio = cpu["all"] / base["all"]
                ratio_cell, verdict = f"{cpu_ratio:.2f}", _verdict(cpu_ratio <= CPU_TARGET)
                if cpu_ratio > CPU_TARGET:
                    missed.append(f"CPU per row, {name}: {cpu_ratio:.2f}x")
            print(f"| {name} | {b} | " + " | ".join(f"{us[k]:.2f}" for k in sbs.KINDS)
                  + f" | {us['all']:.2f} | {ratio_cell} | {verdict} | "
                  f"{results.other_load(figure, b) or 0.0:.2f} |")
    print(f"\ncolumns a read returns: {', '.join(f'{b} {n}' for b, n in columns.items())}; pymq's rows also "
          f"carry TAGS and UNIQ_KEY properties, Kafka's only the value (and the partition it was sent to)")
    if both:
        print(f"\nissue 19 targets: {len(missed)} missed" + "".join(f"\n  - {m}" for m in missed))
    return missed


# -- main ---------------------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that the brokers and Spark stop in `finally`


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=200, help="body size in bytes")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmups", type=int, default=2,
                    help="unmeasured rounds first (Kafka's sink is still warming up after one)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="kafka, pymq or both")
    ap.add_argument("--kafka-heap", default="1g", help="the Kafka JVM's -Xms/-Xmx")
    ap.add_argument("--pymq-schema", default="", metavar="DDL",
                    help=f"pymq reads keep only these source columns (.schema(DDL)); "
                         f"'kafka': the ones Kafka's source returns ({sbs.KAFKA_LIKE_COLUMNS})")
    sbs.add_wait_quiet_argument(ap)
    ap.add_argument("--quick", action="store_true", help="100,000 rows, 1 run (CI-scale)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.runs, args.wait_quiet = 100_000, 1, min(args.wait_quiet, 20.0)
    backends = [b for b in args.backends.split(",") if b]
    if not backends or set(backends) - set(BACKENDS):
        ap.error(f"--backends: choose from {BACKENDS}")
    rows = args.rows
    jars = spark_kafka_jars()

    print(f"# Spark's Kafka connector on Apache Kafka {KAFKA_VERSION} and the pymq connector on its broker")
    command = [Path(sys.executable).name, "benchmarks/bench_vs_kafka.py", *(argv or sys.argv[1:])]
    print(f"command: `{' '.join(command)}`")
    print(sbs.machine_line(f"Kafka {KAFKA_VERSION} (KRaft, {args.kafka_heap} heap)",
                       "Spark connector " + ", ".join(Path(j).stem for j in jars)))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{rows:,} rows of {args.body} B per figure, {PARTITIONS} partitions / queues, "
          f"{args.runs} run(s) after {args.warmups} warm-up round(s)")
    sys.stdout.flush()

    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin

    signal.signal(signal.SIGTERM, _interrupt)
    work = Path(tempfile.mkdtemp(prefix="pymq-bench-kafka-"))
    spark: Any = None
    kafka: KafkaBroker | None = None
    broker: BrokerProcess | None = None
    kafka_target: KafkaTarget | None = None
    try:
        started = time.perf_counter()
        if "kafka" in backends:  # first, from the main thread, before Spark's: see _die_with_parent
            kafka = KafkaBroker(work / "kafka", heap=args.kafka_heap).start()
        if "pymq" in backends:
            broker = BrokerProcess(work / "pymq").start()
        print(f"brokers started in {time.perf_counter() - started:.1f} s", flush=True)

        spark = (SparkSession.builder.master("local[2]").appName("pymq-bench-vs-kafka")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "4g").config("spark.jars", ",".join(jars)).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        sbs.SPARK_JVM[0] = spark.sparkContext._gateway.proc.pid
        body = f"CAST(repeat('x', {args.body}) AS BINARY)"
        targets: dict[str, Any] = {}
        if kafka is not None:
            kafka_df = spark.range(rows, numPartitions=2).selectExpr(
                f"{body} AS value", f"CAST(id % {PARTITIONS} AS INT) AS partition").cache()
            kafka_df.count()
            kafka_target = KafkaTarget(spark, kafka.bootstrap, {kafka.pid}, kafka_df)
            targets["kafka"] = kafka_target
        if broker is not None:
            ep = broker.endpoint

            def pymq_topic(topic: str, ep: str = ep) -> None:
                Admin(ep).create_topic(topic, queues=PARTITIONS)

            pymq_df = spark.range(rows, numPartitions=2).selectExpr(f"{body} AS body").cache()
            pymq_df.count()
            schema = sbs.KAFKA_LIKE_COLUMNS if args.pymq_schema == "kafka" else args.pymq_schema
            targets["pymq"] = sbs.PymqTarget("pymq", "endpoint", ep, {broker.pid}, pymq_topic, pymq_df,
                                             schema=schema)

        results = sbs.run_rounds(spark, [targets[b] for b in backends], rows, work, runs=args.runs,
                             warmups=args.warmups, wait_quiet_s=args.wait_quiet)
        columns = {b: len(t.read(spark.read, f"bench-{b}-0", "").columns) for b, t in targets.items()}
        report(results, args.runs, rows, columns)
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if kafka_target is not None:
            kafka_target.close()
        if spark is not None:
            spark.stop()
        if broker is not None:
            broker.stop()
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
