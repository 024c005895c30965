"""The demo pipeline on an embedded broker: produce, consume with retries, dead letters.

    make demo        # or: python examples/demo_pipeline.py

A producer sends orders, some of them poison. A clustering consumer processes
them; a failure is sent back to %RETRY%<group>, returns after a growing delay
(fast delay levels here, so the whole ladder runs in seconds) and, after
maxReconsumeTimes, lands in %DLQ%<group>. Nothing is lost, the consumer never
stops. The run ends with a summary.
"""

from __future__ import annotations

import json
import time

from pymq_broker import EmbeddedBroker
from pyspark_pymq import Admin, Message, MessageExt, Producer, PullConsumer

FAST_DELAY_LEVELS = " ".join(["50ms"] * 3 + ["100ms"] * 15)
TOPIC, GROUP = "orders", "billing"
ORDERS, FLAKY_EVERY, POISON_EVERY, MAX_RECONSUME = 2000, 10, 100, 3


def process(order: dict[str, object], attempt: int) -> None:
    """Business logic: poison orders always fail, flaky ones fail on the first try."""
    if order["poison"]:
        raise ValueError(f"order {order['id']} has an invalid amount")
    if order["flaky"] and attempt == 0:
        raise TimeoutError(f"payment service timed out for order {order['id']}")


def main() -> None:
    with EmbeddedBroker(message_delay_level=FAST_DELAY_LEVELS) as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic(TOPIC, queues=4)
        with Producer(broker.endpoint) as producer:
            producer.send_batch([
                Message(TOPIC, json.dumps({"id": i, "poison": i % POISON_EVERY == 7,
                                           "flaky": i % FLAKY_EVERY == 3}), keys=[f"order-{i}"])
                for i in range(ORDERS)
            ])
        print(f"produced {ORDERS} orders to {TOPIC!r} on {broker.endpoint}")

        consumer = PullConsumer(broker.endpoint, GROUP)
        queues = consumer.queues(TOPIC) + consumer.retry_queues()
        offsets = {mq: max(consumer.committed(mq), 0) for mq in queues}
        delivered: set[int] = set()
        retried = 0
        expected_dead = sum(1 for i in range(ORDERS) if i % POISON_EVERY == 7)
        started = time.monotonic()

        def handle(m: MessageExt) -> None:
            nonlocal retried
            order = json.loads(m.body)
            try:
                process(order, m.reconsume_times)
                delivered.add(int(order["id"]))
            except Exception as err:  # RECONSUME_LATER: back to %RETRY%, later the DLQ
                retried += 1
                consumer.send_back(m, max_reconsume_times=MAX_RECONSUME,
                                   reason=f"{type(err).__name__}: {err}")

        def finished() -> bool:
            return (len(delivered) == ORDERS - expected_dead
                    and len(admin.dead_letter_messages(GROUP)) == expected_dead)

        while not finished():
            if time.monotonic() - started > 120:
                raise SystemExit("demo did not finish in 120 s")
            for mq in queues:
                result = consumer.pull(mq, offsets[mq], 256, suspend_timeout_ms=10)
                for m in result.messages:
                    handle(m)
                offsets[mq] = result.next_begin_offset
            consumer.commit_offsets(offsets)

        dead = admin.dead_letters(GROUP)
        lag = int(admin.group_progress(GROUP)["lag"].sum())
        print()
        print("summary")
        print(f"  delivered      {len(delivered)}")
        print(f"  retried        {retried} (sent back to %RETRY%{GROUP})")
        print(f"  dead-lettered  {len(dead)} (in %DLQ%{GROUP}, each after {MAX_RECONSUME} retries)")
        print(f"  lag            {lag}")
        print(f"  took           {time.monotonic() - started:.1f} s")
        print()
        print("first dead letters:")
        print(dead[["origin_topic", "reconsume_times", "reason"]].head(3).to_string(index=False))


if __name__ == "__main__":
    main()
