#!/usr/bin/env python
"""RocketMQ 5's official Python client against the embedded broker (apache.rocketmq.v2, issue 18).

1. Send: ``rocketmq-python-client``'s ``Producer.send`` (one message per call and
   per gRPC request, as the client sends) and ``send_async`` with all futures
   in flight, 200 B bodies.
2. Receive: a ``SimpleConsumer`` receiving batches of 32 and acking each
   message (``ack``), until every message is acked.

The client does one RPC per message for sends and acks, so these figures
measure the client and the v2 layer per message, not the store (see
"Broker: send" for that). One broker process, the client in this process.

    python benchmarks/bench_rocketmq_v2.py            # 20,000 messages
    python benchmarks/bench_rocketmq_v2.py --quick    # 3,000
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = [str(ROOT / d) for d in ("connector", "broker_stub", "proto")]
sys.path[:0] = [*SRC, str(ROOT / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join([*SRC, os.environ.get("PYTHONPATH", "")])

from broker_process import BrokerProcess  # noqa: E402
from pyspark_pymq import Admin  # noqa: E402
from rocketmq import (  # noqa: E402
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("-n", type=int, default=None)
    args = ap.parse_args()
    n = args.n or (3_000 if args.quick else 20_000)
    logging.getLogger("rocketmq-python-client").setLevel(logging.ERROR)
    body = b"x" * 200
    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp) / "broker") as broker:
        ep = broker.endpoint
        assert broker.proc is not None
        pid = broker.proc.pid
        Admin(ep).create_topic("v2-bench", 4)
        config = ClientConfiguration(ep, Credentials(), request_timeout=5)  # deadline past a 5 s poll
        producer = Producer(config, ("v2-bench",))
        producer.startup()
        try:
            half = n // 2
            cpu0 = _cpu_s(pid)
            t0 = time.perf_counter()
            for _ in range(half):
                producer.send(_message("v2-bench", body))
            sync_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            futures = [producer.send_async(_message("v2-bench", body)) for _ in range(n - half)]
            for f in futures:
                f.result()
            async_s = time.perf_counter() - t0
            send_cpu = _cpu_s(pid) - cpu0
        finally:
            producer.shutdown()
        consumer = SimpleConsumer(config, "v2-bench-group", {"v2-bench": FilterExpression("*")},
                                  await_duration=2)
        consumer.startup()
        try:
            acked = 0
            cpu0 = _cpu_s(pid)
            t0 = time.perf_counter()
            while acked < n:
                messages = consumer.receive(32, 60)
                for m in messages:  # ack_async of 5.1.2 returns no future (it drops the return)
                    consumer.ack(m)
                acked += len(messages)
            receive_s = time.perf_counter() - t0
            receive_cpu = _cpu_s(pid) - cpu0
        finally:
            consumer.shutdown()
    print(f"official Python client {n} x 200 B against the embedded broker")
    print(f"  send (sync, one per call)   {half / sync_s:10,.0f} msgs/s")
    print(f"  send_async (all in flight)  {(n - half) / async_s:10,.0f} msgs/s")
    print(f"  receive 32 + ack each       {n / receive_s:10,.0f} msgs/s")
    print(f"  broker CPU per message: send {send_cpu / n * 1e6:,.0f} us, receive + ack "
          f"{receive_cpu / n * 1e6:,.0f} us")


if __name__ == "__main__":
    main()
