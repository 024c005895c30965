#!/usr/bin/env python
"""Broker benchmarks (issue 2): batched send, pull, and the bare-gRPC ceiling.

The broker runs as a separate process on loopback (``python -m pymq_broker``).
Producers and consumers run in separate processes too (multiprocessing, spawn),
so neither shares a GIL with the broker or with each other.

Figures, each the median of ``--repeats`` runs:

* send: msgs/s and MB/s of message bodies, ``Producer.send_batch`` of
  ``--batch`` messages, per body size, flush type and number of producers;
* bare gRPC: a trivial grpc.aio server (its own process) answering a
  bytes-in/bytes-out unary method with identity serializers, called with a
  request and answered with a response of the same sizes as pymq's
  SendMessage for that batch (and PullMessage for the pull figures): the
  transport's ceiling, and pymq's share of it;
* pull: ``PullConsumer.pull`` (records decoded to MessageExt) and
  ``PullConsumer.pull_raw`` (records undecoded), ``--max-nums`` per pull.

Usage::

    python benchmarks/bench_broker.py                 # the full matrix (about 5 min)
    python benchmarks/bench_broker.py --quick         # a smoke run (about 30 s)
    python benchmarks/bench_broker.py --bodies 200 --producers 1 --flush ASYNC_FLUSH
    python benchmarks/bench_broker.py --single        # single messages (about 1 min)

``--single`` measures puts of ONE message instead: the latency (p50/p99) and rate
of a synchronous ``Producer.send`` of one ``--bodies`` message, and the store
path alone (in this process, no gRPC) in µs per put, for a classic
``MessageData`` message and for a pre-encoded one (its parsing included).

It prints markdown tables; ``--json PATH`` also writes every run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing as mp
import os
import platform
import queue
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _sub in ("proto", "broker_stub", "connector", "tests"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

from broker_process import BrokerProcess  # noqa: E402
from source_tree import compile_bytecode  # noqa: E402

ECHO_METHOD = "/pymqbench.Echo/Call"
TOPIC = "bench"
MB = 1_000_000
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- machine and process facts -------------------------------------------------


def machine_info() -> dict[str, str]:
    from side_by_side import cpu_and_memory

    cpu, mem = cpu_and_memory()
    import grpc
    import numpy
    from google.protobuf import __version__ as pb_version
    from google.protobuf.internal import api_implementation

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "protobuf": f"{pb_version} ({api_implementation.Type()})",
        "numpy": numpy.__version__,
    }


def print_machine(info: dict[str, str], argv: Sequence[str]) -> None:
    print(f"command: `{' '.join([Path(sys.executable).name, *argv])}`")
    print(
        f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, "
        f"Linux {info['kernel']}, Python {info['python']}, grpcio {info['grpcio']}, "
        f"protobuf {info['protobuf']}, numpy {info['numpy']}; {info['date']}"
    )
    print()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile... of ``pid`` in KiB (from /proc/PID/status)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            parts = value.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0])
    return out


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` (all its threads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> tuple[float, float]:
    """(busy CPU seconds, total CPU seconds) of the whole machine so far, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return (total - idle) / CLK_TCK, total / CLK_TCK


_quiet_budget = [600.0]  # seconds of waiting left for this process, over all runs


def wait_quiet(max_wait: float, threshold: float = 0.25) -> float:
    """Wait (up to ``max_wait`` s) until the machine is nearly idle; the busy share last seen.

    The benchmark shares a small machine: a run that starts while another job
    is busy measures both. ``threshold`` is the busy share of all CPUs. All
    waits together stop at 600 s: past that, runs start at once (their "other
    load" column shows what they shared the machine with).
    """
    started = time.monotonic()
    deadline = started + min(max_wait, _quiet_budget[0])
    while True:
        b0, t0 = machine_busy_seconds()
        time.sleep(0.5)
        b1, t1 = machine_busy_seconds()
        busy = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
        if busy <= threshold or time.monotonic() >= deadline:
            _quiet_budget[0] = max(0.0, _quiet_budget[0] - (time.monotonic() - started))
            return busy
        print(f"  machine busy ({busy:.0%} of all CPUs): waiting", file=sys.stderr, flush=True)
        time.sleep(2.0)


