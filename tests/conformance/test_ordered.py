"""Ordered per key: a sharding key sends all its messages to one queue, where they stay in order."""

from __future__ import annotations

import pytest
from pyspark_pymq import Message

from .conftest import Target

pytestmark = pytest.mark.integration

KEYS = [f"order-{i}" for i in range(6)]


def test_a_sharding_key_keeps_one_queue_in_send_order(target: Target) -> None:
    topic = target.topic("ordered", queues=4)
    producer = target.producer()
    sent: dict[str, list[tuple[int, int]]] = {k: [] for k in KEYS}
    for step in range(5):  # the keys' messages interleaved
        for key in KEYS:
            r = producer.send_sync(Message(topic, f"{key}/{step}", sharding_key=key))
            sent[key].append((r.queue_id, r.queue_offset))
    for key in KEYS:
        assert {q for q, _ in sent[key]} == {producer.queue_for_key(topic, key)}, key
    by_queue: dict[int, list[str]] = {}
    for q in range(4):
        n = sum(1 for key in KEYS for queue_id, _ in sent[key] if queue_id == q)
        for m in target.messages(target.mq(topic, q), n):
            assert m.properties["__SHARDINGKEY"] == m.body.decode().split("/")[0]
            by_queue.setdefault(q, []).append(m.body.decode())
    for key in KEYS:
        q = sent[key][0][0]
        assert [b for b in by_queue[q] if b.startswith(f"{key}/")] == [f"{key}/{s}" for s in range(5)]
        offsets = [o for _, o in sent[key]]
        assert offsets == sorted(offsets)
