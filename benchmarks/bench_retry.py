#!/usr/bin/env python
"""Retry and delay benchmarks (issue 3): deliveries/s, delivery lateness, send backs/s.

Against a real broker process on loopback:

1. **send back**: rows/s of ``PullConsumer.send_back`` (one RPC per message) and of
   ``send_back_batch`` (one RPC per 1,000).
2. **deliveries/s when N fall due at once**: N messages are sent back with delay
   level 1, the broker is stopped, restarted once they are all due, and the
   time until all N are in %RETRY%<group> is measured.
3. **lateness**: a steady stream of delayed messages (level 2 = 500 ms); for each,
   (store time in %RETRY%) - (store time in SCHEDULE_TOPIC_XXXX + 500 ms), p50/p99.

    python benchmarks/bench_retry.py            # N = 100,000
    python benchmarks/bench_retry.py --quick    # N = 10,000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("connector", "broker_stub", "proto", "tests"):
    sys.path.insert(0, str(ROOT / sub))

from broker_process import BrokerProcess  # noqa: E402
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer  # noqa: E402
from pyspark_pymq.client.message import MessageExt  # noqa: E402

GROUP = "bench"


def pull_all(consumer: PullConsumer, mq: MessageQueue, want: int, timeout_s: float = 120) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = 0
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        r = consumer.pull(mq, offset, 10_000, suspend_timeout_ms=200)
        out.extend(r.messages)
        offset = r.next_begin_offset
    return out


def produce(endpoint: str, topic: str, n: int) -> list[MessageExt]:
    Admin(endpoint).create_topic(topic, queues=1)
    with Producer(endpoint) as p:
        for i in range(0, n, 1000):
            p.send_batch([Message(topic, b"x" * 200) for _ in range(min(1000, n - i))])
    consumer = PullConsumer(endpoint, GROUP)
    return pull_all(consumer, consumer.queues(topic)[0], n)


def bench_send_back(endpoint: str, msgs: list[MessageExt], single: int) -> tuple[float, float]:
    consumer = PullConsumer(endpoint, GROUP)
    t0 = time.perf_counter()
    for m in msgs[:single]:
        consumer.send_back(m, delay_level=1)
    one = single / (time.perf_counter() - t0)
    rest = msgs[single:]
    t0 = time.perf_counter()
    for i in range(0, len(rest), 1000):
        consumer.send_back_batch(rest[i : i + 1000], delay_level=1)
    batch = len(rest) / (time.perf_counter() - t0)
    return one, batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 10_000 if args.quick else args.messages
    with tempfile.TemporaryDirectory() as tmp:
        levels = "5s 500ms " + " ".join(["1s"] * 16)
        broker = BrokerProcess(Path(tmp) / "b", ["--message-delay-level", levels]).start()
        try:
            msgs = produce(broker.endpoint, "src", n)
            single = min(2000, n // 5)
            one_rps, batch_rps = bench_send_back(broker.endpoint, msgs, single)
            broker.stop()
            time.sleep(5.5)  # every message is due now
            broker.start()  # delivery starts as the broker starts serving
            t0 = time.perf_counter()
            consumer = PullConsumer(broker.endpoint, GROUP)
            retry_mq = consumer.retry_queues()[0]
            while consumer.max_offset(retry_mq) < n:
                time.sleep(0.01)
            due_rate = n / (time.perf_counter() - t0)

            # lateness under a steady stream with level 2 (500 ms)
            Admin(broker.endpoint).create_topic("late", queues=1)
            late_msgs = produce(broker.endpoint, "late2", 5000)
            base = consumer.max_offset(retry_mq)
            for i in range(0, len(late_msgs), 250):
                consumer.send_back_batch(late_msgs[i : i + 250], delay_level=2)
                time.sleep(0.05)
            sched = pull_all(consumer, MessageQueue("SCHEDULE_TOPIC_XXXX", "broker-a", 1), 5000)
            sched_ts = {m.msg_id: m.store_timestamp for m in sched}
            delivered = []
            offset = base
            deadline = time.monotonic() + 60
            while len(delivered) < 5000 and time.monotonic() < deadline:
                r = consumer.pull(retry_mq, offset, 10_000, suspend_timeout_ms=200)
                delivered.extend(r.messages)
                offset = r.next_begin_offset
            lateness = sorted(m.store_timestamp - (sched_ts[m.msg_id] + 500) for m in delivered)
            p50 = statistics.median(lateness)
            p99 = lateness[int(len(lateness) * 0.99) - 1]
        finally:
            broker.stop()
    print("| figure | value | target |\n|---|---|---|")
    print(f"| send back, one RPC per message | {one_rps:,.0f} rows/s | - |")
    print(f"| send back, batches of 1000 | {batch_rps:,.0f} rows/s | >= 50k |")
    print(f"| delayed deliveries when {n:,} fall due at once | {due_rate:,.0f} msgs/s | >= 50k |")
    print(f"| delivery lateness, 500 ms level, p50 / p99 | {p50:.0f} ms / {p99:.0f} ms | p99 <= 100 ms |")


if __name__ == "__main__":
    main()
