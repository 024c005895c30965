"""What the side-by-side Spark benchmarks share (bench_rocketmq.py, bench_vs_kafka.py).

Not a benchmark itself (``run_all.py`` runs ``bench_*.py`` only). It holds:

- the CPU accounting per process kind (Spark JVM, Python workers, broker(s), driver) from
  Linux /proc, and the cores other processes used meanwhile: ``measure()``, ``wait_quiet()``;
- ``Sample`` / ``Results``: the figures of every run, medians;
- ``run_round()``: one backend's sink, ``readStream`` -> ``noop`` and ``spark.read`` -> ``noop``
  of the same topic, with ``PymqTarget`` for the pymq connector (``endpoint`` or ``namesrvAddr``)
  and any other ``Target`` (Spark's Kafka connector in bench_vs_kafka.py);
- ``machine_line()``: the machine and versions a report starts with;
- ``use_repository()``: what a script calls before it imports pymq or the tests' helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
KINDS = ("Spark JVM", "Python workers", "broker", "driver")
FIGURES = ("sink", "stream", "stream-wall", "batch")
FIGURE_NAMES = {
    "sink": "`df.write` sendMode=async",
    "stream": "readStream → noop, data batches",
    "stream-wall": "readStream → noop, wall clock",
    "batch": "`spark.read` → noop",
}

# pymq's source columns for what Kafka's source returns (key, value, topic, partition, offset,
# timestamp), for reads with .schema(...) (Python data sources get no column pruning)
KAFKA_LIKE_COLUMNS = ("keys array<string>, body binary, topic string, queue_id int, queue_offset bigint, "
                      "store_timestamp timestamp")


def use_repository() -> None:
    """This tree's packages (and tests/, for broker_process and rocketmq_cluster) on ``sys.path`` and
    on the PYTHONPATH of the processes Spark and the brokers start; Spark's Python on this interpreter.

    The scripts run from a checkout with the project's interpreter, not from an installed pymq."""
    sys.path.insert(0, str(ROOT / "tests"))
    from source_tree import compile_bytecode, use_source_tree

    use_source_tree()
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    compile_bytecode()  # as an installed pymq has it: no process compiles the modules again


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


SPARK_JVM = [0]  # the pid of Spark's JVM, once started: set it to spark.sparkContext._gateway.proc.pid