def dir_bytes(path: Path) -> int:
    """Disk space used under ``path`` (allocated blocks: sparse segments count as written)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


# -- the broker and the bare gRPC server ---------------------------------------


@contextlib.contextmanager
def running_broker(
    work_dir: Path, flush: str, extra_args: Sequence[str] = ()
) -> Iterator[BrokerProcess]:
    data_dir = Path(tempfile.mkdtemp(prefix=f"broker-{flush.lower()}-", dir=work_dir))
    broker = BrokerProcess(data_dir, ["--log-level", "WARNING", *extra_args], flush_disk_type=flush)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def serve_echo(tls_cert: str | None = None, tls_key: str | None = None) -> None:
    """The bare gRPC server: ``--serve-echo`` runs it (in its own process).

    One unary method, bytes in and bytes out (identity serializers). The first
    8 bytes of a request give the size of the response. With a certificate and key
    it serves TLS, as the broker's ``--tls-cert-file``/``--tls-key-file`` do.
    """
    import asyncio

    import grpc
    from pymq_broker.controller import GRPC_OPTIONS

    async def main() -> None:
        cache: dict[int, bytes] = {}

        async def call(request: bytes, context: Any) -> bytes:
            (n,) = struct.unpack_from("<Q", request)
            resp = cache.get(n)
            if resp is None:
                resp = cache[n] = bytes(n)
            return resp

        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "pymqbench.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}
                ),
            )
        )
        if tls_cert and tls_key:
            creds = grpc.ssl_server_credentials([(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])
            port = server.add_secure_port("127.0.0.1:0", creds)
        else:
            port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(f"echo listening on 127.0.0.1:{port}", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


@contextlib.contextmanager
def running_echo(tls: tuple[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """The bare gRPC server in its own process: (endpoint, pid). ``tls``: (certificate, key)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / d) for d in ("proto", "broker_stub", "connector")] + [env.get("PYTHONPATH", "")]
    )
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve-echo",
         *(["--tls-cert", tls[0], "--tls-key", tls[1]] if tls else [])],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"echo server did not start: {line!r}")
    try:
        yield m.group(1), proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


# -- payloads --------------------------------------------------------------------


def wire_sizes(body: int, batch: int) -> tuple[int, int]:
    """Serialized sizes of pymq's SendMessageRequest and SendMessageResponse for one batch."""
    from pymq_proto.v1 import pymq_pb2
    from pyspark_pymq.client.codec import encode_records
    from pyspark_pymq.client.message import Message, encode_message_properties, new_uniq_key

    msg = Message(TOPIC, b"x" * body)
    props = [encode_message_properties(msg, new_uniq_key()) for _ in range(batch)]
    records, sizes = encode_records(TOPIC, [msg.body] * batch, props)
    req = pymq_pb2.SendMessageRequest(  # the producer's pre-encoded batch
        producer_group="DEFAULT_PRODUCER", topic=TOPIC, queue_id=1,
        born_timestamp=int(time.time() * 1000), batch=True,
        encoded=pymq_pb2.EncodedBatch(records=records, sizes=sizes.tobytes()),
    )
    record = sizes[0]
    resp = pymq_pb2.SendMessageResponse(
        status=pymq_pb2.SEND_OK, queue_id=1, queue_offset=1_000_000,
        commit_log_offsets=[2**30 + i * record for i in range(batch)],
        store_host="127.0.0.1:40000", broker_name="broker-a",
    )
    return req.ByteSize(), resp.ByteSize()


def pull_request_size() -> int:
    from pymq_proto.v1 import pymq_pb2

    return pymq_pb2.PullMessageRequest(
        consumer_group="bench", message_queue=pymq_pb2.MessageQueue(
            topic=TOPIC, broker_name="broker-a", queue_id=1),
        queue_offset=1_000_000, max_msg_nums=10_000, subscription="*", expression_type="TAG",
    ).ByteSize()


# -- workers (each in its own process) -----------------------------------------


