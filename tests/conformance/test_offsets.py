"""Committed offsets (UPDATE_CONSUMER_OFFSET / QUERY_CONSUMER_OFFSET / GET_CONSUME_STATS).

RocketMQ: a group that never committed has no offset; its consume stats (what ``mqadmin
consumerProgress`` and Admin.group_progress show) read 0 for such a queue. Commits are not
bounds-checked: rewinding is allowed and so is 100 on a 3-message queue. The progress lives on
the broker, so a second instance of the group reads what the first committed. A commit by a group
the broker does not know is refused (SUBSCRIPTION_GROUP_NOT_EXIST): a pull or a heartbeat
creates the group (autoCreateSubscriptionGroup), a commit does not.

pymq's client contract: PullConsumer.committed (Backend.committed) answers -1 for "never
committed" on purpose on both backends (the RocketMQ backend asks with setZeroIfNotFound=false),
so that consumeFromWhere decides where such a group starts; the broker's own answer is the
consumer offset of Admin.group_progress.
"""

from __future__ import annotations

import pytest
from pyspark_pymq import MessageQueue, PullConsumer
from pyspark_pymq.errors import PymqError

from .conftest import Target, ThreeMessages

pytestmark = pytest.mark.integration


def _joined(target: Target, three: ThreeMessages) -> tuple[str, PullConsumer]:
    """A new group that has pulled once (so the broker knows it) and never committed."""
    group = target.unique("g")
    consumer = target.consumer(group)
    consumer.pull(three.mq, 0, 1)
    return group, consumer


def _progress(target: Target, group: str, mq: MessageQueue) -> tuple[int, int, int]:
    """(broker offset, consumer offset, lag) of ``group`` on ``mq``, as Admin.group_progress shows it."""
    df = target.admin().group_progress(group, mq.topic)
    rows = df[(df.broker_name == mq.broker_name) & (df.queue_id == mq.queue_id)]
    assert len(rows) == 1, df
    row = rows.iloc[0]
    return int(row.broker_offset), int(row.consumer_offset), int(row.lag)


def test_a_group_that_never_committed(target: Target, three_messages: ThreeMessages) -> None:
    group, consumer = _joined(target, three_messages)
    mq = three_messages.mq
    assert consumer.committed(mq) == -1  # pymq's client contract, on both backends
    assert _progress(target, group, mq) == (3, 0, 3)  # the broker's answer: 0


def test_commit_and_rewind(target: Target, three_messages: ThreeMessages) -> None:
    group, consumer = _joined(target, three_messages)
    mq = three_messages.mq
    read = []
    for offset in (2, 1, 3, 0):
        consumer.commit(mq, offset)
        read.append(consumer.committed(mq))
    assert read == [2, 1, 3, 0]
    consumer.commit(mq, 1)
    assert _progress(target, group, mq) == (3, 1, 2)


def test_a_commit_beyond_the_max_offset_is_kept(target: Target, three_messages: ThreeMessages) -> None:
    group, consumer = _joined(target, three_messages)
    mq = three_messages.mq
    consumer.commit(mq, 100)
    assert consumer.committed(mq) == 100
    assert _progress(target, group, mq) == (3, 100, 0)


def test_a_second_instance_of_the_group_shares_its_progress(
    target: Target, three_messages: ThreeMessages
) -> None:
    group, first = _joined(target, three_messages)
    mq = three_messages.mq
    first.commit(mq, 2)
    second = target.consumer(group)  # another client: a connection and a backend of its own
    assert second.committed(mq) == 2
    second.commit(mq, 1)
    assert first.committed(mq) == 1
    assert second.committed(mq) == 1


def test_a_commit_by_a_group_the_broker_does_not_know(
    target: Target, three_messages: ThreeMessages
) -> None:
    """RocketMQ refuses a commit from a group that never pulled or registered. The embedded
    broker creates the group at its first commit, on purpose (README, "Differences from Apache
    RocketMQ"): Admin offset resets and progress commits of a group made for them work there."""
    consumer = target.consumer(target.unique("g"))
    mq = three_messages.mq
    if target.is_pymq:
        consumer.commit(mq, 1)
        assert consumer.committed(mq) == 1
        return
    with pytest.raises(PymqError) as err:
        consumer.commit(mq, 1)
    assert err.value.code == "SUBSCRIPTION_GROUP_NOT_EXIST"
    assert consumer.committed(mq) == -1
