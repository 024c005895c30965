"""A producer's delayed message (delay level 2): SCHEDULE_TOPIC_XXXX queue 1, then the real queue.

RocketMQ (CommitLog.asyncPutMessage, then ScheduleMessageService): the message is stored in
SCHEDULE_TOPIC_XXXX queue level-1 with DELAY, REAL_TOPIC and REAL_QID; the send result names the
real topic's queue but carries the schedule queue's offset (and the schedule copy's offsetMsgId).
When its time comes it is written again to the real queue: same msgId (UNIQ_KEY), a new
offsetMsgId, DELAY, REAL_TOPIC and REAL_QID kept.
"""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, SendStatus

from .conftest import Target

pytestmark = pytest.mark.integration

SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def test_delayed_message_is_scheduled_then_delivered(target: Target) -> None:
    topic = target.topic("delayed")
    mq = target.mq(topic)
    producer = target.producer()
    for i in range(2):  # the real queue's offsets run ahead of the schedule queue's
        producer.send_sync(Message(topic, f"now-{i}"))
    target.wait_for(mq, 2)
    level2 = target.mq(SCHEDULE, 1)
    start = target.max_offset(level2)

    result = producer.send_sync(Message(topic, b"later", tags="T", keys=("k",), properties={"a": "1"},
                                        delay_level=2))
    scheduled = target.find(level2, start, result.msg_id)
    assert result.status is SendStatus.SEND_OK
    assert result.message_queue == mq
    assert result.queue_offset == scheduled.queue_offset  # the schedule queue's offset, not 2
    assert result.offset_msg_id == scheduled.offset_msg_id
    assert (scheduled.topic, scheduled.queue_id, scheduled.reconsume_times) == (SCHEDULE, 1, 0)
    expected = {
        "UNIQ_KEY": result.msg_id, "TAGS": "T", "KEYS": "k", "a": "1",
        "DELAY": "2", "REAL_TOPIC": topic, "REAL_QID": "0", **target.broker_stamps(scheduled.properties),
    }
    assert scheduled.properties == expected

    delivered = target.message_at(mq, 2)
    assert (delivered.topic, delivered.queue_id, delivered.msg_id, delivered.reconsume_times) == (
        topic, 0, result.msg_id, 0)
    assert delivered.offset_msg_id != result.offset_msg_id
    assert delivered.commit_log_offset > scheduled.commit_log_offset
    assert (delivered.body, delivered.tags, delivered.keys, delivered.born_timestamp) == (
        b"later", "T", ("k",), scheduled.born_timestamp)
    assert delivered.properties == expected
    # delivered once its level's delay has passed since the schedule copy was stored
    assert delivered.store_timestamp >= scheduled.store_timestamp + target.delay_ms(2)