def bare_stub(endpoint: str, tls_ca_file: str | None = None) -> Callable[..., bytes]:
    """The bare server's method, with pymq's channel options (TLS verified by ``tls_ca_file``)."""
    import grpc
    from pyspark_pymq.client.transport import CHANNEL_OPTIONS

    if tls_ca_file:
        creds = grpc.ssl_channel_credentials(Path(tls_ca_file).read_bytes())
        channel = grpc.secure_channel(endpoint, creds, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.insecure_channel(endpoint, options=CHANNEL_OPTIONS)
    return channel.unary_unary(ECHO_METHOD)


def bare_payload(req_size: int, resp_size: int) -> bytes:
    return struct.pack("<Q", resp_size) + os.urandom(max(0, req_size - 8))


def _send_loop(spec: dict[str, Any]) -> Iterator[Callable[[], int]]:
    """Yields one step function: each call sends one batch and returns messages sent."""
    if spec["kind"] == "bare":
        call = bare_stub(spec["endpoint"])
        payload = bare_payload(spec["req_size"], spec["resp_size"])
        batch = spec["batch"]

        def bare_step() -> int:
            call(payload, timeout=30)
            return batch

        yield bare_step
        return
    from pyspark_pymq.client import Message, Producer

    producer = Producer(spec["endpoint"], send_mode=spec["send_mode"], max_in_flight=8)
    body = os.urandom(spec["body"])
    messages = [Message(spec["topic"], body) for _ in range(spec["batch"])]

    futures: list[Any] = []

    def step() -> int:
        out = producer.send_batch(messages)
        if spec["send_mode"] == "async":
            futures.extend(out)
        return len(messages)

    try:
        yield step
    finally:
        producer.close()  # async: wait for every answer
        for fut in futures:
            fut.result()  # raises if a send failed


def _pull_loop(spec: dict[str, Any]) -> Iterator[Callable[[], int]]:
    """Yields one pass function: it pulls every queue's range once and returns messages read."""
    from pyspark_pymq.client import PullConsumer

    kind = spec["kind"]
    stats = spec.setdefault("_stats", {"calls": 0, "bytes": 0})
    if kind == "bare_pull":
        call = bare_stub(spec["bare_endpoint"])
        payload = bare_payload(spec["req_size"], spec["resp_size"])
        per_call = spec["msgs_per_call"]

        def bare_pull() -> int:
            call(payload, timeout=60)
            stats["calls"] += 1
            return per_call

        yield bare_pull
        return
    consumer = PullConsumer(spec["endpoint"], "bench_consumer")
    mqs = [mq for mq in consumer.queues(spec["topic"]) if mq.queue_id in spec["ranges"]]
    max_nums = spec["max_nums"]

    def one_pass() -> int:
        n = 0
        for mq in mqs:
            off, end = 0, spec["ranges"][mq.queue_id]
            while off < end:
                want = min(max_nums, end - off)
                if kind == "pull":
                    r = consumer.pull(mq, off, want)
                    got = len(r.messages)
                else:
                    r = consumer.pull_raw(mq, off, want)
                    got = r.message_count
                    stats["bytes"] += len(r.records)
                stats["calls"] += 1
                if not got:
                    raise RuntimeError(f"pull of {mq} at {off} found nothing ({r.status})")
                n += got
                off = r.next_begin_offset
        return n

    yield one_pass


def worker(spec: dict[str, Any], barrier: Any, results: Any) -> None:
    """Warm up, wait for every worker at the barrier, then run for a duration or a count."""
    try:
        loop = _pull_loop(spec) if spec["kind"] in ("pull", "pull_raw", "bare_pull") else _send_loop(spec)
        step = next(loop)
        for _ in range(spec.get("warmup", 2)):
            step()
        spec.get("_stats", {}).update(calls=0, bytes=0)
    except BaseException:
        results.put({"error": traceback.format_exc()})
        barrier.abort()
        return
    try:
        barrier.wait(120)
        t0 = time.monotonic()
        cpu0 = time.process_time()
        n = 0
        duration, count = spec.get("duration"), spec.get("count")
        while True:
            n += step()
            if count is not None and n >= count:
                break
            if duration is not None and time.monotonic() - t0 >= duration:
                break
        with contextlib.suppress(StopIteration):
            next(loop)  # closes the producer: async sends are all answered
        t1 = time.monotonic()
        results.put({"n": n, "t0": t0, "t1": t1, "cpu": time.process_time() - cpu0,
                     **spec.get("_stats", {})})
    except BaseException:
        results.put({"error": traceback.format_exc()})


def run_workers(specs: Sequence[dict[str, Any]], watch_pid: int | None = None) -> dict[str, Any]:
    """Run one worker process per spec together; the aggregate rate and CPU use.

    ``other_cpu`` is what the rest of the machine used meanwhile, in cores: CPU
    not spent by the workers or ``watch_pid`` (another job on a shared machine).
    """
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(specs) + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(s, barrier, results), daemon=True) for s in specs]
    for p in procs:
        p.start()
    try:
        try:
            barrier.wait(180)
        except threading.BrokenBarrierError:
            errors = []
            with contextlib.suppress(queue.Empty):
                while True:
                    errors.append(results.get(timeout=1).get("error", ""))
            raise RuntimeError("a worker failed to start:\n" + "\n".join(errors)) from None
        cpu0 = proc_cpu_seconds(watch_pid) if watch_pid else 0.0
        busy0, _ = machine_busy_seconds()
        w0 = time.monotonic()
        got = [results.get(timeout=600) for _ in specs]
        w1 = time.monotonic()
        busy1, _ = machine_busy_seconds()
        cpu1 = proc_cpu_seconds(watch_pid) if watch_pid else 0.0
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [g["error"] for g in got if "error" in g]
    if errors:
        raise RuntimeError("a worker failed:\n" + "\n".join(errors))
    n = sum(g["n"] for g in got)
    wall = max(g["t1"] for g in got) - min(g["t0"] for g in got)
    client_cpu = sum(g["cpu"] for g in got) / wall
    server_cpu = (cpu1 - cpu0) / (w1 - w0)
    return {
        "n": n,
        "wall": wall,
        "rate": n / wall,
        "client_cpu": client_cpu,
        "server_cpu": server_cpu if watch_pid else None,
        "other_cpu": max(0.0, (busy1 - busy0) / (w1 - w0) - client_cpu - server_cpu),
        "server_us_per_msg": (cpu1 - cpu0) / n * 1e6 if n else None,
        "client_us_per_msg": sum(g["cpu"] for g in got) / n * 1e6 if n else None,
        "calls": sum(g.get("calls", 0) for g in got),
        "bytes": sum(g.get("bytes", 0) for g in got),
    }


