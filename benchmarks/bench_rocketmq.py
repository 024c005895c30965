#!/usr/bin/env python
"""The Spark connector against a real Apache RocketMQ 5.3.3 cluster, next to the embedded pymq broker.

Issue 15. In one run, alternating, the same three figures on each backend:

- sink: ``df.write.format("pymq")`` of ``--messages`` rows of 200 B binary bodies,
  ``sendMode=async``, into a fresh topic (rows/s over the ``save()``);
- source: ``spark.readStream`` of that topic (``startingOffsets=earliest``, a fresh
  consumer group) -> ``noop``, ``Trigger.AvailableNow``: msgs/s over the micro-batches
  that read data (``triggerExecution``, as ``bench_source.py``) and over the wall clock
  from ``start()`` to the end;
- batch read: ``spark.read`` of the whole topic -> ``noop`` (msgs/s over the ``save()``).

Backends (``--backends``):

- ``pymq``: the embedded broker, a ``python -m pymq_broker`` process
  (``.option("endpoint", ...)``), topics of 4 queues;
- ``rmq``: RocketMQ 5.3.3 (``.option("namesrvAddr", ...)``), one name server and
  broker-a + broker-b (tests/rocketmq_cluster.py), topics of 2 queues per broker;
  default broker settings: a broker answers at most ``maxTransferCountOnMessageInMemory``
  (32) messages per pull, and the backend pipelines up to 64 pulls per queue;
- ``rmq-raised``: a second cluster whose brokers answer up to 2000 messages / 4 MiB
  per pull (``maxTransferCountOnMessageInMemory=2000``,
  ``maxTransferBytesOnMessageInMemory=4194304``): what raising them gains.

The RocketMQ JVMs run with the JIT's full tiers and G1, 1 GiB heap (the test fixture
starts them with C1 only and SerialGC, for start-up speed; ``--fixture-jvm`` keeps
that). RocketMQ's consume queues lag the send acknowledgement a little: the script waits
until the topic's max offsets add up to the rows sent before it reads.

Each figure is the median of ``--runs`` runs (min-max shown) after one warm-up round
(JIT of every JVM, Python workers); within a round the backends take turns and the
order rotates from round to round. During a backend's turn the others' processes are stopped
(SIGSTOP; ``--no-pause`` keeps them running): an idle RocketMQ cluster takes ~0.27 of the 2
cores. Besides msgs/s: CPU seconds of each process kind
(Spark JVM, Python workers, the broker process or the cluster's JVMs) and the cores
other processes used meanwhile (Linux /proc).

    .venv/bin/python benchmarks/bench_rocketmq.py                  # 1M messages, 3 runs (~6 min)
    .venv/bin/python benchmarks/bench_rocketmq.py --quick          # 100k messages, 1 run
    .venv/bin/python benchmarks/bench_rocketmq.py --backends pymq,rmq --runs 5
    .venv/bin/python benchmarks/bench_rocketmq.py --schema "body binary"   # reads keep the body alone

Needs java and the RocketMQ jars (``make rocketmq``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from side_by_side import (
    FIGURE_NAMES,
    FIGURES,
    KAFKA_LIKE_COLUMNS,
    KINDS,
    SPARK_JVM,
    PymqTarget,
    Results,
    add_wait_quiet_argument,
    kilo,
    machine_line,
    run_rounds,
    use_repository,
)

use_repository()

from broker_process import BrokerProcess  # noqa: E402
from rocketmq_cluster import ROCKETMQ_VERSION, RocketMQCluster  # noqa: E402
from rocketmq_cluster import _Proc as JvmProc  # noqa: E402

BACKENDS = ("pymq", "rmq", "rmq-raised")
RAISED_CONF = {
    "maxTransferCountOnMessageInMemory": "2000",
    "maxTransferBytesOnMessageInMemory": str(4 << 20),
}
TARGETS = {"sink": 300_000.0, "stream": 500_000.0}


# -- the RocketMQ cluster, tuned for throughput rather than start-up ----------------------------


class BenchCluster(RocketMQCluster):
    """The test fixture's cluster; its name server and brokers get C2 and G1 unless ``fixture_jvm``."""

    test_broker_conf: Mapping[str, str] = {}  # RocketMQ's own settings, as users run it

    def __init__(self, base_dir: Path, *, fixture_jvm: bool, **kwargs: Any) -> None:
        super().__init__(base_dir, **kwargs)
        self.fixture_jvm = fixture_jvm

    def _java(self, home_name: str, *, heap: str, logback: str, classes: Path | None = None) -> list[str]:
        cmd = super()._java(home_name, heap=heap, logback=logback, classes=classes)
        if self.fixture_jvm or (home_name != "namesrv" and home_name not in self.broker_names):
            return cmd
        drop = {"-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Xmx{heap}"}
        size = "1g" if home_name != "namesrv" else heap
        return [cmd[0], f"-Xms{size}", f"-Xmx{size}", "-XX:+UseG1GC",
                *(a for a in cmd[1:] if a not in drop)]

    def _broker_proc(self, name: str, port: int) -> JvmProc:
        proc = super()._broker_proc(name, port)
        if not self.fixture_jvm:  # the fixture adds -Xms256m and 512 MiB of direct memory
            proc.cmd = [a for a in proc.cmd if a != "-Xms256m"]
            proc.cmd = [("-XX:MaxDirectMemorySize=1g" if a.startswith("-XX:MaxDirectMemorySize") else a)
                        for a in proc.cmd]
        return proc

    def jvm_pids(self) -> set[int]:
        return {p.popen.pid for p in self._procs.values() if p.popen is not None}


