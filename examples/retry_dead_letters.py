"""Retries and dead letters, step by step (no Spark): where a failing message goes.

    python examples/retry_dead_letters.py

1. A consumer fails on one order ("poison") and sends it back: the broker keeps
   it in SCHEDULE_TOPIC_XXXX for its delay level, then moves it to
   %RETRY%<group>, where the consumer reads it again with reconsume_times + 1.
2. After max_reconsume_times retries it lands in %DLQ%<group>.
3. People look at the dead letter (by key, by msgId), fix the cause, re-send it
   to its original topic, and it is consumed; then the DLQ is purged.

Delay levels are fast here (milliseconds instead of 10 s, 30 s, 1 min...).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for _d in ("proto", "broker_stub", "connector"):  # a clone works without an install
    if (_ROOT / _d).is_dir() and str(_ROOT / _d) not in sys.path:
        sys.path.insert(0, str(_ROOT / _d))

from pymq_broker import EmbeddedBroker  # noqa: E402
from pyspark_pymq import Admin, Message, MessageExt, Producer, PullConsumer  # noqa: E402
from pyspark_pymq.charts import message_table, retry_dlq_counts  # noqa: E402

TOPIC, GROUP, MAX_RECONSUME = "orders", "billing", 2
FAST_DELAY_LEVELS = " ".join(["100ms"] * 18)
fixed = False  # the bug behind the poison order is fixed in step 3


def charge(order: dict[str, object]) -> None:
    if order["amount"] == "12,50" and not fixed:  # a decimal comma: the bug
        raise ValueError(f"order {order['id']}: cannot parse amount {order['amount']!r}")


class Consumer:
    """A tiny clustering consumer of ``orders`` and ``%RETRY%billing``."""

    def __init__(self, endpoint: str) -> None:
        self.consumer = PullConsumer(endpoint, GROUP)
        self.queues = self.consumer.queues(TOPIC) + self.consumer.retry_queues()
        self.offsets = {mq: max(self.consumer.committed(mq), 0) for mq in self.queues}
        self.events: list[str] = []

    def poll(self) -> list[str]:
        """Consume what is there; returns what happened, one line per message."""
        events = []
        for mq in self.queues:
            result = self.consumer.pull(mq, self.offsets[mq], 100)
            for m in result.messages:
                events.append(self.handle(m))
                self.events.append(events[-1])
            self.offsets[mq] = result.next_begin_offset
        self.consumer.commit_offsets(self.offsets)
        return events

    def handle(self, m: MessageExt) -> str:
        order = json.loads(m.body)
        where = f"{m.topic} (reconsume_times={m.reconsume_times})"
        try:
            charge(order)
        except ValueError as err:
            back = self.consumer.send_back(m, max_reconsume_times=MAX_RECONSUME, reason=str(err))
            return f"  {m.keys[0]} from {where}: FAILED ({err}) -> {back.topic}"
        return f"  {m.keys[0]} from {where}: charged"


def run_until(consumer: Consumer, done: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        for line in consumer.poll():
            print(line)
        time.sleep(0.05)


def main() -> None:
    global fixed
    with EmbeddedBroker(message_delay_level=FAST_DELAY_LEVELS) as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic(TOPIC, queues=2)
        with Producer(broker.endpoint) as producer:
            for i, amount in enumerate(["9.99", "25.00", "12,50", "7.10"], start=1):
                producer.send(Message(TOPIC, json.dumps({"id": i, "amount": amount}),
                                      keys=[f"order-{i}"]))
        print(f"1. sent 4 orders to {TOPIC!r}; order-3 has a decimal comma")

        consumer = Consumer(broker.endpoint)
        print(f"\n2. consume: a failure goes back to %RETRY%{GROUP}, "
              f"after {MAX_RECONSUME} retries to %DLQ%{GROUP}")
        run_until(consumer, lambda: len(admin.dead_letter_messages(GROUP)) == 1)

        print("\n   the group's topics on the broker:")
        topics = admin.topics(include_system=True)
        print(topics[["topic", "messages"]].to_string(index=False))
        print("\n   retries and dead letters per group:")
        print(retry_dlq_counts(admin).to_string(index=False))

        print("\n3. look at the dead letter, fix the cause, re-send it")
        dead = admin.dead_letters(GROUP)
        print(dead[["origin_topic", "keys", "reconsume_times", "reason"]].to_string(index=False))
        history = message_table(admin.query_message(TOPIC, "order-3"))  # by key
        print("\n   order-3 by key in its topic:")
        print(history[["topic", "queue_id", "queue_offset", "msg_id", "body"]].to_string(index=False))
        letter = admin.view_message(dead["msg_id"][0], topic=f"%DLQ%{GROUP}")  # by msgId
        print(f"\n   the dead letter by msgId {letter.msg_id}: {letter.body.decode()}")
        fixed = True
        sent = admin.resend_dead_letters(GROUP)
        print(f"   re-sent {sent} dead letter(s) to {TOPIC!r}")
        run_until(consumer, lambda: "  order-3 from orders (reconsume_times=0): charged" in consumer.events)
        admin.purge_dead_letters(GROUP)
        print(f"\n4. purged: %DLQ%{GROUP} has {len(admin.dead_letters(GROUP))} message(s); "
              f"lag {int(admin.group_progress(GROUP)['lag'].sum())}")


if __name__ == "__main__":
    main()