# -- the benchmark ----------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_rate(x: float) -> str:
    return f"{x / 1000:,.1f}k" if x == x else "n/a"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def spread(xs: Sequence[float]) -> str:
    return f"{fmt_rate(min(xs))}-{fmt_rate(max(xs))}" if len(xs) > 1 else "-"


def ensure_messages(endpoint: str, pid: int, body: int, batch: int, per_queue: int,
                    queues: int) -> dict[int, int]:
    """Top the topic up to ``per_queue`` messages in each queue; the ranges to pull."""
    from pyspark_pymq.client import PullConsumer

    consumer = PullConsumer(endpoint, "bench_consumer")
    mqs = consumer.queues(TOPIC)
    have = min(consumer.max_offset(mq) for mq in mqs)
    missing = (per_queue - have) * len(mqs)
    if missing > 0:
        count = -(-missing // 2)
        spec = {"kind": "pymq", "endpoint": endpoint, "topic": TOPIC, "body": body, "batch": batch,
                "send_mode": "sync", "count": count, "warmup": 0}
        run_workers([spec, dict(spec)], pid)
    ends = {mq.queue_id: consumer.max_offset(mq) for mq in mqs}
    # every batch lands whole in one queue: pull up to per_queue (at most what is there)
    return {qid: min(end, per_queue) for qid, end in ends.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 repeat of 1 s, 200 B only, 50k messages pulled")
    ap.add_argument("--bodies", default="200,1024", help="body sizes in bytes (default 200,1024)")
    ap.add_argument("--batch", type=int, default=1000, help="messages per send_batch (default 1000)")
    ap.add_argument("--producers", default="1,4", help="producer process counts (default 1,4)")
    ap.add_argument("--flush", default="ASYNC_FLUSH,SYNC_FLUSH", help="flush disk types")
    ap.add_argument("--send-modes", default="sync,async",
                    help="Producer send_mode(s): sync has one batch in flight per producer, async "
                         "up to 8 (default sync,async)")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per send run (default 4)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is shown")
    ap.add_argument("--pull-messages", type=int, default=1_000_000,
                    help="messages read by one pull pass, over 4 queues (default 1,000,000)")
    ap.add_argument("--max-nums", type=int, default=10_000, help="max_nums per pull (default 10000)")
    ap.add_argument("--no-pull", action="store_true", help="skip the pull figures")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare gRPC figures")
    ap.add_argument("--work-dir", default=None, help="where broker data dirs go (default /tmp)")
    ap.add_argument("--json", default=None, help="also write every run to this JSON file")
    ap.add_argument("--wait-quiet", type=float, default=None,
                    help="before each run wait up to this many seconds for the machine to be idle "
                         "(another job's load would be measured too); 0: don't (default 120, "
                         "0 with --quick)")
    ap.add_argument("--single", action="store_true",
                    help="single-message figures: sync send latency and the store path per put")
    ap.add_argument("--sends", type=int, default=3000, help="--single: sends per run (default 3000)")
    ap.add_argument("--puts", type=int, default=20000, help="--single: store puts per run (default 20000)")
    ap.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tls-cert", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tls-key", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_echo:
        serve_echo(args.tls_cert, args.tls_key)
        return 0
    compile_bytecode()  # the broker and producer processes start as from an installed pymq
    if args.single:
        return single(args, argv)
    if args.wait_quiet is None:
        args.wait_quiet = 0.0 if args.quick else 120.0
    if args.quick:
        args.bodies, args.duration, args.repeats = "200", 1.0, 1
        args.pull_messages = min(args.pull_messages, 50_000)
    bodies = [int(x) for x in args.bodies.split(",")]
    producer_counts = [int(x) for x in args.producers.split(",")]
    flushes = [x.strip().upper() for x in args.flush.split(",")]
    send_modes = [x.strip() for x in args.send_modes.split(",")]
    if not set(send_modes) <= {"sync", "async"}:
        ap.error("--send-modes takes sync and/or async")
    info = machine_info()
    print_machine(info, sys.argv if argv is None else ["benchmarks/bench_broker.py", *argv])
    work_dir = Path(tempfile.mkdtemp(prefix="pymq-bench-", dir=args.work_dir))
    runs: list[dict[str, Any]] = []
    started = time.monotonic()

    def record(**kw: Any) -> dict[str, Any]:
        runs.append(kw)
        print(f"  {kw['figure']:<10} " + " ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in kw.items() if k not in ("figure", "n", "calls", "bytes", "wall")
            and v is not None
        ), file=sys.stderr, flush=True)
        return kw

    def measure(specs: Sequence[dict[str, Any]], pid: int | None) -> dict[str, Any]:
        busy = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else None
        return {"busy_before": busy, **run_workers(specs, pid)}

    try:
        with running_echo() if not args.no_bare else contextlib.nullcontext((None, None)) as (
            echo_ep, echo_pid,
        ):
            for flush in flushes:
                for body in bodies:
                    req_size, resp_size = wire_sizes(body, args.batch)
                    with running_broker(work_dir, flush) as broker:
                        from pyspark_pymq.client import Admin

                        Admin(broker.endpoint).create_topic(TOPIC, queues=4)
                        for producers in producer_counts:
                            for rep in range(args.repeats):
                                for mode in send_modes:
                                    spec = {"kind": "pymq", "endpoint": broker.endpoint,
                                            "topic": TOPIC, "body": body, "batch": args.batch,
                                            "send_mode": mode, "duration": args.duration}
                                    r = measure([dict(spec) for _ in range(producers)], broker.pid)
                                    record(figure="send", flush=flush, body=body, producers=producers,
                                           mode=mode, rep=rep,
                                           rss_kib=proc_status(broker.pid).get("VmRSS", 0), **r)
                                if echo_ep and flush == flushes[0]:
                                    bspec = {"kind": "bare", "endpoint": echo_ep, "batch": args.batch,
                                             "req_size": req_size, "resp_size": resp_size,
                                             "duration": args.duration}
                                    r = measure([dict(bspec) for _ in range(producers)], echo_pid)
                                    record(figure="bare_send", body=body, producers=producers,
                                           rep=rep, req_size=req_size, resp_size=resp_size, **r)
                        if args.no_pull or flush != flushes[0]:
                            continue
                        per_queue = -(-args.pull_messages // 4)
                        ranges = ensure_messages(broker.endpoint, broker.pid, body, args.batch,
                                                 per_queue, 4)
                        for rep in range(args.repeats):
                            raw_stats: dict[str, Any] = {}
                            for kind in ("pull", "pull_raw"):
                                spec = {"kind": kind, "endpoint": broker.endpoint, "topic": TOPIC,
                                        "ranges": ranges, "max_nums": args.max_nums, "count": 1,
                                        "warmup": 1}
                                r = measure([spec], broker.pid)
                                record(figure=kind, body=body, rep=rep, **r)
                                if kind == "pull_raw":
                                    raw_stats = r
                            if echo_ep and raw_stats.get("calls"):
                                calls = raw_stats["calls"]
                                bspec = {"kind": "bare_pull", "bare_endpoint": echo_ep,
                                         "msgs_per_call": raw_stats["n"] // calls,
                                         "req_size": pull_request_size(),
                                         "resp_size": raw_stats["bytes"] // calls + 60,
                                         "duration": max(1.0, raw_stats["wall"]), "warmup": 3}
                                r = measure([bspec], echo_pid)
                                record(figure="bare_pull", body=body, rep=rep,
                                       resp_size=bspec["resp_size"], **r)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    elapsed = time.monotonic() - started
    report(runs, args, info, elapsed)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "argv": sys.argv, "runs": runs},
                                              indent=1))
    return 0