def _kinds(snap: dict[int, _Stat], broker_pids: set[int]) -> dict[str, float]:
    """CPU seconds so far per process kind, among this process's descendants.

    The driver counts its own time only (its reaped children are tool JVMs such as mqadmin or
    Kafka's storage format); Spark's JVM too, its reaped children (Python workers and daemons
    that exited) count as Python workers; every other process counts its reaped children too
    (Python workers fork and exit). Brokers not in ``broker_pids`` (the backends idle meanwhile)
    count as "rest".
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
            out["Spark JVM"] += p.own / CLK_TCK
            out["Python workers"] += (p.ticks - p.own) / CLK_TCK
            continue
        elif SPARK_JVM[0] in chain:
            kind = "Python workers"
        else:
            kind = "rest"
        out[kind] += p.ticks / CLK_TCK
    return out


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

    def cpu_median(self, figure: str, backend: str) -> dict[str, float] | None:
        """CPU seconds per kind (and "all": the kinds' sum), medians over the runs."""
        got = self.samples.get((figure, backend))
        if not got:
            return None
        med = {k: statistics.median(s.cpu[k] for s in got) for k in KINDS}
        med["all"] = statistics.median(sum(s.cpu[k] for k in KINDS) for s in got)
        return med

    def other_load(self, figure: str, backend: str) -> float | None:
        got = self.samples.get((figure, backend))
        return statistics.median(s.other_load for s in got) if got else None


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


def add_wait_quiet_argument(ap: argparse.ArgumentParser) -> None:
    """``--wait-quiet`` for ``wait_quiet()`` / ``run_rounds()``."""
    ap.add_argument("--wait-quiet", type=float, default=120.0,
                    help="before each backend's turn, wait up to this many seconds (600 in all) for "
                         "other processes to use < 0.25 cores; 0: do not wait")


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


# -- one backend's round: sink, stream read, batch read -----------------------------------------


class Target(Protocol):
    """A backend as the Spark benchmarks see it: a topic to create, write, wait for and read."""

    name: str
    broker_pids: set[int]  # whose CPU counts as "broker" while this backend runs

    def make_topic(self, topic: str) -> None: ...

    def write(self, topic: str) -> None:
        """Write the benchmark's rows into ``topic`` with ``df.write``."""

    def wait_for(self, topic: str, rows: int) -> list[int]:
        """Wait until ``topic`` holds ``rows`` rows (or more) and stays so; the rows per queue."""
        ...

    def read(self, builder: Any, topic: str, group: str) -> Any:
        """``builder`` (``spark.read`` or ``spark.readStream``) reading all of ``topic``, loaded;
        ``group``: the stream's consumer group, "" for the batch read."""


@dataclass
class PymqTarget:
    """The pymq connector on a broker reached by ``endpoint`` (pymq) or ``namesrvAddr`` (RocketMQ)."""

    name: str
    option: str  # "endpoint" or "namesrvAddr"
    address: str
    broker_pids: set[int]
    make_topic: Callable[[str], None]
    df: Any  # the rows to write: one binary column "body"
    send_timeout_ms: int = 3000
    send_retries: int = 0
    options: dict[str, str] = field(default_factory=dict)  # e.g. tls, tlsCaFile, accessKey, secretKey
    schema: str = ""  # reads: the columns to keep (a DDL of source columns); "": all of them

    def write(self, topic: str) -> None:
        (self.df.write.format("pymq").option(self.option, self.address).option("topic", topic)
         .options(**self.options)
         .option("sendMode", "async").option("sendMsgTimeoutMs", self.send_timeout_ms)
         .option("retryTimesWhenSendAsyncFailed", self.send_retries).mode("append").save())

    def read(self, builder: Any, topic: str, group: str) -> Any:
        reader = (builder.format("pymq").option(self.option, self.address).option("topic", topic)
                  .options(**self.options))
        if self.schema:
            reader = reader.schema(self.schema)
        if group:
            reader = reader.option("startingOffsets", "earliest").option("consumerGroup", group)
        return reader.load()

    def queue_bounds(self, topic: str) -> dict[Any, Any] | None:
        from pyspark_pymq.backend import cached_backend
        from pyspark_pymq.backend.base import parse_backend_options

        options = {self.option: self.address, **self.options}  # read as the connector reads them
        return cached_backend(parse_backend_options(options.get, "pymq option")).queue_bounds(topic)

    def wait_for(self, topic: str, rows: int) -> list[int]:
        """RocketMQ's consume queues lag the send acknowledgement a little: wait for all ``rows``."""

        def per_queue() -> list[int]:
            bounds = self.queue_bounds(topic) or {}
            ordered = sorted(bounds.items(), key=lambda kv: str(kv[0]))
            return [b.max_offset - b.min_offset for _, b in ordered]

        return wait_settled(f"{self.name}: {topic}", rows, per_queue)


def wait_settled(what: str, rows: int, per_queue: Callable[[], list[int]],
                 timeout_s: float = 120.0) -> list[int]:
    """Wait until ``per_queue()`` (rows per queue) adds up to ``rows`` (or more) and stays so."""
    deadline = time.monotonic() + timeout_s
    settled: list[int] | None = None
    while True:
        got = per_queue()
        if sum(got) >= rows and got == settled:
            return got
        settled = got if sum(got) >= rows else None  # the same again 0.05 s later
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} holds {sum(got)} of {rows} rows after {timeout_s:.0f} s ({got})")
        time.sleep(0.05)


