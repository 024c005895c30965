"""Broker tables as Spark DataFrames: spark.read.format("pymq").option("view", ...)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.spark.views import VIEWS

pytestmark = pytest.mark.spark


def view(spark: Any, ep: str, name: str, **opts: str) -> Any:
    reader = spark.read.format("pymq").option("endpoint", ep).option("view", name)
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def test_views_show_topics_queues_groups_lag_and_dead_letters(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic, group = unique("viewed"), unique("vg")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, f"m{i}", keys=[f"k{i}", "order"]) for i in range(10)])
    consumer = PullConsumer(ep, group)
    for mq in consumer.queues(topic):
        consumer.commit(mq, consumer.max_offset(mq) // 2)
    m = next(msg for mq in consumer.queues(topic) for msg in consumer.pull(mq, 0, 1).messages)
    consumer.send_back(m, delay_level=-1, reason="broken row")

    topics = {r["topic"]: r for r in view(spark, ep, "topics").collect()}
    assert topics[topic]["messages"] == 10 and topics[topic]["read_queues"] == 2
    assert topics[topic]["last_store_timestamp"] is not None
    assert f"%DLQ%{group}" not in topics
    assert f"%DLQ%{group}" in {r["topic"] for r in view(spark, ep, "TOPICS", includeSystem="true").collect()}
    queues = view(spark, ep, "queues", topic=topic).collect()
    assert sorted(r["queue_id"] for r in queues) == [0, 1] and sum(r["messages"] for r in queues) == 10
    groups = {r["group"]: r for r in view(spark, ep, "groups").collect()}
    assert groups[group]["consume_enable"] is True and groups[group]["consume_message_orderly"] is False
    paused = unique("paused")
    Admin(ep).update_group(paused, consume_enable=False, consume_message_orderly=True)
    row = next(r for r in view(spark, ep, "groups").collect() if r["group"] == paused)
    assert (row["consume_enable"], row["consume_message_orderly"]) == (False, True)
    lag = view(spark, ep, "lag", consumerGroup=group).collect()
    assert sum(r["lag"] for r in lag if r["topic"] == topic) == 10 - sum(
        r["consumer_offset"] for r in lag if r["topic"] == topic)
    dead = view(spark, ep, "deadLetters", consumerGroup=group).collect()
    assert [(r["body"], r["origin_topic"], r["reason"]) for r in dead] == [(m.body, topic, "broken row")]
    assert dead[0]["keys"] == list(m.keys) and len(m.keys) == 2  # an array, as the source's keys column
    # a system topic asked for by name is shown (as the queues view shows it)
    dlq = f"%DLQ%{group}"
    assert [r["topic"] for r in view(spark, ep, "topics", topic=dlq).collect()] == [dlq]
    # the lag of a topic over every group: only groups with progress on it, not every group at full lag
    idle = unique("idle")
    PullConsumer(ep, idle).commit(MessageQueue(f"%DLQ%{group}", "broker-a", 0), 0)  # progress elsewhere
    by_group = {r["group"] for r in view(spark, ep, "lag", topic=topic).collect()}
    assert group in by_group and idle not in by_group


def test_view_options_are_checked(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    with pytest.raises(Exception, match="view='nope' is not valid: use one of topics"):
        view(spark, ep, "nope")
    with pytest.raises(Exception, match="deadLetters needs consumerGroup"):
        view(spark, ep, "deadLetters")
    with pytest.raises(Exception, match="does not apply to a view read"):
        view(spark, ep, "topics", startingOffsets="earliest")
    reader = spark.read.format("pymq").option("endpoint", ep).option("view", "groups")
    with pytest.raises(Exception, match=r"pymq view 'groups' has the columns group string, retry_max_times "
                                        r"int.*\.schema\(\.\.\.\) gave group string: leave out"):
        reader.schema("group string").load().collect()
    # the view's own schema, given explicitly, is the view
    assert reader.schema(VIEWS["groups"]).load().columns[-1] == "consume_enable"
