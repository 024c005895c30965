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
order rotates from round to round. Besides msgs/s: CPU seconds of each process kind
(Spark JVM, Python workers, the broker process or the cluster's JVMs) and the cores
other processes used meanwhile (Linux /proc).

    .venv/bin/python benchmarks/bench_rocketmq.py                  # 1M messages, 3 runs (~6 min)
    .venv/bin/python benchmarks/bench_rocketmq.py --quick          # 100k messages, 1 run
    .venv/bin/python benchmarks/bench_rocketmq.py --backends pymq,rmq --runs 5

Needs java and the RocketMQ jars (``make rocketmq``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
sys.path[:0] = [*SRC, str(ROOT / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join([*SRC, os.environ.get("PYTHONPATH", "")])
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from broker_process import BrokerProcess  # noqa: E402
from rocketmq_cluster import ROCKETMQ_VERSION, RocketMQCluster  # noqa: E402
from rocketmq_cluster import _Proc as JvmProc  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
BACKENDS = ("pymq", "rmq", "rmq-raised")
RAISED_CONF = {
    "maxTransferCountOnMessageInMemory": "2000",
    "maxTransferBytesOnMessageInMemory": str(4 << 20),
}
FIGURES = ("sink", "stream", "stream-wall", "batch")
FIGURE_NAMES = {
    "sink": "`df.write` sendMode=async",
    "stream": "readStream → noop, data batches",
    "stream-wall": "readStream → noop, wall clock",
    "batch": "`spark.read` → noop",
}
KINDS = ("Spark JVM", "Python workers", "broker", "driver")
TARGETS = {"sink": 300_000.0, "stream": 500_000.0}


# -- the RocketMQ cluster, tuned for throughput rather than start-up ----------------------------


class BenchCluster(RocketMQCluster):
    """The test fixture's cluster; its name server and brokers get C2 and G1 unless ``fixture_jvm``."""

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


# -- CPU per process kind ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Stat:
    ppid: int
    comm: str
    ticks: int  # utime + stime + cutime + cstime
    own: int  # utime + stime


def _snapshot() -> dict[int, _Stat]:
    out: dict[int, _Stat] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        f = rest.split()
        own = int(f[11]) + int(f[12])
        out[int(entry.name)] = _Stat(int(f[1]), head.partition("(")[2], own + int(f[13]) + int(f[14]), own)
    return out


def _machine_busy() -> float:
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK  # all but idle and iowait


def _kinds(snap: dict[int, _Stat], broker_pids: set[int]) -> dict[str, float]:
    """CPU seconds so far per process kind, among this process's descendants.

    The driver counts its own time only (its reaped children are mqadmin JVMs); Spark's
    JVM too, its reaped children (Python workers and daemons that exited) count as Python
    workers; every other process counts its reaped children too (Python workers fork and
    exit).
    """
    me = os.getpid()
    out = dict.fromkeys((*KINDS, "rest"), 0.0)
    for pid, p in snap.items():
        if pid == me:
            out["driver"] += p.own / CLK_TCK
            continue
        chain: list[int] = []
        q = pid
        while q > 1 and q != me:
            chain.append(q)
            q = snap[q].ppid if q in snap else 0
        if q != me:
            continue  # not ours
        if any(c in broker_pids for c in chain):
            kind = "broker"
        elif pid == SPARK_JVM[0]:
            # Its reaped children are Python workers (and daemons) that exited.
            out["Spark JVM"] += p.own / CLK_TCK
            out["Python workers"] += (p.ticks - p.own) / CLK_TCK
            continue
        elif SPARK_JVM[0] in chain:
            kind = "Python workers"
        else:
            kind = "rest"  # the idle backends, mqadmin
        out[kind] += p.ticks / CLK_TCK
    return out


SPARK_JVM = [0]  # the pid of Spark's JVM, once started


@dataclass
class Sample:
    rate: float
    cpu: dict[str, float]
    other_load: float  # cores used by processes not ours


@dataclass
class Results:
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)

    def add(self, figure: str, backend: str, sample: Sample) -> None:
        self.samples.setdefault((figure, backend), []).append(sample)

    def median(self, figure: str, backend: str) -> float | None:
        got = self.samples.get((figure, backend))
        return statistics.median(s.rate for s in got) if got else None


def others_busy(seconds: float = 2.0) -> float:
    """Cores used by processes that are not this run's over ``seconds``."""
    ours, busy = sum(_kinds(_snapshot(), set()).values()), _machine_busy()
    time.sleep(seconds)
    return max(0.0, _machine_busy() - busy - (sum(_kinds(_snapshot(), set()).values()) - ours)) / seconds


def wait_quiet(limit_s: float, budget: list[float], threshold: float = 0.25) -> float:
    """Wait (at most ``limit_s``, and what is left of ``budget[0]``) until other processes use
    less than ``threshold`` cores; returns the last reading."""
    deadline = time.monotonic() + min(limit_s, budget[0])
    t0 = time.monotonic()
    load = others_busy()
    while load >= threshold and time.monotonic() < deadline:
        load = others_busy()
    budget[0] = max(0.0, budget[0] - (time.monotonic() - t0))
    return load


def measure(fn: Callable[[], object], broker_pids: set[int]) -> tuple[float, dict[str, float], float]:
    """(wall seconds, CPU seconds per kind, other load in cores) of ``fn()``."""
    before, busy = _kinds(_snapshot(), broker_pids), _machine_busy()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    after = _kinds(_snapshot(), broker_pids)
    cpu = {k: max(0.0, after[k] - before[k]) for k in after}
    ours = sum(cpu.values())
    return wall, cpu, max(0.0, _machine_busy() - busy - ours) / wall


# -- one backend --------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    option: str  # "endpoint" or "namesrvAddr"
    address: str
    broker_pids: set[int]
    make_topic: Callable[[str], None]

    def queue_bounds(self, topic: str) -> dict[Any, Any] | None:
        from pyspark_pymq.backend import BackendConfig, cached_backend

        config = BackendConfig(None, self.address) if self.option == "namesrvAddr" \
            else BackendConfig(self.address, None)
        return cached_backend(config).queue_bounds(topic)

    def wait_for(self, topic: str, rows: int, timeout_s: float = 120.0) -> list[int]:
        """Wait until ``topic``'s max offsets add up to ``rows`` (or more) and stay; the rows per queue."""
        deadline = time.monotonic() + timeout_s
        settled: list[int] | None = None
        while True:
            bounds = self.queue_bounds(topic) or {}
            ordered = sorted(bounds.items(), key=lambda kv: str(kv[0]))
            per_queue = [b.max_offset - b.min_offset for _, b in ordered]
            if sum(per_queue) >= rows and per_queue == settled:
                return per_queue
            settled = per_queue if sum(per_queue) >= rows else None  # the same again 0.05 s later
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {topic} holds {sum(per_queue)} of {rows} rows after "
                                   f"{timeout_s:.0f} s ({per_queue})")
            time.sleep(0.05)


def run_round(spark: Any, df: Any, target: Target, rows: int, tag: str, work: Path,
              results: Results | None, send_timeout_ms: int, send_retries: int = 0) -> list[int]:
    """Sink, then stream and batch read of what it wrote; returns the rows per queue."""
    topic, group = f"bench-{target.name}-{tag}", f"bench-g-{target.name}-{tag}"
    target.make_topic(topic)

    def write() -> None:
        (df.write.format("pymq").option(target.option, target.address).option("topic", topic)
         .option("sendMode", "async").option("sendMsgTimeoutMs", send_timeout_ms)
         .option("retryTimesWhenSendAsyncFailed", send_retries).mode("append").save())

    wall, cpu, other = measure(write, target.broker_pids)
    if results is not None:
        results.add("sink", target.name, Sample(rows / wall, cpu, other))
    per_queue = target.wait_for(topic, rows)
    # A send retried after a time-out the broker had in fact stored leaves a batch twice (at
    # least once): the reads count what the topic holds.
    stored = sum(per_queue)

    checkpoint = work / f"ck-{target.name}-{tag}"
    progress: list[Any] = []

    def stream() -> None:
        query = (spark.readStream.format("pymq").option(target.option, target.address)
                 .option("topic", topic).option("startingOffsets", "earliest")
                 .option("consumerGroup", group).load()
                 .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        progress.extend(query.recentProgress)

    wall, cpu, other = measure(stream, target.broker_pids)
    shutil.rmtree(checkpoint, ignore_errors=True)
    read = sum(p["numInputRows"] for p in progress)
    busy_ms = sum(p["durationMs"]["triggerExecution"] for p in progress if p["numInputRows"])
    if read != stored:
        raise RuntimeError(f"{target.name}: the stream read {read} rows of {stored}")
    if results is not None:
        results.add("stream", target.name, Sample(stored / (busy_ms / 1000.0), cpu, other))
        results.add("stream-wall", target.name, Sample(stored / wall, cpu, other))

    def batch() -> None:
        reader = spark.read.format("pymq").option(target.option, target.address).option("topic", topic)
        reader.load().write.format("noop").mode("overwrite").save()

    wall, cpu, other = measure(batch, target.broker_pids)
    if results is not None:
        results.add("batch", target.name, Sample(stored / wall, cpu, other))
    return per_queue


# -- report -------------------------------------------------------------------------------------


def machine_line() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    java = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
        java = out.stderr.splitlines()[0].split('"')[1]
    import grpc
    import pyarrow
    import pyspark

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"machine: {os.cpu_count()} CPUs ({cpu}), {mem} RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}, pyspark {pyspark.__version__} local[2], "
            f"pyarrow {pyarrow.__version__}, grpcio {grpc.__version__}, Java {java}, "
            f"RocketMQ {ROCKETMQ_VERSION}; {date}")


def _k(rate: float) -> str:
    return f"{rate / 1000:,.1f}k"


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
            spread = f" ({_k(min(rates))}-{_k(max(rates))})" if len(rates) > 1 else ""
            cells.append(f"{_k(statistics.median(rates))}{spread}")
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
                    print(f"  {FIGURE_NAMES[figure]} on {b}: {_k(m)} vs ≥ {_k(goal)}: {verdict}")



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
    ap.add_argument("--wait-quiet", type=float, default=120.0,
                    help="before each backend's turn, wait up to this many seconds (600 in all) for "
                         "other processes to use < 0.25 cores; 0: do not wait")
    ap.add_argument("--quick", action="store_true", help="100,000 messages, 1 run (CI-scale)")
    args = ap.parse_args(argv)
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
    print(machine_line())
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
        targets: dict[str, Target] = {}
        started = time.perf_counter()
        if "pymq" in backends:
            broker = BrokerProcess(work / "pymq").start()
            ep = broker.endpoint

            def pymq_topic(topic: str, ep: str = ep) -> None:
                Admin(ep).create_topic(topic, queues=4)

            targets["pymq"] = Target("pymq", "endpoint", ep, {broker.pid}, pymq_topic)
        for name in (b for b in backends if b.startswith("rmq")):
            conf = {**extra, **(RAISED_CONF if name == "rmq-raised" else {})}
            cluster = BenchCluster(work / name, fixture_jvm=args.fixture_jvm, extra_broker_conf=conf)
            clusters.append(cluster)
            cluster.start()

            def rmq_topic(topic: str, c: BenchCluster = cluster) -> None:
                c.create_topic(topic, 2)  # 2 queues on each broker

            targets[name] = Target(name, "namesrvAddr", cluster.namesrv_addr, cluster.jvm_pids(), rmq_topic)
        print(f"brokers started in {time.perf_counter() - started:.1f} s")

        spark = (SparkSession.builder.master("local[2]").appName("pymq-bench-rocketmq")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "4g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        SPARK_JVM[0] = spark.sparkContext._gateway.proc.pid
        df = spark.range(rows, numPartitions=2).selectExpr(
            f"CAST(repeat('x', {args.body}) AS BINARY) AS body").cache()
        df.count()

        results = Results()
        order = [targets[b] for b in backends]
        t0 = time.perf_counter()
        budget = [600.0 if args.wait_quiet else 0.0]
        for t in order:
            per_queue = run_round(spark, df, t, rows, "warm", work, None, args.send_timeout_ms,
                                  args.send_retries)
            print(f"warm-up {t.name}: rows per queue {per_queue}", flush=True)
        print(f"warm-up round: {time.perf_counter() - t0:.0f} s", flush=True)
        for i in range(args.runs):
            turn = order[i % len(order):] + order[:i % len(order)]
            for t in turn:
                quiet = wait_quiet(args.wait_quiet, budget) if args.wait_quiet else float("nan")
                print(f"  other load before {t.name}: {quiet:.2f} cores", flush=True)
                run_round(spark, df, t, rows, str(i), work, results, args.send_timeout_ms, args.send_retries)
                got = {f: results.samples[(f, t.name)][-1].rate for f in FIGURES}
                print(f"run {i + 1} {t.name}: " + ", ".join(f"{f} {_k(r)}" for f, r in got.items()),
                      flush=True)
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