def store_put_us(body: int, puts: int, encoded: bool) -> float:
    """µs per put of one message, straight into a DefaultMessageStore (no gRPC, no broker)."""
    from pymq_broker.store.commit_log import MessageToStore
    from pymq_broker.store.config import MessageStoreConfig
    from pymq_broker.store.encoded_batch import parse_encoded
    from pymq_broker.store.message_store import DefaultMessageStore
    from pyspark_pymq.client.codec import encode_records

    data = Path(tempfile.mkdtemp(prefix="pymq-single-"))
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=data), b"\x7f\0\0\x01\0\0\x27\x10")
    store.load()
    store.start()
    payload = os.urandom(body)
    props = [b"UNIQ_KEY\x01%032X\x02" % i for i in range(puts + 1000)]
    try:
        if encoded:
            encoded_puts = [encode_records(TOPIC, [payload], [p]) for p in props]
            images = [(raw, sizes.tobytes()) for raw, sizes in encoded_puts]

            def put(i: int) -> None:
                raw, sizes = images[i]
                store.put_records(TOPIC, 0, parse_encoded(raw, sizes, TOPIC))
        else:
            msgs = [MessageToStore(payload, 0, p, 1) for p in props]

            def put(i: int) -> None:
                store.put_messages(TOPIC, 0, [msgs[i]])

        for i in range(1000):  # warm-up
            put(puts + i)
        t0 = time.perf_counter()
        for i in range(puts):
            put(i)
        return (time.perf_counter() - t0) / puts * 1e6
    finally:
        store.shutdown()
        shutil.rmtree(data, ignore_errors=True)


