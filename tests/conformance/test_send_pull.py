"""Send and pull: ids, stored properties, offsets, and what a pull answers at the ends of a queue."""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, PullStatus, SendStatus

from .conftest import HEX32, THREE, Target, ThreeMessages

pytestmark = pytest.mark.integration


def test_send_results_ids_and_offsets(target: Target, three_messages: ThreeMessages) -> None:
    """msgId = UNIQ_KEY (made by the client); offsetMsgId = 32 hex of store IP, port and
    commit-log offset; queue offsets 0, 1, 2 in the queue the result names."""
    t, mq = three_messages, three_messages.mq
    ip = "".join(f"{int(part):02X}" for part in target.store_host.split("."))
    for i, (result, stored) in enumerate(zip(t.results, t.messages, strict=True)):
        assert result.status is SendStatus.SEND_OK
        assert (result.message_queue, result.queue_offset) == (mq, i)
        assert HEX32.fullmatch(result.msg_id), result.msg_id
        assert HEX32.fullmatch(result.offset_msg_id), result.offset_msg_id
        assert result.offset_msg_id == f"{ip}{target.store_port:08X}{stored.commit_log_offset:016X}"
        # what a pull gives back matches the send result
        assert (stored.topic, stored.broker_name, stored.queue_id, stored.queue_offset) == (
            mq.topic, mq.broker_name, mq.queue_id, i)
        assert stored.msg_id == result.msg_id == stored.properties["UNIQ_KEY"]
        assert stored.offset_msg_id == result.offset_msg_id
        assert stored.reconsume_times == 0
        assert stored.born_timestamp <= stored.store_timestamp
        assert stored.body == THREE[i][0]
    assert len({r.msg_id for r in t.results}) == 3
    offsets = [m.commit_log_offset for m in t.messages]
    assert offsets == sorted(offsets) and len(set(offsets)) == 3


def test_stored_properties_of_a_plain_send(target: Target, three_messages: ThreeMessages) -> None:
    """The user's properties, TAGS, KEYS (space-joined) and UNIQ_KEY, plus what the broker stamps:
    CLUSTER, MSG_REGION, TRACE_ON. pymq's Producer sets no WAIT (RocketMQ's Java client puts
    WAIT=true on every message; a pymq client's message goes without it, on RocketMQ too)."""
    tagged, bare, _ = three_messages.messages
    assert tagged.properties == {
        "UNIQ_KEY": tagged.msg_id, "TAGS": "TagA", "KEYS": "k1 k2", "color": "red",
        **target.broker_stamps(tagged.properties),
    }
    assert (tagged.tags, tagged.keys) == ("TagA", ("k1", "k2"))
    assert bare.properties == {"UNIQ_KEY": bare.msg_id, **target.broker_stamps(bare.properties)}
    assert (bare.tags, bare.keys) == (None, ())


def test_user_properties_leave_out_what_the_broker_stamps(
    target: Target, three_messages: ThreeMessages
) -> None:
    """MessageExt.user_properties: the sender's own properties only, not CLUSTER, MSG_REGION or
    TRACE_ON (system properties in RocketMQ's MessageConst.STRING_HASH_SET)."""
    tagged, bare, _ = three_messages.messages
    assert tagged.user_properties == {"color": "red"}
    assert bare.user_properties == {}


def test_pull_statuses_at_the_ends_of_a_queue(target: Target, three_messages: ThreeMessages) -> None:
    """(offset asked, status, nextBeginOffset, minOffset, maxOffset, queue offsets found) on a queue
    holding offsets 0..2: at the max offset NO_NEW_MSG, past it OFFSET_ILLEGAL, and either way
    nextBeginOffset = the max offset."""
    consumer = target.consumer(target.unique("g"))
    mq = three_messages.mq
    got = []
    for offset, max_nums in [(0, 32), (1, 1), (2, 32), (3, 32), (4, 32), (100, 32)]:
        r = consumer.pull(mq, offset, max_nums)
        got.append((offset, r.status, r.next_begin_offset, r.min_offset, r.max_offset,
                    [m.queue_offset for m in r.messages]))
    assert got == [
        (0, PullStatus.FOUND, 3, 0, 3, [0, 1, 2]),
        (1, PullStatus.FOUND, 2, 0, 3, [1]),
        (2, PullStatus.FOUND, 3, 0, 3, [2]),
        (3, PullStatus.NO_NEW_MSG, 3, 0, 3, []),
        (4, PullStatus.OFFSET_ILLEGAL, 3, 0, 3, []),
        (100, PullStatus.OFFSET_ILLEGAL, 3, 0, 3, []),
    ]


def test_tag_filters_and_a_tag_that_matches_nothing(target: Target, three_messages: ThreeMessages) -> None:
    """A tag nobody has: NO_MATCHED_MSG, no messages, nextBeginOffset past what was scanned."""
    consumer = target.consumer(target.unique("g"))
    mq = three_messages.mq
    got = {}
    for sub in ["TagZ", "TagA", "TagB", "TagA || TagB", "*"]:
        r = consumer.pull(mq, 0, 32, subscription=sub)
        got[sub] = (r.status, r.next_begin_offset, [m.body for m in r.messages])
    assert got == {
        "TagZ": (PullStatus.NO_MATCHED_MSG, 3, []),
        "TagA": (PullStatus.FOUND, 3, [b"m0"]),
        "TagB": (PullStatus.FOUND, 3, [b"m2"]),
        "TagA || TagB": (PullStatus.FOUND, 3, [b"m0", b"m2"]),
        "*": (PullStatus.FOUND, 3, [b"m0", b"m1", b"m2"]),
    }


def test_round_robin_sends_and_an_empty_queue(target: Target) -> None:
    """Sends without a sharding key take the queues in turn; an empty queue answers NO_NEW_MSG
    at offset 0 and OFFSET_ILLEGAL (nextBeginOffset 0) further on."""
    topic = target.topic("rr", queues=4)
    producer = target.producer()
    results = [producer.send_sync(Message(topic, f"rr-{i}")) for i in range(3)]
    queue_ids = [r.queue_id for r in results]
    assert [(q - queue_ids[0]) % 4 for q in queue_ids] == [0, 1, 2]
    assert all(r.queue_offset == 0 for r in results)
    (empty,) = set(range(4)) - set(queue_ids)
    mq = target.mq(topic, empty)
    for r in results:
        target.wait_for(r.message_queue, 1)
    consumer = target.consumer(target.unique("g"))
    got = []
    for offset in (0, 2):
        r = consumer.pull(mq, offset, 32)
        got.append((offset, r.status, r.next_begin_offset, r.min_offset, r.max_offset, len(r.messages)))
    assert got == [(0, PullStatus.NO_NEW_MSG, 0, 0, 0, 0), (2, PullStatus.OFFSET_ILLEGAL, 0, 0, 0, 0)]
