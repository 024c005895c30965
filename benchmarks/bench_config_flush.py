#!/usr/bin/env python
"""What a broker's periodic consumer-offsets write costs its other clients.

A broker with many consumer groups writes ``consumerOffset.json`` every flush interval (a second)
while their offsets move. Written on the event loop, each write held every client of the broker
for as long as it took to encode and fsync the file. This starts a broker process, commits
``--groups`` groups x 8 queues of progress, keeps a share of them moving from another process,
and times a small request (a committed-offset query) every 2 ms for ``--seconds``: the median,
the 99th percentile, the longest wait and how many waited over 20 / 50 ms.

    .venv/bin/python benchmarks/bench_config_flush.py            # 10,000 groups, 10 s
    .venv/bin/python benchmarks/bench_config_flush.py --quick    # 2,000 groups, 4 s (make bench)
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import side_by_side as sbs

QUEUES = 8


def _commit_all(endpoint: str, groups: range, offset: int) -> None:
    from pyspark_pymq import PullConsumer
    from pyspark_pymq.client.message import MessageQueue

    consumer = PullConsumer(endpoint, "bench-filler")
    broker_name = consumer.queues("flushed")[0].broker_name
    backend = consumer._backend
    for g in groups:
        backend.commit_offsets(f"group-{g}", {MessageQueue("flushed", broker_name, q): offset + q
                                              for q in range(QUEUES)})


def _churn(endpoint: str, groups: int, stop: multiprocessing.synchronize.Event) -> None:
    """Another client's progress: one group in 50 moves every 0.2 s (the file is dirty every flush)."""
    n = 1000
    while not stop.is_set():
        n += 1
        _commit_all(endpoint, range(0, groups, 50), n)
        stop.wait(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="2,000 groups, 4 s")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.seconds = 2_000, 4.0
    sbs.use_repository()
    from broker_process import BrokerProcess
    from pyspark_pymq import Admin, PullConsumer

    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp) / "broker") as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("flushed", queues=QUEUES)
        _commit_all(ep, range(args.groups), 0)
        stop = multiprocessing.get_context("spawn").Event()
        churn = multiprocessing.get_context("spawn").Process(target=_churn, args=(ep, args.groups, stop))
        churn.start()
        try:
            consumer = PullConsumer(ep, "bench-probe")
            mq = consumer.queues("flushed")[0]
            waits: list[float] = []
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                consumer.committed(mq)
                waits.append((time.perf_counter() - started) * 1000)
                time.sleep(0.002)
        finally:
            stop.set()
            churn.join(30)
        size = (Path(tmp) / "broker" / "config" / "consumerOffset.json").stat().st_size
    waits.sort()
    print(f"`{' '.join(sys.argv)}`")
    print(sbs.machine_line())
    print(f"{args.groups} groups x {QUEUES} queues ({size / 1e6:.1f} MB consumerOffset.json), "
          f"{len(waits)} committed-offset queries in {args.seconds:.0f} s:")
    print(f"  median {statistics.median(waits):.2f} ms, p99 {waits[int(len(waits) * 0.99)]:.1f} ms, "
          f"longest {waits[-1]:.1f} ms; over 20 ms: {sum(w > 20 for w in waits)}, "
          f"over 50 ms: {sum(w > 50 for w in waits)}")


if __name__ == "__main__":
    main()
