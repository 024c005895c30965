"""Mixed: RocketMQ 5's official Python client and pymq's Spark source and sink on one embedded broker.

Messages sent with ``rocketmq-python-client`` are read by
``spark.readStream.format("pymq")`` with their tag, keys, properties and message id;
rows written by the pymq sink are received by the official SimpleConsumer.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from pyspark_pymq import Admin
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer


def _topic(endpoint: str) -> str:
    topic = f"v2S{uuid.uuid4().hex[:8]}"
    Admin(endpoint).create_topic(topic, 2)
    return topic


def test_official_client_messages_read_by_spark_stream(spark: Any, endpoint: str, tmp_path: Path) -> None:
    topic = _topic(endpoint)
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    try:
        ids = {}
        for i in range(3):
            m = Message()
            m.topic, m.body, m.tag, m.keys = topic, f"v2-{i}".encode(), "Spark", f"key{i}"
            m.add_property("n", str(i))
            ids[m.body] = producer.send(m).message_id
    finally:
        producer.shutdown()
    name = f"v2_stream_{uuid.uuid4().hex[:8]}"
    query = (spark.readStream.format("pymq").option("endpoint", endpoint).option("topic", topic)
             .option("startingOffsets", "earliest").option("consumerGroup", f"{name}_group").load()
             .select("topic", "msg_id", "tags", "keys", "body", "properties")
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    rows = spark.sql(f"SELECT * FROM {name}").collect()
    assert len(rows) == 3
    for row in rows:
        body = bytes(row.body)
        i = body.decode()[-1]
        assert (row.topic, row.msg_id, row.tags, list(row.keys)) == (topic, ids[body], "Spark", [f"key{i}"])
        assert row.properties["n"] == i


def test_spark_sink_rows_received_by_official_consumer(spark: Any, endpoint: str) -> None:
    topic = _topic(endpoint)
    df = spark.createDataFrame(
        [(f"row-{i}".encode(), "FromSpark", [f"k{i}"], {"origin": "spark"}) for i in range(4)],
        "body binary, tags string, keys array<string>, properties map<string,string>",
    )
    df.write.format("pymq").option("endpoint", endpoint).option("topic", topic).mode("append").save()
    stored = {bytes(r.body): r.msg_id for r in spark.read.format("pymq").option("endpoint", endpoint)
              .option("topic", topic).load().collect()}
    config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)  # longer than a 5 s poll
    consumer = SimpleConsumer(config, f"v2SG{uuid.uuid4().hex[:6]}", {topic: FilterExpression("FromSpark")},
                              await_duration=2)
    consumer.startup()
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < 4 and time.monotonic() < deadline:
            got.extend(consumer.receive(16, 30))
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    assert sorted(m.body for m in got) == [f"row-{i}".encode() for i in range(4)]
    for m in got:
        i = m.body.decode()[-1]
        assert (m.tag, m.keys, m.properties) == ("FromSpark", {f"k{i}"}, {"origin": "spark"})
        assert m.message_id == stored[m.body]
