"""Retry settings of a group with several consumers.

RocketMQ (consumerSendMsgBack): the maxReconsumeTimes a consumer sends with each send back
decides for that message (a client's -1 or no setting: 16); the group's own retryMaxTimes
(its subscription group config) stays 16 whatever consumers send.
"""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, SendBackResult

from .conftest import Target, send_and_read

pytestmark = pytest.mark.integration


def _group_retry_settings(target: Target, group: str) -> tuple[int, int]:
    """(retry_max_times, retry_queue_nums) of ``group``, as Admin.groups shows them."""
    df = target.admin().groups()
    rows = df[df.group == group]
    assert len(rows) == 1, df
    # a group the brokers made for a send back: enabled, not orderly (RocketMQ's defaults)
    assert (bool(rows.iloc[0].consume_enable), bool(rows.iloc[0].consume_message_orderly)) == (True, False)
    return int(rows.iloc[0].retry_max_times), int(rows.iloc[0].retry_queue_nums)


def test_each_send_back_carries_its_consumers_max_and_the_group_keeps_16(
    target: Target, scratch_topic: str
) -> None:
    group = target.unique("g")
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    a, b, c = target.consumer(group), target.consumer(group), target.consumer(group)  # max 5, 1, unset
    _, m1 = send_and_read(target, Message(scratch_topic, b"one"))
    _, m2 = send_and_read(target, Message(scratch_topic, b"two"))

    # first failures: reconsumeTimes 0 is below both 5 and 1
    assert a.send_back(m1, max_reconsume_times=5) == SendBackResult(retry, False, False)
    assert b.send_back(m2, max_reconsume_times=1) == SendBackResult(retry, False, False)
    assert _group_retry_settings(target, group) == (16, 1)
    retry_q = target.mq(retry)
    m1_1 = target.find(retry_q, 0, m1.msg_id, reconsume_times=1)
    m2_1 = target.find(retry_q, 0, m2.msg_id, reconsume_times=1)

    # m1 (A allowed 5) fails on B, whose max is 1: the DLQ, by B's setting
    assert b.send_back(m1_1, max_reconsume_times=1) == SendBackResult(dlq, True, False)
    dead = target.message_at(target.mq(dlq), 0, timeout=5)
    assert (dead.msg_id, dead.reconsume_times) == (m1.msg_id, 2)

    # m2 (B allowed 1) fails on C, which sets nothing: 16, so back to %RETRY%
    assert c.send_back(m2_1) == SendBackResult(retry, False, False)
    m2_2 = target.find(retry_q, 0, m2.msg_id, reconsume_times=2)
    assert a.send_back(m2_2, max_reconsume_times=5) == SendBackResult(retry, False, False)
    m2_3 = target.find(retry_q, 0, m2.msg_id, reconsume_times=3)
    assert m2_3.retry_topic == scratch_topic
    assert _group_retry_settings(target, group) == (16, 1)