# -- report -------------------------------------------------------------------------------------


def report(results: Results, backends: Sequence[str], runs: int, rows: int) -> None:
    print(f"\nmsgs/s, median of {runs} (min-max); ratio to pymq (the embedded broker) in the same run\n")
    head = " | ".join(f"{b} msgs/s" for b in backends)
    ratios = [b for b in backends if b != "pymq" and "pymq" in backends]
    print(f"| figure | {head} | " + "".join(f"{b} / pymq | " for b in ratios))
    print("|---|" + "---|" * (len(backends) + len(ratios)))
    for figure in FIGURES:
        cells = []
        for b in backends:
            got = results.samples.get((figure, b), [])
            if not got:
                cells.append("-")
                continue
            rates = [s.rate for s in got]
            spread = f" ({kilo(min(rates))}-{kilo(max(rates))})" if len(rates) > 1 else ""
            cells.append(f"{kilo(statistics.median(rates))}{spread}")
        base = results.median(figure, "pymq")
        for b in ratios:
            m = results.median(figure, b)
            cells.append(f"{m / base:.2f}" if m and base else "-")
        print(f"| {FIGURE_NAMES[figure]} | " + " | ".join(cells) + " |")

    print("\nCPU seconds per process kind, median over the runs (stream: the whole query); "
          "other load = cores used by processes not of this run\n")
    print("| figure | backend | Spark JVM | Python workers | broker(s) | driver | all, µs/msg | "
          "other load |")
    print("|---|---|---|---|---|---|---|---|")
    for figure in ("sink", "stream", "batch"):
        for b in backends:
            got = results.samples.get((figure, b), [])
            if not got:
                continue
            med = {k: statistics.median(s.cpu[k] for s in got) for k in KINDS}
            total = statistics.median(sum(s.cpu[k] for k in KINDS) for s in got)
            other = statistics.median(s.other_load for s in got)
            print(f"| {FIGURE_NAMES[figure]} | {b} | " + " | ".join(f"{med[k]:.2f}" for k in KINDS)
                  + f" | {total * 1e6 / rows:.2f} | {other:.2f} |")

    print("\nissue 15 targets (RocketMQ, this machine):")
    for figure, goal in TARGETS.items():
        for b in backends:
            if b.startswith("rmq"):
                m = results.median(figure, b)
                if m is not None:
                    verdict = "met" if m >= goal else "missed"
                    print(f"  {FIGURE_NAMES[figure]} on {b}: {kilo(m)} vs ≥ {kilo(goal)}: {verdict}")



