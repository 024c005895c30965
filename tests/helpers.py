"""Small helpers shared by the tests."""

from __future__ import annotations

import uuid

from pyspark_pymq import MessageExt, PullConsumer


def unique(prefix: str) -> str:
    """A topic or group name no other test uses (tests share one broker)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def read_all(endpoint: str, topic: str, group: str = "verify") -> list[MessageExt]:
    """Every message of every queue of ``topic``, from each queue's start."""
    consumer = PullConsumer(endpoint, group)
    out: list[MessageExt] = []
    for mq in consumer.queues(topic):
        offset = 0
        while True:
            r = consumer.pull(mq, offset, 10_000)
            if not r.messages:
                break
            out.extend(r.messages)
            offset = r.next_begin_offset
    return out
