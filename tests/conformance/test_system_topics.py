"""The system topics' and the group's configuration, as Admin shows them.

RocketMQ: %RETRY%<group> exists once a consumer of the group registered (HEART_BEAT; pymq's
PullConsumer.register), with 1 queue, perm 6 (read and write); %DLQ%<group> from its first dead
letter, 1 queue, perm 6; SCHEDULE_TOPIC_XXXX has 18 queues (one per delay level) on each broker,
perm 6. A group's retryMaxTimes is 16 and retryQueueNums 1. (Admin(namesrv_addr=...) only reads.)
"""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, SendBackResult
from pyspark_pymq.errors import TopicNotExistError

from .conftest import BROKER, Target, send_and_read

pytestmark = pytest.mark.integration


def _topic_row(target: Target, name: str) -> tuple[int, int, int]:
    """(read queues, write queues, perm) of ``name`` in Admin.topics(include_system=True)."""
    df = target.admin().topics(include_system=True)
    rows = df[df.topic == name]
    assert len(rows) == 1, f"{name} not in Admin.topics: {sorted(df.topic)}"
    row = rows.iloc[0]
    return int(row.read_queues), int(row.write_queues), int(row.perm)


def _queues_on_broker(target: Target, name: str) -> tuple[list[int], list[int]]:
    """The write and read queue ids of ``name`` on broker-a, from its route."""
    route = target.backend.route(name, refresh=True)
    return ([mq.queue_id for mq in route.publish_queues if mq.broker_name == BROKER],
            [mq.queue_id for mq in route.subscribe_queues if mq.broker_name == BROKER])


def test_retry_and_dlq_topics_of_a_group(target: Target, scratch_topic: str) -> None:
    group = target.unique("g")
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    consumer = target.consumer(group)
    _, message = send_and_read(target, Message(scratch_topic, b"x"))
    consumer.pull(target.mq(scratch_topic), message.queue_offset, 1)  # the broker knows the group now
    assert retry not in target.admin().topic_names(include_system=True)

    consumer.register(scratch_topic)
    assert retry in target.admin().topic_names(include_system=True)
    assert _topic_row(target, retry) == (1, 1, 6)
    assert _queues_on_broker(target, retry) == ([0], [0])

    assert dlq not in target.admin().topic_names(include_system=True)
    assert consumer.send_back(message, delay_level=-1) == SendBackResult(dlq, True, False)
    target.wait_for(target.mq(dlq), 1, timeout=5)
    assert _topic_row(target, dlq) == (1, 1, 6)
    assert _queues_on_broker(target, dlq) == ([0], [0])

    df = target.admin().groups()
    rows = df[df.group == group]
    assert [(int(r.retry_max_times), int(r.retry_queue_nums)) for r in rows.itertuples()] == [(16, 1)]


def test_schedule_topic(target: Target) -> None:
    stats = target.admin().topic_stats("SCHEDULE_TOPIC_XXXX")
    assert sorted(stats[stats.broker_name == BROKER].queue_id) == list(range(18))
    assert _queues_on_broker(target, "SCHEDULE_TOPIC_XXXX") == (list(range(18)), list(range(18)))
    assert _topic_row(target, "SCHEDULE_TOPIC_XXXX")[2] == 6


def test_asking_for_the_route_of_an_unregistered_groups_retry_topic(target: Target) -> None:
    """Before any consumer of the group registered, %RETRY%<group> has no route (a route query
    does not create it)."""
    group = target.unique("g")
    with pytest.raises(TopicNotExistError):
        target.consumer(group).queues(f"%RETRY%{group}")
    assert f"%RETRY%{group}" not in target.admin().topic_names(include_system=True)