def send_latencies(endpoint: str, body: int, sends: int) -> list[float]:
    """Seconds of each synchronous ``Producer.send`` of one message (after 200 warm-up sends)."""
    from pyspark_pymq.client import Message, Producer

    producer = Producer(endpoint, send_mode="sync")
    payload = os.urandom(body)
    out: list[float] = []
    try:
        for i in range(200 + sends):
            msg = Message(TOPIC, payload)
            t0 = time.perf_counter()
            producer.send(msg)
            if i >= 200:
                out.append(time.perf_counter() - t0)
    finally:
        producer.close()
    return out


def single(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """The single-message figures (``--single``): one table, medians of ``--repeats`` runs."""
    info = machine_info()
    print_machine(info, sys.argv if argv is None else ["benchmarks/bench_broker.py", *argv])
    body = int(args.bodies.split(",")[0])
    if args.quick:
        args.repeats, args.sends, args.puts = 1, 500, 3000
    work_dir = Path(tempfile.mkdtemp(prefix="pymq-bench-", dir=args.work_dir))
    rows: list[dict[str, Any]] = []
    try:
        with running_broker(work_dir, "ASYNC_FLUSH") as broker:
            from pyspark_pymq.client import Admin

            Admin(broker.endpoint).create_topic(TOPIC, queues=4)
            for rep in range(args.repeats):
                busy = wait_quiet(args.wait_quiet) if args.wait_quiet else None
                cpu0 = proc_cpu_seconds(broker.pid)
                b0, t0 = machine_busy_seconds()
                lat = sorted(send_latencies(broker.endpoint, body, args.sends))
                b1, t1 = machine_busy_seconds()
                broker_cpu = proc_cpu_seconds(broker.pid) - cpu0
                row = {
                    "rep": rep, "p50_ms": lat[len(lat) // 2] * 1e3,
                    "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
                    "msgs_s": len(lat) / sum(lat), "broker_us_per_send": broker_cpu / len(lat) * 1e6,
                    "machine_busy": (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0, "busy_before": busy,
                    "store_classic_us": store_put_us(body, args.puts, encoded=False),
                    "store_encoded_us": store_put_us(body, args.puts, encoded=True),
                }
                rows.append(row)
                print("  single " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in row.items()), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    keys = ["p50_ms", "p99_ms", "msgs_s", "broker_us_per_send", "store_classic_us", "store_encoded_us",
            "machine_busy"]
    print(f"\nsingle messages, {body} B body, {args.sends} sync sends and {args.puts} store puts per "
          f"run, median of {len(rows)} run(s) (spread min-max):\n")
    print(table(["figure", "median", "spread"],
                [[k, f"{median([r[k] for r in rows]):.3g}",
                  f"{min(r[k] for r in rows):.3g}-{max(r[k] for r in rows):.3g}"] for k in keys]))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "argv": sys.argv, "single": rows}, indent=1))
    return 0


