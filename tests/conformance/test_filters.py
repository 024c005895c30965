"""Tag and SQL92 filters on a pull (RocketMQ brokers filter SQL92 with enablePropertyFilter=true,
which both targets run with).

Five messages (tag; user properties): m0 TagA n=1 color=red, m1 TagB n=2 color=blue, m2 no tag
n=3, m3 TagA n=4 color=red vip=true, m4 TagC nothing. A filter that matches nothing answers
NO_MATCHED_MSG with nextBeginOffset past what was scanned.
"""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, MessageQueue, PullStatus

from .conftest import Target

pytestmark = pytest.mark.integration

MESSAGES = [
    ("TagA", {"n": "1", "color": "red"}),
    ("TagB", {"n": "2", "color": "blue"}),
    (None, {"n": "3"}),
    ("TagA", {"n": "4", "color": "red", "vip": "true"}),
    ("TagC", {}),
]

CASES = [
    ("TAG", "*", ["m0", "m1", "m2", "m3", "m4"]),
    ("TAG", "TagA", ["m0", "m3"]),
    ("TAG", "TagA || TagC", ["m0", "m3", "m4"]),
    ("TAG", "TagZ", []),
    ("SQL92", "n > 1", ["m1", "m2", "m3"]),
    ("SQL92", "color = 'red'", ["m0", "m3"]),
    ("SQL92", "color IS NULL", ["m2", "m4"]),
    ("SQL92", "color IS NOT NULL OR n = 3", ["m0", "m1", "m2", "m3"]),
    ("SQL92", "n BETWEEN 2 AND 3", ["m1", "m2"]),
    ("SQL92", "TAGS = 'TagA' AND n >= 4", ["m3"]),
    ("SQL92", "color IN ('red', 'blue')", ["m0", "m1", "m3"]),
    ("SQL92", "color <> 'red'", ["m1"]),
    ("SQL92", "vip = TRUE", ["m3"]),
    ("SQL92", "NOT (n > 1)", ["m0"]),
    ("SQL92", "n > 10", []),
]


@pytest.fixture(scope="module")
def five(target: Target) -> MessageQueue:
    topic = target.topic("filters")
    producer = target.producer()
    for i, (tag, props) in enumerate(MESSAGES):
        producer.send_sync(Message(topic, f"m{i}", tags=tag, properties=props))
    mq = target.mq(topic)
    target.wait_for(mq, len(MESSAGES))
    return mq


@pytest.mark.parametrize(("kind", "expression", "bodies"), CASES, ids=[f"{k}:{e}" for k, e, _ in CASES])
def test_filter(target: Target, five: MessageQueue, kind: str, expression: str, bodies: list[str]) -> None:
    r = target.consumer(target.unique("g")).pull(five, 0, 32, subscription=expression, expression_type=kind)
    status = PullStatus.FOUND if bodies else PullStatus.NO_MATCHED_MSG
    assert (r.status, r.next_begin_offset, [m.body.decode() for m in r.messages]) == (status, 5, bodies)