def run_round(spark: Any, target: Target, rows: int, tag: str, work: Path,
              results: Results | None) -> list[int]:
    """Sink, then stream and batch read of what it wrote; returns the rows per queue.

    The stream is ``Trigger.AvailableNow`` into ``noop`` from the earliest offsets, with a fresh
    checkpoint: its "stream" figure counts the micro-batches that read data (``triggerExecution``),
    "stream-wall" the wall clock from ``start()`` to the end.
    """
    topic, group = f"bench-{target.name}-{tag}", f"bench-g-{target.name}-{tag}"
    target.make_topic(topic)
    wall, cpu, other = measure(lambda: target.write(topic), target.broker_pids)
    if results is not None:
        results.add("sink", target.name, Sample(rows / wall, cpu, other))
    per_queue = target.wait_for(topic, rows)
    # A send retried after a time-out the broker had in fact stored leaves a batch twice (at
    # least once): the reads count what the topic holds.
    stored = sum(per_queue)

    checkpoint = work / f"ck-{target.name}-{tag}"
    progress: list[Any] = []

    def stream() -> None:
        query = (target.read(spark.readStream, topic, group)
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
        target.read(spark.read, topic, "").write.format("noop").mode("overwrite").save()

    wall, cpu, other = measure(batch, target.broker_pids)
    if results is not None:
        results.add("batch", target.name, Sample(stored / wall, cpu, other))
    return per_queue


# -- report -------------------------------------------------------------------------------------


def cpu_and_memory() -> tuple[str, str]:
    """The CPU model and the RAM, as /proc tells them ("?" where it does not)."""
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
    return cpu, mem


def machine_line(*also: str) -> str:
    """The machine, the versions that matter and the date; ``also``: more versions to name."""
    cpu, mem = cpu_and_memory()
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
            + "".join(f"{a}, " for a in also) + date)


def kilo(rate: float) -> str:
    return f"{rate / 1000:,.1f}k"


#: A RocketMQ name server drops a broker it has not heard from for 120 s, paused or not.
PAUSE_LIMIT_S = 90.0


@contextlib.contextmanager
def only_running(order: list[Any], target: Any, pause_idle: bool) -> Any:
    """With ``pause_idle``, the other backends' processes are stopped (SIGSTOP) while ``target``
    runs: an idle RocketMQ cluster keeps ~0.27 of the 2 cores busy (its timers, its name server),
    which the backend measured would otherwise share. Warns when a turn runs past PAUSE_LIMIT_S."""
    if not pause_idle:
        yield
        return
    others = {pid for t in order if t is not target for pid in t.broker_pids} - target.broker_pids
    _signal(others, signal.SIGSTOP)
    started = time.monotonic()
    try:
        yield
    finally:
        _signal(others, signal.SIGCONT)
        took = time.monotonic() - started
        if took > PAUSE_LIMIT_S:
            print(f"  warning: {target.name}'s turn took {took:.0f} s with the others stopped; a "
                  "RocketMQ name server may have dropped its brokers (120 s without a heartbeat)",
                  file=sys.stderr, flush=True)
        time.sleep(1.0)  # the resumed processes catch up on their timers before the next turn


def _signal(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def run_rounds(spark: Any, order: list[Any], rows: int, work: Path, *, runs: int, warmups: int,
               wait_quiet_s: float, pause_idle: bool = False) -> Results:
    """``warmups`` unmeasured rounds of every backend (JIT of every JVM, Python workers), then
    ``runs`` measured ones; within a round the backends take turns and the order rotates from
    round to round. Before each measured turn, wait up to ``wait_quiet_s`` (600 s in all) for
    the machine to be quiet. ``pause_idle``: see :func:`only_running`."""
    results = Results()
    t0 = time.perf_counter()
    for w in range(warmups):
        for t in order:
            with only_running(order, t, pause_idle):
                per_queue = run_round(spark, t, rows, f"warm{w}", work, None)
            print(f"warm-up {w + 1} {t.name}: rows per queue {per_queue}", flush=True)
    print(f"warm-up: {time.perf_counter() - t0:.0f} s", flush=True)
    budget = [600.0 if wait_quiet_s else 0.0]
    for i in range(runs):
        turn = order[i % len(order):] + order[:i % len(order)]
        for t in turn:
            with only_running(order, t, pause_idle):
                quiet = wait_quiet(wait_quiet_s, budget) if wait_quiet_s else float("nan")
                print(f"  other load before {t.name}: {quiet:.2f} cores", flush=True)
                run_round(spark, t, rows, str(i), work, results)
            got = {f: results.samples[(f, t.name)][-1].rate for f in FIGURES}
            print(f"run {i + 1} {t.name}: " + ", ".join(f"{f} {kilo(r)}" for f, r in got.items()),
                  flush=True)
    return results
