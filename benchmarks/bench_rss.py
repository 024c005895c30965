#!/usr/bin/env python
"""Broker memory (issue 2): RSS with 10 thousand vs 10 million stored messages.

Starts a broker process (ASYNC_FLUSH), writes ``--messages`` small messages
(``--body`` bytes, default 100) with batched sends from ``--producers``
processes, and reads the broker's /proc/PID/status (VmRSS, RssAnon, RssFile,
VmHWM) at 10k, 1M and every further million up to ``--messages``; then after
one ``pull_raw`` pass over every stored message, and after a restart on the
same store. Each row is the median of ``--repeats`` runs, each on a new store.

If writing would pass ``--time-limit`` seconds (or the disk is too small), it
stops where it is and extrapolates RSS to ``--messages`` from a straight line
through the points from 1M on; such rows are labelled "extrapolated".

Usage::

    python benchmarks/bench_rss.py                        # 10M messages, 3 runs (about 6 min)
    python benchmarks/bench_rss.py --quick                # 200k messages, 1 run (about 15 s)
    python benchmarks/bench_rss.py --messages 2000000 --repeats 1

A run of 10M messages of 100 B uses about 2.5 GB of disk (under /tmp by
default; ``--work-dir`` to choose), deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import (
    TOPIC,
    BrokerProcess,
    dir_bytes,
    machine_info,
    print_machine,
    proc_cpu_seconds,
    proc_status,
    run_workers,
    table,
)

MIB = 1024 * 1024


def record_bytes(body: int) -> int:
    """Disk per message: commit-log record (UNIQ_KEY property only), queue entry, index entry."""
    return 80 + body + 2 + len(TOPIC) + 2 + 42 + 20 + 21


def snapshot(broker: BrokerProcess, stored: int, label: str, **extra: Any) -> dict[str, Any]:
    st = proc_status(broker.pid)
    return {
        "label": label,
        "stored": stored,
        "rss": st.get("VmRSS", 0) * 1024,
        "anon": st.get("RssAnon", 0) * 1024,
        "file": st.get("RssFile", 0) * 1024,
        "hwm": st.get("VmHWM", 0) * 1024,
        "disk": dir_bytes(broker.data_dir),
        "cpu_s": proc_cpu_seconds(broker.pid),
        **extra,
    }


class PeakSampler:
    """Samples the broker's VmRSS every 0.1 s in a thread: the peak during a phase."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, proc_status(self.pid).get("VmRSS", 0) * 1024)
            self._stop.wait(0.1)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_run(args: argparse.Namespace, work_dir: Path, checkpoints: list[int]) -> dict[str, Any]:
    """Fill one new store up to ``args.messages``; the snapshots along the way."""
    from pyspark_pymq.client import Admin, PullConsumer

    data_dir = Path(tempfile.mkdtemp(prefix="rss-", dir=work_dir))
    broker = BrokerProcess(data_dir, ["--log-level", "WARNING"], flush_disk_type=args.flush)
    broker.start()
    snaps: list[dict[str, Any]] = []
    stored = 0
    started = time.monotonic()
    stopped_early = False
    try:
        Admin(broker.endpoint).create_topic(TOPIC, queues=args.queues)
        time.sleep(0.5)
        snaps.append(snapshot(broker, 0, "started, empty"))
        spec = {"kind": "pymq", "endpoint": broker.endpoint, "topic": TOPIC, "body": args.body,
                "batch": args.batch, "send_mode": args.send_mode, "warmup": 0}
        for target in checkpoints:
            todo = target - stored
            if todo <= 0:
                continue
            elapsed = time.monotonic() - started
            rate = (stored / elapsed) if stored >= 100_000 else None
            if rate and elapsed + todo / rate > args.time_limit:
                stopped_early = True
                print(f"  stopping at {stored:,}: {target:,} would pass --time-limit "
                      f"{args.time_limit:g} s at {rate:,.0f} msgs/s", file=sys.stderr, flush=True)
                break
            per = -(-todo // args.producers)
            with PeakSampler(broker.pid) as peak:
                r = run_workers([dict(spec, count=per) for _ in range(args.producers)], broker.pid)
            stored += r["n"]
            time.sleep(1.0)  # let the flush services catch up
            snaps.append(snapshot(broker, stored, f"{target:,} written", rate=r["rate"],
                                  peak=peak.peak))
            print(f"  {stored:>12,} stored: VmRSS {snaps[-1]['rss'] / MIB:7.1f} MiB, "
                  f"writing at {r['rate']:,.0f} msgs/s", file=sys.stderr, flush=True)
        # one pull_raw pass over every stored message
        consumer = PullConsumer(broker.endpoint, "bench_consumer")
        ranges = {mq.queue_id: consumer.max_offset(mq) for mq in consumer.queues(TOPIC)}
        pull = {"kind": "pull_raw", "endpoint": broker.endpoint, "topic": TOPIC, "ranges": ranges,
                "max_nums": args.max_nums, "count": 1, "warmup": 0}
        with PeakSampler(broker.pid) as peak:
            r = run_workers([pull], broker.pid)
        time.sleep(0.5)
        snaps.append(snapshot(broker, stored, "after pull_raw of all", rate=r["rate"],
                              peak=peak.peak))
        print(f"  pulled {r['n']:,} at {r['rate']:,.0f} msgs/s: VmRSS "
              f"{snaps[-1]['rss'] / MIB:.1f} MiB", file=sys.stderr, flush=True)
        if not args.no_restart:
            broker.stop()
            t0 = time.monotonic()
            broker.start()
            startup = time.monotonic() - t0
            time.sleep(1.0)
            snaps.append(snapshot(broker, stored, "after restart", startup_s=startup))
            print(f"  restarted in {startup:.2f} s: VmRSS {snaps[-1]['rss'] / MIB:.1f} MiB",
                  file=sys.stderr, flush=True)
    finally:
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return {"snaps": snaps, "stored": stored, "stopped_early": stopped_early,
            "seconds": time.monotonic() - started}


def extrapolate(points: list[tuple[int, int]], at: int) -> float | None:
    """Least-squares line through (stored, bytes) points; its value at ``at``."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my + slope * (at - mx)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200k messages, 1 run")
    ap.add_argument("--messages", type=int, default=10_000_000, help="messages to store (default 10M)")
    ap.add_argument("--checkpoints", default="10000,1000000",
                    help="where to read RSS on the way (default 10000,1000000; then every million)")
    ap.add_argument("--body", type=int, default=100, help="body bytes (default 100)")
    ap.add_argument("--batch", type=int, default=1000, help="messages per send_batch (default 1000)")
    ap.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    ap.add_argument("--send-mode", default="async", choices=("sync", "async"))
    ap.add_argument("--queues", type=int, default=4, help="queues of the topic (default 4)")
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    ap.add_argument("--max-nums", type=int, default=10_000, help="max_nums per pull (default 10000)")
    ap.add_argument("--repeats", type=int, default=3, help="runs; each row shows the median")
    ap.add_argument("--time-limit", type=float, default=900.0,
                    help="seconds of writing per run before stopping and extrapolating (default 900)")
    ap.add_argument("--no-restart", action="store_true", help="skip the restart row")
    ap.add_argument("--work-dir", default=None, help="where the store goes (default /tmp)")
    ap.add_argument("--json", default=None, help="also write every snapshot to this JSON file")
    args = ap.parse_args(argv)
    if args.quick:
        args.messages, args.repeats, args.checkpoints = 200_000, 1, "10000,100000"
    info = machine_info()
    print_machine(info, sys.argv if argv is None else ["benchmarks/bench_rss.py", *argv])
    work_dir = Path(tempfile.mkdtemp(prefix="pymq-rss-", dir=args.work_dir))
    goal = args.messages
    need = goal * record_bytes(args.body)
    free = shutil.disk_usage(work_dir).free
    writable = goal
    if need * 1.2 + 1e9 > free:
        writable = max(10_000, int((free - 1e9) / 1.2 / record_bytes(args.body)))
        print(f"disk: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed for {goal:,} messages: "
              f"writing {writable:,} and extrapolating", file=sys.stderr)
    else:
        print(f"disk: {free / 1e9:.1f} GB free, about {need / 1e9:.1f} GB needed per run",
              file=sys.stderr)
    marks = {int(x) for x in args.checkpoints.split(",") if x.strip()}
    marks |= set(range(1_000_000, writable + 1, 1_000_000)) | {writable}
    checkpoints = sorted(m for m in marks if 0 < m <= writable)
    runs = []
    try:
        for rep in range(args.repeats):
            print(f"run {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
            runs.append(one_run(args, work_dir, checkpoints))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    report(args, runs, goal)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "argv": sys.argv, "runs": runs},
                                              indent=1))
    return 0


def report(args: argparse.Namespace, runs: list[dict[str, Any]], goal: int) -> None:
    def med(label: str, key: str) -> float | None:
        vals = [s[key] for r in runs for s in r["snaps"] if s["label"] == label and key in s]
        return statistics.median(vals) if vals else None

    def mib(x: float | None) -> str:
        return "n/a" if x is None else f"{x / MIB:,.1f}"

    labels = list(dict.fromkeys(s["label"] for r in runs for s in r["snaps"]))
    shown = {"started, empty", "after pull_raw of all", "after restart"}
    shown |= {f"{int(x):,} written" for x in args.checkpoints.split(",") if x.strip()}
    shown |= {labels[i] for i in range(len(labels)) if labels[i].endswith("written")
              and i + 1 < len(labels) and not labels[i + 1].endswith("written")}  # the last one
    rows = []
    for label in labels:
        if label not in shown:
            continue
        stored = med(label, "stored") or 0
        rate = med(label, "rate")
        note = ""
        if label == "after restart":
            note = f"startup {med(label, 'startup_s') or 0:.2f} s"
        elif label == "after pull_raw of all":
            note = f"pull_raw {rate:,.0f} msgs/s, peak VmRSS {mib(med(label, 'peak'))} MiB"
        elif rate:
            note = f"writing {rate:,.0f} msgs/s, peak VmRSS {mib(med(label, 'peak'))} MiB"
        rows.append([label, f"{int(stored):,}", mib(med(label, "rss")), mib(med(label, "anon")),
                     mib(med(label, "file")), mib(med(label, "hwm")),
                     f"{(med(label, 'disk') or 0) / 1e9:,.2f}", note])
    print(f"## Broker RSS: {args.body} B bodies, batches of {args.batch}, {args.producers} producer "
          f"processes ({args.send_mode}), {args.queues} queues, {args.flush} "
          f"(median of {len(runs)} run(s))\n")
    print(table(["point", "stored msgs", "VmRSS MiB", "RssAnon MiB", "RssFile MiB", "VmHWM MiB",
                 "disk GB", "notes"], rows))
    # growth, from the per-million snapshots
    small = med(f"{min(int(x) for x in args.checkpoints.split(',')):,} written", "rss")
    stored_max = min(r["stored"] for r in runs)
    written = [lab for lab in labels if lab.endswith("written")]
    last = written[-1] if written else None
    big = med(last, "rss") if last else None
    print()
    if last and stored_max < goal:
        pts = sorted(
            (s["stored"], s["rss"]) for r in runs for s in r["snaps"]
            if s["label"].endswith("written") and s["stored"] >= 1_000_000
        )
        est = extrapolate(pts, goal)
        print(f"Stored {stored_max:,} of {goal:,} messages (time or disk limit). "
              f"**Extrapolated** VmRSS at {goal:,}: "
              f"{mib(est)} MiB (least squares over {len(pts)} points from 1M on).")
    if small and big:
        print(f"VmRSS at {last}: {mib(big)} MiB vs {mib(small)} MiB at the first checkpoint "
              f"(x{big / small:.2f}).")
    curve = [(lab, med(lab, "rss")) for lab in written]
    print("VmRSS along the way (MiB): " + ", ".join(
        f"{lab.split()[0]}: {mib(v)}" for lab, v in curve))
    per_run = [r["seconds"] for r in runs]
    print(f"(write + pull + restart: {statistics.median(per_run):.0f} s per run)")


if __name__ == "__main__":
    sys.exit(main())