def report(runs: list[dict[str, Any]], args: argparse.Namespace, info: dict[str, str],
           elapsed: float) -> None:
    def pick(**kw: Any) -> list[dict[str, Any]]:
        return [r for r in runs if all(r.get(k) == v for k, v in kw.items())]

    def med(sel: list[dict[str, Any]], key: str) -> float:
        return median([r[key] for r in sel if r.get(key) is not None])

    print(f"## Send: `send_batch` of {args.batch} messages, each producer its own process "
          f"(median of {args.repeats} x {args.duration:g} s)\n")
    rows = []
    for flush, body, producers, mode in dict.fromkeys(
        (r["flush"], r["body"], r["producers"], r["mode"]) for r in pick(figure="send")
    ):
        sel = pick(figure="send", flush=flush, body=body, producers=producers, mode=mode)
        rates = [r["rate"] for r in sel]
        rate = median(rates)
        bare = [r["rate"] for r in pick(figure="bare_send", body=body, producers=producers)]
        bare_rate = median(bare)
        rows.append([
            flush, body, producers, mode, fmt_rate(rate), f"{rate * body / MB:,.1f}",
            spread(rates), f"{med(sel, 'server_cpu'):.0%}", f"{med(sel, 'server_us_per_msg'):.1f}",
            f"{med(sel, 'client_us_per_msg'):.1f}", f"{med(sel, 'other_cpu'):.2f}",
            fmt_rate(bare_rate) if bare else "n/a",
            f"{rate / bare_rate:.2f}" if bare else "n/a",
        ])
    print(table(["flush", "body B", "producers", "send_mode", "msgs/s", "MB/s (bodies)",
                 "min-max msgs/s", "broker CPU", "broker CPU us/msg", "producers CPU us/msg",
                 "other load (cores)", "bare gRPC msgs-eq/s", "pymq / bare"], rows))
    bare_rows = []
    for body, producers in dict.fromkeys((r["body"], r["producers"]) for r in pick(figure="bare_send")):
        sel = pick(figure="bare_send", body=body, producers=producers)
        rate = med(sel, "rate")
        bare_rows.append([body, producers, sel[0]["req_size"], sel[0]["resp_size"],
                          f"{rate / args.batch:,.0f}", fmt_rate(rate),
                          f"{rate / args.batch * sel[0]['req_size'] / MB:,.0f}",
                          f"{med(sel, 'server_cpu'):.0%}", f"{med(sel, 'other_cpu'):.2f}"])
    if bare_rows:
        print(f"\nBare gRPC (grpc.aio server, identity serializers, same request/response sizes as "
              f"a {args.batch}-message SendMessage):\n")
        print(table(["body B", "callers", "request B", "response B", "calls/s", "msgs-eq/s",
                     "request MB/s", "server CPU", "other load (cores)"], bare_rows))
    pull_rows = []
    for body in dict.fromkeys(r["body"] for r in pick(figure="pull")):
        for kind, label in (("pull", "pull (MessageExt)"), ("pull_raw", "pull_raw (records)"),
                            ("bare_pull", "bare gRPC, same response sizes")):
            sel = pick(figure=kind, body=body)
            if not sel:
                continue
            rates = [r["rate"] for r in sel]
            rate = median(rates)
            pull_rows.append([body, label, fmt_rate(rate), f"{rate * body / MB:,.1f}", spread(rates),
                              f"{med(sel, 'server_cpu'):.0%}",
                              f"{med(sel, 'server_us_per_msg'):.2f}",
                              f"{med(sel, 'client_us_per_msg'):.2f}", f"{med(sel, 'other_cpu'):.2f}"])
    if pull_rows:
        n = pick(figure="pull_raw")[0]["n"] if pick(figure="pull_raw") else 0
        print(f"\n## Pull: {n:,} messages over 4 queues per pass, max_nums={args.max_nums}, "
              f"1 consumer process (median of {args.repeats} passes; data in the page cache)\n")
        print(table(["body B", "read", "msgs/s", "MB/s (bodies)", "min-max msgs/s", "server CPU",
                     "server CPU us/msg", "consumer CPU us/msg", "other load (cores)"], pull_rows))
    targets = []
    for flush, body, producers, goal, what in (
        ("ASYNC_FLUSH", 200, None, 300_000, "batched send, ASYNC_FLUSH"),
        ("SYNC_FLUSH", None, 4, 50_000, "batched send, SYNC_FLUSH"),
    ):
        sel = [r for r in pick(figure="send", flush=flush)
               if (body is None or r["body"] == body) and (producers is None or r["producers"] == producers)]
        for b, p, m in dict.fromkeys((r["body"], r["producers"], r["mode"]) for r in sel):
            rate = median([r["rate"] for r in sel if (r["body"], r["producers"], r["mode"]) == (b, p, m)])
            targets.append([f"{what}, {b} B, {p} producer(s), {m}", f">= {fmt_rate(goal)}",
                            fmt_rate(rate), "met" if rate >= goal else f"missed ({rate / goal:.0%})"])
    for kind, label in (("pull", "pull (MessageExt)"), ("pull_raw", "pull_raw")):
        for body in dict.fromkeys(r["body"] for r in pick(figure=kind)):
            rate = median([r["rate"] for r in pick(figure=kind, body=body)])
            targets.append([f"{label}, {body} B", ">= 500.0k", fmt_rate(rate),
                            "met" if rate >= 500_000 else f"missed ({rate / 500_000:.0%})"])
    if targets:
        print("\n## Targets\n")
        print(table(["figure", "target msgs/s", "measured", "verdict"], targets))
    noisy = [r for r in runs if r.get("other_cpu", 0) > 0.3]
    print(f"\n(total {elapsed:.0f} s; {len(noisy)} of {len(runs)} runs shared the machine with "
          f"more than 0.3 cores of other load)")


if __name__ == "__main__":
    sys.exit(main())
