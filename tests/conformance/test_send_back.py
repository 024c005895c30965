"""Send back: SCHEDULE_TOPIC_XXXX -> %RETRY%<group> -> %DLQ%<group>, counts and properties.

RocketMQ's broker (SendMessageProcessor.consumerSendMsgBack) reads the original from the commit
log and writes a new message: delay level 3 + reconsumeTimes when the client asked for 0, stored
in SCHEDULE_TOPIC_XXXX queue level-1 (REAL_TOPIC = %RETRY%<group>, REAL_QID = 0), reconsumeTimes
+1, RETRY_TOPIC = the original topic, ORIGIN_MESSAGE_ID = the original's offsetMsgId (kept from
the first send back on), WAIT=false; UNIQ_KEY, body, tags, keys and bornTimestamp kept. Once
reconsumeTimes reaches the consumer's maxReconsumeTimes (or with a delay level < 0) it goes to
%DLQ%<group> at once, DELAY=0, everything else kept.
"""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, SendBackResult

from .conftest import Target, send_and_read

pytestmark = pytest.mark.integration

SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def test_send_back_goes_through_schedule_and_retry_to_the_dlq(target: Target, scratch_topic: str) -> None:
    group = target.unique("g")
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    retry_q, dlq_q = target.mq(retry), target.mq(dlq)
    _, orig = send_and_read(target, Message(scratch_topic, b"fails", tags="TagA", keys=("order-7",),
                                            properties={"color": "red"}))
    consumer = target.consumer(group)
    copy = {**orig.properties, "RETRY_TOPIC": scratch_topic, "ORIGIN_MESSAGE_ID": orig.offset_msg_id,
            "WAIT": "false", "REAL_TOPIC": retry, "REAL_QID": "0"}

    # 1st failure: level 3 + 0, through SCHEDULE_TOPIC_XXXX queue 2
    level3 = target.mq(SCHEDULE, 2)
    start = target.max_offset(level3)
    assert consumer.send_back(orig, max_reconsume_times=2) == SendBackResult(retry, False, False)
    scheduled = target.find(level3, start, orig.msg_id)
    assert (scheduled.topic, scheduled.queue_id, scheduled.reconsume_times) == (SCHEDULE, 2, 1)
    assert scheduled.properties == {**copy, "DELAY": "3", **target.send_back_extras(1, 2)}

    first = target.message_at(retry_q, 0)
    assert (first.msg_id, first.reconsume_times, first.retry_topic) == (orig.msg_id, 1, scratch_topic)
    assert (first.body, first.tags, first.keys, first.born_timestamp) == (
        orig.body, orig.tags, orig.keys, orig.born_timestamp)
    assert first.offset_msg_id not in (orig.offset_msg_id, scheduled.offset_msg_id)
    assert first.properties == {**copy, "DELAY": "3", **target.send_back_extras(1, 2)}

    # 2nd failure: level 3 + 1; ORIGIN_MESSAGE_ID still the first message's
    assert consumer.send_back(first, max_reconsume_times=2) == SendBackResult(retry, False, False)
    second = target.message_at(retry_q, 1)
    assert (second.msg_id, second.reconsume_times, second.born_timestamp) == (
        orig.msg_id, 2, orig.born_timestamp)
    assert second.properties == {**copy, "DELAY": "4", **target.send_back_extras(2, 2)}

    # 3rd failure: reconsumeTimes 2 >= maxReconsumeTimes 2: %DLQ% at once, no schedule
    assert consumer.send_back(second, max_reconsume_times=2) == SendBackResult(dlq, True, False)
    dead = target.message_at(dlq_q, 0, timeout=5)
    assert (dead.topic, dead.msg_id, dead.reconsume_times, dead.born_timestamp, dead.body) == (
        dlq, orig.msg_id, 3, orig.born_timestamp, b"fails")
    assert dead.properties == {
        **copy, "DELAY": "0", **target.send_back_extras(3, 2),
        **target.dlq_extras(scratch_topic, orig.offset_msg_id),
    }


def test_send_back_with_a_delay_level_and_straight_to_the_dlq(target: Target, scratch_topic: str) -> None:
    """delay_level 1: SCHEDULE_TOPIC_XXXX queue 0, DELAY=1. delay_level -1: %DLQ% at the first
    failure (reconsumeTimes 1), never scheduled (no REAL_TOPIC / REAL_QID), DELAY=0."""
    group = target.unique("g")
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    _, later = send_and_read(target, Message(scratch_topic, b"later"))
    _, doomed = send_and_read(target, Message(scratch_topic, b"doomed", tags="T"))
    consumer = target.consumer(group)

    level1 = target.mq(SCHEDULE, 0)
    start = target.max_offset(level1)
    assert consumer.send_back(later, delay_level=1) == SendBackResult(retry, False, False)
    scheduled = target.find(level1, start, later.msg_id)
    copy = {**later.properties, "RETRY_TOPIC": scratch_topic, "ORIGIN_MESSAGE_ID": later.offset_msg_id,
            "WAIT": "false", "REAL_TOPIC": retry, "REAL_QID": "0", "DELAY": "1",
            **target.send_back_extras(1, 16)}
    assert (scheduled.queue_id, scheduled.properties) == (0, copy)
    retried = target.message_at(target.mq(retry), 0)
    assert (retried.msg_id, retried.reconsume_times, retried.properties) == (later.msg_id, 1, copy)

    assert consumer.send_back(doomed, delay_level=-1) == SendBackResult(dlq, True, False)
    dead = target.message_at(target.mq(dlq), 0, timeout=5)
    assert (dead.msg_id, dead.reconsume_times, dead.tags) == (doomed.msg_id, 1, "T")
    assert dead.properties == {
        **doomed.properties, "RETRY_TOPIC": scratch_topic, "ORIGIN_MESSAGE_ID": doomed.offset_msg_id,
        "WAIT": "false", "DELAY": "0", **target.send_back_extras(1, 16),
        **target.dlq_extras(scratch_topic, doomed.offset_msg_id),
    }