# -- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=200, help="body size in bytes")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"any of {', '.join(BACKENDS)}")
    ap.add_argument("--broker-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker.conf setting for every RocketMQ broker (repeatable), e.g. "
                         "transferMsgByHeap=false")
    ap.add_argument("--fixture-jvm", action="store_true",
                    help="run the RocketMQ JVMs as the tests do (C1 only, SerialGC, 512 MiB)")
    ap.add_argument("--send-timeout-ms", type=int, default=30_000,
                    help="the sink's sendMsgTimeoutMs (3000 by default in the sink; a cold broker on a "
                         "loaded 2-core machine can take longer)")
    ap.add_argument("--send-retries", type=int, default=0,
                    help="the sink's retryTimesWhenSendAsyncFailed (0 by default in the sink; a broker on "
                         "a loaded machine answers SYSTEM_BUSY now and then)")
    ap.add_argument("--schema", default="", metavar="DDL",
                    help="reads keep only these source columns (.schema(DDL)); 'kafka': the ones "
                         f"Kafka's source returns ({KAFKA_LIKE_COLUMNS})")
    add_wait_quiet_argument(ap)
    ap.add_argument("--no-pause", action="store_true",
                    help="keep the other backends running during each backend's turn (by default they "
                         "are stopped with SIGSTOP: an idle RocketMQ cluster takes ~0.27 of 2 cores)")
    ap.add_argument("--quick", action="store_true", help="100,000 messages, 1 run (CI-scale)")
    args = ap.parse_args(argv)
    schema = KAFKA_LIKE_COLUMNS if args.schema == "kafka" else args.schema
    if args.quick:
        args.messages, args.runs, args.wait_quiet = 100_000, 1, min(args.wait_quiet, 20.0)
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        ap.error(f"unknown backends {sorted(unknown)}; choose from {BACKENDS}")
    rows = args.messages
    extra: dict[str, str] = {}
    for item in args.broker_conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--broker-conf takes KEY=VALUE, got {item!r}")
        extra[key.strip()] = value.strip()

    print(f"# Spark connector on Apache RocketMQ {ROCKETMQ_VERSION} and on the embedded pymq broker")
    command = [Path(sys.executable).name, "benchmarks/bench_rocketmq.py", *(argv or sys.argv[1:])]
    print(f"command: `{' '.join(command)}`")
    print(machine_line(f"RocketMQ {ROCKETMQ_VERSION}"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{rows:,} rows of {args.body} B per figure, {args.runs} run(s) after a warm-up; "
          f"RocketMQ JVMs: {'fixture flags (C1, SerialGC)' if args.fixture_jvm else 'C2 + G1, 1 GiB heap'}"
          + (f"; broker.conf also {extra}" if extra else ""))
    sys.stdout.flush()

    from pyspark.sql import SparkSession
    from pyspark_pymq import Admin

    work = Path(tempfile.mkdtemp(prefix="pymq-bench-rocketmq-"))
    spark: Any = None
    broker: BrokerProcess | None = None
    clusters: list[BenchCluster] = []
    try:
        targets: dict[str, PymqTarget] = {}
        sends: dict[str, Any] = {"send_timeout_ms": args.send_timeout_ms, "send_retries": args.send_retries,
                                 "schema": schema}
        started = time.perf_counter()
        if "pymq" in backends:
            broker = BrokerProcess(work / "pymq").start()
            ep = broker.endpoint

            def pymq_topic(topic: str, ep: str = ep) -> None:
                Admin(ep).create_topic(topic, queues=4)

            targets["pymq"] = PymqTarget("pymq", "endpoint", ep, {broker.pid}, pymq_topic, None, **sends)
        for name in (b for b in backends if b.startswith("rmq")):
            conf = {**extra, **(RAISED_CONF if name == "rmq-raised" else {})}
            cluster = BenchCluster(work / name, fixture_jvm=args.fixture_jvm, extra_broker_conf=conf)
            clusters.append(cluster)
            cluster.start()

            def rmq_topic(topic: str, c: BenchCluster = cluster) -> None:
                c.create_topic(topic, 2)  # 2 queues on each broker

            targets[name] = PymqTarget(name, "namesrvAddr", cluster.namesrv_addr, cluster.jvm_pids(),
                                       rmq_topic, None, **sends)
        print(f"brokers started in {time.perf_counter() - started:.1f} s")

        spark = (SparkSession.builder.master("local[2]").appName("pymq-bench-rocketmq")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "4g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        SPARK_JVM[0] = spark.sparkContext._gateway.proc.pid
        df = spark.range(rows, numPartitions=2).selectExpr(
            f"CAST(repeat('x', {args.body}) AS BINARY) AS body").cache()
        df.count()
        for t in targets.values():
            t.df = df

        results = run_rounds(spark, [targets[b] for b in backends], rows, work, runs=args.runs,
                             warmups=1, wait_quiet_s=args.wait_quiet, pause_idle=not args.no_pause)
        report(results, backends, args.runs, rows)
    finally:
        if spark is not None:
            spark.stop()
        for cluster in clusters:
            cluster.stop()
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
