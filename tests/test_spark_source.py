"""The Spark source against a real broker process, on the shared local[2] session.

Streams run with Trigger.AvailableNow into a parquet sink (so a restart from the
checkpoint is a real restart) and are checked message by message: every
message exactly once, none lost. Topics are unique per test on the shared
broker; tests that need broker settings of their own start their own broker.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.dataset as ds
import pytest
from broker_process import BrokerProcess
from pymq_proto.v1 import pymq_pb2
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.client.transport import BrokerClient
from pyspark_pymq.spark.data_source import PymqDataSource
from pyspark_pymq.spark.progress import commit_group_progress
from pyspark_pymq.spark.schema import source_schema
from pyspark_pymq.spark.source_offset import TOPIC_IDS_KEY, offsets_from_json

pytestmark = pytest.mark.spark


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create(endpoint: str, topic: str, queues: int = 4) -> str:
    Admin(endpoint).create_topic(topic, queues=queues)
    return topic


def produce(endpoint: str, topic: str, n: int, *, start: int = 0, tags: str | None = None,
            body_size: int = 0) -> list[str]:
    """Send n messages with bodies ``<topic>-<i>`` (padded); returns their msg ids."""
    producer = Producer(endpoint)
    msgs = [
        Message(topic, f"{topic}-{i}".encode().ljust(body_size, b"."),
                tags=tags if tags is not None else ("A" if i % 2 else "B"), keys=[f"k{i}"])
        for i in range(start, start + n)
    ]
    ids: list[str] = []
    for chunk in range(0, len(msgs), 64):
        for m in msgs[chunk:chunk + 64]:
            ids.append(producer.send(m).msg_id)
    return ids


def stream(spark: Any, endpoint: str, topic: str, **options: Any) -> Any:
    reader = spark.readStream.format("pymq").option("endpoint", endpoint).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def run_available_now(df: Any, out: Path, checkpoint: Path) -> Any:
    query = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination(180)
    assert not query.isActive, "AvailableNow query did not finish"
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return query


def run_expecting_failure(df: Any, out: Path, checkpoint: Path) -> str:
    query = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    with pytest.raises(Exception) as info:
        query.awaitTermination(180)
    return str(info.value)


def output(out: Path) -> list[dict[str, Any]]:
    """Rows of a parquet sink (files only; tests here never have failed tasks)."""
    files = [p for p in out.glob("*.parquet")] if out.exists() else []
    if not files:
        return []
    return ds.dataset([str(p) for p in files], format="parquet").to_table().to_pylist()


def progress_rows(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress]


def checkpoint_offsets(checkpoint: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for f in (checkpoint / "offsets").iterdir():
        if f.name.isdigit():
            out[int(f.name)] = json.loads(f.read_text().strip().splitlines()[-1])
    return out


def group_offsets(endpoint: str, group: str) -> dict[str, dict[str, int]]:
    frame = Admin(endpoint).group_progress(group)
    out: dict[str, dict[str, int]] = {}
    for row in frame.itertuples():
        if row.consumer_offset >= 0:
            out.setdefault(row.topic, {})[f"{row.broker_name}:{row.queue_id}"] = int(
                row.consumer_offset
            )
    return out


@pytest.fixture
def ep(shared_broker: BrokerProcess) -> str:
    return shared_broker.endpoint


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield tmp_path / "out", tmp_path / "checkpoint"


# -- exactly once, progress, limits --------------------------------------------------------


def test_available_now_exactly_once_across_restart_with_group_progress(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("eo"))
    group = unique("g")
    sent = produce(ep, topic, 200)
    df = stream(spark, ep, topic, consumerGroup=group, startingOffsets="earliest",
                maxMessagesPerTrigger=70)
    first = run_available_now(df, out, ckpt)
    rows = progress_rows(first)
    assert sum(rows) == 200
    assert max(rows) <= 70 and len([r for r in rows if r]) >= 3  # the limit split the work

    sent += produce(ep, topic, 100, start=200)
    run_available_now(df, out, ckpt)
    got = Counter(r["msg_id"] for r in output(out))
    assert set(got) == set(sent) and set(got.values()) == {1}, "lost or duplicated"
    bodies = {r["body"].decode() for r in output(out)}
    assert bodies == {f"{topic}-{i}" for i in range(300)}

    # The broker shows Spark's committed offsets: commit is one batch late, so the
    # group's progress equals the end of the batch before the last one.
    offsets = checkpoint_offsets(ckpt)
    last = max(offsets)
    assert group_offsets(ep, group) == {t: q for t, q in offsets[last - 1].items() if t != TOPIC_IDS_KEY}
    assert sum(offsets[last][topic].values()) == 300
    assert list(offsets[last][TOPIC_IDS_KEY]) == [topic]  # %RETRY% has none: the broker makes it


def test_batch_0_reads_data_and_a_replay_of_it_reads_the_same(spark: Any, ep: str, tmp_path: Path) -> None:
    """No empty first micro-batch; batch 0 replayed after a crash reads exactly what it read."""
    topic = create(ep, unique("b0"), queues=2)
    produce(ep, topic, 10)
    checkpoint = tmp_path / "checkpoint"
    df = stream(spark, ep, topic, startingOffsets="earliest", consumerGroup=unique("g"))

    def run() -> list[tuple[int, int]]:
        query = (df.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert not query.isActive and query.exception() is None
        return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]

    assert run() == [(0, 10)]
    # As if the driver died after writing batch 0's offsets but before its commit: the
    # restart replays batch 0 from the INITIAL marker to the logged end, then goes on.
    for name in ("0", ".0.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    produce(ep, topic, 5, start=10)
    assert run() == [(0, 10), (1, 5)]


def test_format_found_without_register_and_with_register(spark: Any, ep: str) -> None:
    topic = create(ep, unique("reg"), queues=2)
    produce(ep, topic, 10)
    spark.dataSource.register(PymqDataSource)
    df = spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()
    rows = df.collect()
    assert len(rows) == 10 and df.schema == source_schema()
    row = rows[0].asDict()
    assert row["topic"] == topic and row["broker_name"] and row["retry_topic"] is None
    assert row["keys"] and row["properties"]["UNIQ_KEY"] == row["msg_id"]
    assert len(row["offset_msg_id"]) == 32 and row["commit_log_offset"] >= 0


def test_tag_filter(spark: Any, ep: str, paths: tuple[Path, Path]) -> None:
    out, ckpt = paths
    topic = create(ep, unique("tags"))
    produce(ep, topic, 60)
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingOffsets="earliest",
                subscription="A")
    run_available_now(df, out, ckpt)
    rows = output(out)
    assert len(rows) == 30 and {r["tags"] for r in rows} == {"A"}
    batch = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
             .option("subscription", "A || B").load())
    assert batch.count() == 60


# -- starting offsets -------------------------------------------------------------------------


def test_starting_latest_reads_only_what_arrives_after_start(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("latest"))
    produce(ep, topic, 20)
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingOffsets="latest")
    run_available_now(df, out, ckpt)
    assert output(out) == []
    produce(ep, topic, 12, start=20)
    run_available_now(df, out, ckpt)
    assert sorted(r["body"].decode() for r in output(out)) == sorted(
        f"{topic}-{i}" for i in range(20, 32)
    )


def test_min_messages_per_trigger_waits_for_enough_messages_then_max_trigger_delay(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("least"), queues=2)
    produce(ep, topic, 3)
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingOffsets="earliest",
                minMessagesPerTrigger=10, maxTriggerDelay="8s")
    query = (df.writeStream.format("parquet").option("checkpointLocation", str(ckpt))
             .trigger(processingTime="200 milliseconds").start(str(out)))
    try:
        def data_batches() -> list[int]:
            return [n for n in progress_rows(query) if n]

        deadline = time.monotonic() + 60
        while data_batches() != [3] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert data_batches() == [3]  # the first batch reads what is there
        produce(ep, topic, 4, start=3)
        time.sleep(1.5)  # several triggers: 4 < 10 new messages, no batch
        assert data_batches() == [3]
        produce(ep, topic, 6, start=7)
        while len(data_batches()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert data_batches() == [3, 10]
        produce(ep, topic, 2, start=13)  # too few: maxTriggerDelay after the last batch lets them go
        while len(data_batches()) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert data_batches() == [3, 10, 2]
    finally:
        query.stop()
    assert len(output(out)) == 15


def test_starting_group_uses_progress_then_consume_from_where(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("grp"), queues=2)
    group = unique("g")
    produce(ep, topic, 20)
    consumer = PullConsumer(ep, group)
    q0, q1 = consumer.queues(topic)
    consumer.commit(q0, 4)  # the group has read 4 messages of queue 0, nothing of queue 1
    df = stream(spark, ep, topic, consumerGroup=group,
                consumeFromWhere="CONSUME_FROM_FIRST_OFFSET")
    run_available_now(df, out, ckpt)
    got = Counter((r["queue_id"], r["queue_offset"]) for r in output(out))
    expected = {(q0.queue_id, o) for o in range(4, 10)} | {(q1.queue_id, o) for o in range(10)}
    assert set(got) == expected and set(got.values()) == {1}


def test_starting_group_default_is_last_offset(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("grplast"), queues=2)
    produce(ep, topic, 10)
    run_available_now(stream(spark, ep, topic, consumerGroup=unique("g")), out, ckpt)
    assert output(out) == []


def test_starting_json_and_timestamp(spark: Any, ep: str, tmp_path: Path) -> None:
    topic = create(ep, unique("json"), queues=2)
    produce(ep, topic, 20)
    queues = PullConsumer(ep, "x").queues(topic)
    key0 = f"{queues[0].broker_name}:{queues[0].queue_id}"
    key1 = f"{queues[1].broker_name}:{queues[1].queue_id}"
    starting = json.dumps({topic: {key0: 7, key1: -1}})
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingOffsets=starting)
    run_available_now(df, tmp_path / "o1", tmp_path / "c1")
    got = sorted((r["queue_id"], r["queue_offset"]) for r in output(tmp_path / "o1"))
    assert got == [(queues[0].queue_id, o) for o in range(7, 10)]

    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(ep, topic, 6, start=20)
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingTimestamp=cut)
    run_available_now(df, tmp_path / "o2", tmp_path / "c2")
    assert sorted(r["body"].decode() for r in output(tmp_path / "o2")) == sorted(
        f"{topic}-{i}" for i in range(20, 26)
    )


def test_starting_json_past_a_queues_end_goes_through_fail_on_data_loss(spark: Any, ep: str) -> None:
    topic = create(ep, unique("past"), queues=1)
    produce(ep, topic, 5)
    mq = PullConsumer(ep, "x").queues(topic)[0]
    starting = json.dumps({topic: {f"{mq.broker_name}:{mq.queue_id}": 50}})

    def read(**extra: str) -> Any:
        reader = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
                  .option("startingOffsets", starting))
        for key, value in extra.items():
            reader = reader.option(key, value)
        return reader.load().collect()

    with pytest.raises(Exception, match=r"startingOffsets gives offset 50, past the queue's end \(max "
                                        r"offset 5\)"):
        read()
    assert read(failOnDataLoss="false") == []


def test_queue_added_mid_stream_is_read_from_its_start(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("grow"), queues=2)
    sent = produce(ep, topic, 10)
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingOffsets="earliest")
    run_available_now(df, out, ckpt)
    Admin(ep).create_topic(topic, queues=4)
    sent += produce(ep, topic, 20, start=10)
    run_available_now(df, out, ckpt)
    rows = output(out)
    assert Counter(r["msg_id"] for r in rows) == Counter(sent)
    assert {r["queue_id"] for r in rows} == {0, 1, 2, 3}
    assert min(r["queue_offset"] for r in rows if r["queue_id"] >= 2) == 0


def test_assign_splits_a_topics_queues_between_two_streams_of_one_group(
    spark: Any, ep: str, tmp_path: Path
) -> None:
    """Spark's Kafka ``assign``: each stream reads its own queues and commits their progress to the
    group it shares with the other, reads no retries, and a queue added later joins neither."""
    topic, group = create(ep, unique("assign"), queues=4), unique("g")
    sent = produce(ep, topic, 40)
    consumer = PullConsumer(ep, group)
    consumer.send_back(consumer.pull(MessageQueue(topic, "broker-a", 0), 0, 1).messages[0], delay_level=1)
    wait_for_messages(ep, f"%RETRY%{group}", 1)
    halves = [f'{{"{topic}": [0, 1]}}', f'{{"{topic}": ["broker-a:2", "broker-a:3"]}}']

    def run(half: int) -> list[dict[str, Any]]:
        df = (spark.readStream.format("pymq").option("endpoint", ep).option("assign", halves[half])
              .option("consumerGroup", group).option("startingOffsets", "earliest").load())
        run_available_now(df, tmp_path / f"out{half}", tmp_path / f"ckpt{half}")
        return output(tmp_path / f"out{half}")

    first, second = run(0), run(1)
    assert {r["queue_id"] for r in first} == {0, 1} and {r["queue_id"] for r in second} == {2, 3}
    assert Counter(r["msg_id"] for r in first + second) == Counter(sent)  # the retry was read by neither
    # the group's %RETRY% queues named in assign are read along: from their first message (the
    # group has no progress there), as the retried message of its original topic
    retries = (spark.readStream.format("pymq").option("endpoint", ep).option("consumerGroup", group)
               .option("assign", f'{{"%RETRY%{group}": [0]}}').load())
    run_available_now(retries, tmp_path / "out-retry", tmp_path / "ckpt-retry")
    got = output(tmp_path / "out-retry")
    assert [(r["topic"], r["retry_topic"], r["queue_id"]) for r in got] == [(topic, f"%RETRY%{group}", 0)]
    Admin(ep).create_topic(topic, queues=6)  # scaled out: queues 4 and 5 are nobody's
    produce(ep, topic, 60, start=40)
    first, second = run(0), run(1)
    stats = Admin(ep).topic_stats(topic).set_index("queue_id")["max_offset"]
    assert len(first) == stats[0] + stats[1] and len(second) == stats[2] + stats[3]
    assert {r["queue_id"] for r in first + second} == {0, 1, 2, 3}
    assert len({r["msg_id"] for r in first + second}) == len(first) + len(second)  # none twice
    # both streams' commits are the group's progress, each of its own queues (one batch late)
    ends = [checkpoint_offsets(tmp_path / f"ckpt{half}")[0][topic] for half in (0, 1)]
    committed = {q: consumer.committed(MessageQueue(topic, "broker-a", q)) for q in range(6)}
    assert committed == {**{int(k.split(":")[1]): v for end in ends for k, v in end.items()}, 4: -1, 5: -1}

    batch = (spark.read.format("pymq").option("endpoint", ep).option("assign", f'{{"{topic}": [5]}}')
             .load().select("queue_id").collect())
    assert len(batch) == stats[5] > 0 and {r["queue_id"] for r in batch} == {5}


def test_group_progress_goes_on_after_a_scale_in_of_read_queues(ep: str) -> None:
    """A queue cut by a scale-in of read queues waits in the checkpoint; the commits leave it out
    (the stream's as Spark calls them, and commit_group_progress's), or the broker refuses the
    whole update and the group's lag grows for good. The source's driver side, called as Spark
    does: Spark itself adds nothing here."""
    topic = create(ep, unique("scalein"), queues=2)
    group = unique("g")
    produce(ep, topic, 10)
    source = PymqDataSource({"endpoint": ep, "topic": topic, "consumerGroup": group,
                             "startingOffsets": "earliest"}).streamReader(None)  # type: ignore[arg-type]
    end0 = json.loads(json.dumps(source.latestOffset(source.initialOffset(), ReadAllAvailable())))
    Admin(ep).create_topic(topic, queues=1, allow_shrink=True)  # queue 1, read to its end, is cut for good
    produce(ep, topic, 5, start=10)
    end1 = json.loads(json.dumps(source.latestOffset(end0, ReadAllAvailable())))
    q0, q1 = MessageQueue(topic, "broker-a", 0), MessageQueue(topic, "broker-a", 1)
    assert offsets_from_json(end1)[q1] == offsets_from_json(end0)[q1] == 5  # it waits
    source.commit(end0)  # batch 0's, once batch 1 is planned
    consumer = PullConsumer(ep, group)
    assert consumer.committed(q0) == offsets_from_json(end0)[q0] == 5
    query = SimpleNamespace(lastProgress={"sources": [{"endOffset": json.dumps(end1)}]})
    written = commit_group_progress(query, ep, group)
    assert consumer.committed(q0) == offsets_from_json(end1)[q0] == 10
    assert written == 2  # queue 0 and %RETRY%<group>'s queue, not queue 1
    assert group_offsets(ep, group)[topic] == {"broker-a:0": 10}


def test_broadcasting_writes_no_progress(spark: Any, ep: str, paths: tuple[Path, Path]) -> None:
    out, ckpt = paths
    topic = create(ep, unique("bc"), queues=2)
    group = unique("g")
    produce(ep, topic, 10)
    df = stream(spark, ep, topic, consumerGroup=group, messageModel="BROADCASTING",
                startingOffsets="earliest", maxMessagesPerTrigger=4)
    query = run_available_now(df, out, ckpt)
    assert len(output(out)) == 10 and len([r for r in progress_rows(query) if r]) >= 3
    assert group_offsets(ep, group) == {}


# -- retries and dead letters ---------------------------------------------------------------


def send_back(endpoint: str, group: str, row: dict[str, Any], delay_level: int) -> None:
    BrokerClient(endpoint).consumer_send_msg_back(
        pymq_pb2.ConsumerSendMsgBackRequest(
            group=group, commit_log_offset=row["commit_log_offset"], delay_level=delay_level,
            origin_msg_id=row["msg_id"], origin_topic=row["topic"], max_reconsume_times=16,
        ),
    )


def wait_for_messages(endpoint: str, topic: str, n: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if int(Admin(endpoint).topic_stats(topic)["messages"].sum()) >= n:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{topic} did not get {n} messages")


def test_retries_are_read_with_their_original_topic_and_dlq_by_batch(
    spark: Any, ep: str, paths: tuple[Path, Path]
) -> None:
    out, ckpt = paths
    topic = create(ep, unique("retry"), queues=2)
    group = unique("g")
    produce(ep, topic, 6)
    df = stream(spark, ep, topic, consumerGroup=group, startingOffsets="earliest")
    run_available_now(df, out, ckpt)
    first = sorted(output(out), key=lambda r: r["body"])
    send_back(ep, group, first[0], delay_level=1)  # 100 ms on the shared broker
    send_back(ep, group, first[1], delay_level=-1)  # straight to the DLQ
    wait_for_messages(ep, f"%RETRY%{group}", 1)
    run_available_now(df, out, ckpt)
    retried = [r for r in output(out) if r["retry_topic"] is not None]
    assert len(retried) == 1 and len(output(out)) == 7
    r = retried[0]
    assert r["topic"] == topic and r["retry_topic"] == f"%RETRY%{group}"
    assert r["body"] == first[0]["body"] and r["reconsume_times"] == 1
    # RocketMQ's ORIGIN_MESSAGE_ID: the original's offsetMsgId; the msgId is kept as it was
    assert dict(r["properties"])["ORIGIN_MESSAGE_ID"] == first[0]["offset_msg_id"]
    assert r["msg_id"] == first[0]["msg_id"] and dict(r["properties"])["DELAY"] == "1"

    for name in (f"%RETRY%{group}", f"%DLQ%{group}"):
        rows = (spark.read.format("pymq").option("endpoint", ep).option("topic", name)
                .load().collect())
        assert len(rows) == 1
    dead = rows[0].asDict()
    assert dead["body"] == first[1]["body"] and dead["topic"] == f"%DLQ%{group}"
    assert dead["properties"]["DLQ_ORIGIN_TOPIC"] == topic


def test_retry_queues_read_along_start_as_the_topics_do(spark: Any, ep: str) -> None:
    """includeRetry: startingOffsets, startingTimestamp and lastMessagesPerQueue position
    %RETRY%<group>'s queue too (it started at the group's progress whatever they said); only
    startingOffsets=group starts it at the group's progress, else at its first message. An
    offsets JSON can name it."""
    topic = create(ep, unique("rstart"), queues=1)
    group = unique("g")
    produce(ep, topic, 5)
    consumer = PullConsumer(ep, group)
    for message in consumer.pull(consumer.queues(topic)[0], 0, 32).messages:
        consumer.send_back(message, delay_level=1)  # 100 ms on the shared broker
    retry = f"%RETRY%{group}"
    wait_for_messages(ep, retry, 5)
    rq = consumer.retry_queues()[0]
    consumer.commit(rq, 3)  # the group has read 3 of its 5 retries

    def read(**options: Any) -> list[tuple[str | None, int]]:
        reader = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
                  .option("consumerGroup", group).option("includeRetry", "true"))
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return sorted(((r.retry_topic, r.queue_offset) for r in reader.load().collect()),
                      key=lambda row: (row[0] or "", row[1]))

    originals = [(None, o) for o in range(5)]
    assert read(startingOffsets="earliest") == originals + [(retry, o) for o in range(5)]
    assert read(lastMessagesPerQueue=1) == [(None, 4), (retry, 4)]
    assert read(startingTimestamp=int(time.time() * 1000) + 3_600_000) == []
    # the group's progress on the retry queue (and consumeFromWhere's end on the topic's)
    assert read(startingOffsets="group") == [(retry, 3), (retry, 4)]
    key = f"{rq.broker_name}:{rq.queue_id}"
    assert read(startingOffsets=json.dumps({retry: {key: 1}}),
                endingOffsets=json.dumps({retry: {key: 2}})) == [*originals, (retry, 1)]


# -- batch reads -----------------------------------------------------------------------------


def test_batch_windows(spark: Any, ep: str) -> None:
    topic = create(ep, unique("win"), queues=2)
    produce(ep, topic, 10)
    time.sleep(0.05)
    t1 = int(time.time() * 1000)
    time.sleep(0.05)
    produce(ep, topic, 10, start=10)
    time.sleep(0.05)
    t2 = int(time.time() * 1000)
    time.sleep(0.05)
    produce(ep, topic, 10, start=20)

    def read(**options: Any) -> list[str]:
        reader = spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return sorted(int(r.body.decode().rsplit("-", 1)[1]) for r in reader.load().collect())

    assert read() == list(range(30))
    assert read(startingTimestamp=t1, endingTimestamp=t2) == list(range(10, 20))
    assert read(lastMessagesPerQueue=2) == [26, 27, 28, 29]
    assert read(endingTimestamp=t1, minPartitions=5) == list(range(10))
    queues = PullConsumer(ep, "x").queues(topic)
    ending = json.dumps({topic: {f"{queues[0].broker_name}:{queues[0].queue_id}": 3}})
    rows = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
            .option("endingOffsets", ending).load().collect())
    by_queue = Counter(r.queue_id for r in rows)
    assert by_queue == {queues[0].queue_id: 3, queues[1].queue_id: 15}
    assert sorted(r.queue_offset for r in rows if r.queue_id == queues[0].queue_id) == [0, 1, 2]


def test_offsets_by_timestamp_per_queue_in_batch_and_stream(spark: Any, ep: str, tmp_path: Path) -> None:
    """startingOffsetsByTimestamp / endingOffsetsByTimestamp (Spark's Kafka options): a time per
    queue, keyed as startingOffsets JSON; queues left out start at earliest and end at latest.
    startingOffsetsByTimestampStrategy: error (the default) names a queue without a message at
    or after its time, latest starts it at its end."""
    topic = create(ep, unique("bytime"), queues=2)
    cuts = []
    for phase in range(3):  # 3 phases of 6 messages, spread over both queues
        if phase:
            time.sleep(0.05)
            cuts.append(int(time.time() * 1000))
            time.sleep(0.05)
        produce(ep, topic, 6, start=6 * phase)
    q0, q1 = PullConsumer(ep, "x").queues(topic)
    k0, k1 = f"{q0.broker_name}:{q0.queue_id}", f"{q1.broker_name}:{q1.queue_id}"

    def reader(**options: Any) -> Any:
        r = spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
        for key, value in options.items():
            r = r.option(key, str(value))
        return r

    def numbers(rows: Any, queue: int) -> list[int]:
        return sorted(int(r["body"].decode().rsplit("-", 1)[1]) for r in rows if r["queue_id"] == queue)

    everything = [r.asDict() for r in reader().load().collect()]
    in_q0, in_q1 = numbers(everything, q0.queue_id), numbers(everything, q1.queue_id)
    assert all(any(6 * p <= i < 6 * p + 6 for i in in_q0) for p in range(3)), in_q0  # every phase
    rows = [r.asDict() for r in reader(
        startingOffsetsByTimestamp=json.dumps({topic: {k0: cuts[0]}}),
        endingOffsetsByTimestamp=json.dumps({topic: {k0: cuts[1]}}),
    ).load().collect()]
    assert numbers(rows, q0.queue_id) == [i for i in in_q0 if 6 <= i < 12]  # phase 2 only
    assert numbers(rows, q1.queue_id) == in_q1  # unlisted: from earliest to latest

    future = int(time.time() * 1000) + 3_600_000
    later = json.dumps({topic: {k0: future, k1: cuts[1]}})
    with pytest.raises(Exception) as info:
        reader(startingOffsetsByTimestamp=later).load().collect()
    assert (f"startingOffsetsByTimestamp: queue {k0} of topic {topic!r} has no message stored at or "
            f"after {future}") in str(info.value)
    assert "startingOffsetsByTimestampStrategy=latest" in str(info.value)
    # startingTimestamp starts such a queue at its end, unless told to fail
    assert reader(startingTimestamp=future).load().collect() == []
    with pytest.raises(Exception, match=f"startingTimestamp: queue {k0} of topic {topic!r} has no message"):
        reader(startingTimestamp=future, startingOffsetsByTimestampStrategy="error").load().collect()
    rows = [r.asDict() for r in reader(startingOffsetsByTimestamp=later,
                                       startingOffsetsByTimestampStrategy="latest").load().collect()]
    assert numbers(rows, q0.queue_id) == [] and numbers(rows, q1.queue_id) == [i for i in in_q1 if i >= 12]

    # a stream: resolved once, at its start, from the same JSON
    df = stream(spark, ep, topic, consumerGroup=unique("g"),
                startingOffsetsByTimestamp=json.dumps({topic: {k0: cuts[1], k1: cuts[0]}}))
    run_available_now(df, tmp_path / "o1", tmp_path / "c1")
    got = output(tmp_path / "o1")
    assert numbers(got, q0.queue_id) == [i for i in in_q0 if i >= 12]
    assert numbers(got, q1.queue_id) == [i for i in in_q1 if i >= 6]
    df = stream(spark, ep, topic, consumerGroup=unique("g"), startingOffsetsByTimestamp=later)
    message = run_expecting_failure(df, tmp_path / "o2", tmp_path / "c2")
    assert f"queue {k0} of topic {topic!r} has no message stored at or after {future}" in message


def test_subscribe_pattern_batch_and_stream_with_a_new_topic_read_from_earliest(
    spark: Any, ep: str, tmp_path: Path
) -> None:
    """subscribePattern (Spark's Kafka option): topics whose whole name matches; a batch read
    takes those there are; a stream finds new ones at its triggers and reads them from their
    first message. System topics (here a group's %RETRY% topic) never match."""
    prefix = unique("pat")
    a = create(ep, f"{prefix}-a", queues=2)
    produce(ep, a, 5)
    create(ep, f"x{prefix}-a", queues=1)  # matches only in part: not read
    produce(ep, f"x{prefix}-a", 3)
    group = f"{prefix}-g"
    consumer = PullConsumer(ep, group)
    mq = consumer.queues(a)[0]
    consumer.send_back(consumer.pull(mq, 0, 1).messages[0], delay_level=1)
    wait_for_messages(ep, f"%RETRY%{group}", 1)
    pattern = f"(%RETRY%)?{prefix}-.*"

    def bodies(rows: Any) -> list[str]:
        return sorted(r["body"].decode() for r in rows)

    rows = (spark.read.format("pymq").option("endpoint", ep).option("subscribePattern", pattern)
            .load().collect())
    assert bodies(rows) == [f"{a}-{i}" for i in range(5)]
    nothing = spark.read.format("pymq").option("endpoint", ep).option("subscribePattern", f"{prefix}-z.*")
    assert nothing.load().collect() == []

    df = (spark.readStream.format("pymq").option("endpoint", ep).option("subscribePattern", pattern)
          .option("consumerGroup", unique("g")).option("startingOffsets", "earliest").load())
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = (df.writeStream.format("parquet").option("checkpointLocation", str(ckpt))
             .trigger(processingTime="200 milliseconds").start(str(out)))
    try:
        query.processAllAvailable()
        assert bodies(output(out)) == [f"{a}-{i}" for i in range(5)]
        b = create(ep, f"{prefix}-b", queues=2)
        produce(ep, b, 4)  # before the stream sees the topic: read all the same
        produce(ep, a, 2, start=5)
        deadline = time.monotonic() + 60
        while len(output(out)) < 11 and time.monotonic() < deadline:
            query.processAllAvailable()
            time.sleep(0.2)
        assert query.exception() is None
        assert bodies(output(out)) == sorted([f"{a}-{i}" for i in range(7)] + [f"{b}-{i}" for i in range(4)])
    finally:
        query.stop()
    offsets = checkpoint_offsets(ckpt)  # and the stream's group's %RETRY% topic, read along
    assert {t for t in offsets[max(offsets)] if not t.startswith(("$", "%RETRY%"))} == {a, b}


# -- data loss ---------------------------------------------------------------------------------


def test_deleted_topic_goes_through_fail_on_data_loss(
    spark: Any, ep: str, tmp_path: Path
) -> None:
    topic = create(ep, unique("del"), queues=2)
    other = create(ep, unique("keep"), queues=1)
    produce(ep, topic, 4)
    produce(ep, other, 3)
    both = f"{topic},{other}"
    group = unique("g")
    for fail in ("true", "false"):
        df = stream(spark, ep, both, consumerGroup=f"{group}-{fail}",
                    startingOffsets="earliest", failOnDataLoss=fail)
        run_available_now(df, tmp_path / f"o-{fail}", tmp_path / f"c-{fail}")
    Admin(ep).delete_topic(topic)
    produce(ep, other, 2, start=3)

    df = stream(spark, ep, both, consumerGroup=f"{group}-true", failOnDataLoss="true")
    message = run_expecting_failure(df, tmp_path / "o-true", tmp_path / "c-true")
    assert f"topic {topic!r} was deleted" in message and "failOnDataLoss=false" in message

    df = stream(spark, ep, both, consumerGroup=f"{group}-false", failOnDataLoss="false")
    run_available_now(df, tmp_path / "o-false", tmp_path / "c-false")
    rows = output(tmp_path / "o-false")
    assert len(rows) == 4 + 3 + 2


def test_a_topic_created_again_with_more_messages_goes_through_fail_on_data_loss(
    spark: Any, ep: str, tmp_path: Path
) -> None:
    """Offsets alone cannot tell: the new topic has passed the old offsets. Its id can."""
    topic, group = create(ep, unique("again"), queues=2), unique("g")
    produce(ep, topic, 4)
    for fail in ("true", "false"):
        df = stream(spark, ep, topic, consumerGroup=f"{group}-{fail}", startingOffsets="earliest",
                    failOnDataLoss=fail)
        run_available_now(df, tmp_path / f"o-{fail}", tmp_path / f"c-{fail}")
    Admin(ep).delete_topic(topic)
    create(ep, topic, queues=2)
    produce(ep, topic, 10, start=100)

    df = stream(spark, ep, topic, consumerGroup=f"{group}-true", failOnDataLoss="true")
    message = run_expecting_failure(df, tmp_path / "o-true", tmp_path / "c-true")
    assert f"topic {topic!r} on broker" in message and "was deleted and created again" in message
    assert "failOnDataLoss=false" in message

    df = stream(spark, ep, topic, consumerGroup=f"{group}-false", failOnDataLoss="false")
    run_available_now(df, tmp_path / "o-false", tmp_path / "c-false")
    bodies = sorted(r["body"].decode() for r in output(tmp_path / "o-false"))
    assert bodies == sorted([f"{topic}-{i}" for i in range(4)] + [f"{topic}-{i}" for i in range(100, 110)])
    # The restart committed the last batch of the old topic (Spark commits a batch once the
    # next is planned): its offsets are not the new topic's progress.
    consumer = PullConsumer(ep, f"{group}-false")
    assert {consumer.committed(mq) for mq in consumer.queues(topic)} == {-1}


def test_commit_group_progress_writes_no_offsets_of_a_topic_created_again(ep: str) -> None:
    """A stopped query's last offsets are of the old topic: written onto the new one they would
    make a group start skip its first messages."""
    topic, group = create(ep, unique("again-prog"), queues=1), unique("g")
    produce(ep, topic, 7)
    consumer = PullConsumer(ep, group)
    mq = consumer.queues(topic)[0]
    topic_id = Admin(ep).topic_config(topic).topic_id
    end = {TOPIC_IDS_KEY: {topic: {mq.broker_name: topic_id}}, topic: {f"{mq.broker_name}:0": 7}}
    query = type("StoppedQuery", (), {"lastProgress": {"sources": [{"endOffset": json.dumps(end)}]}})()
    assert commit_group_progress(query, ep, group) == 1 and consumer.committed(mq) == 7
    Admin(ep).delete_topic(topic)
    create(ep, topic, queues=1)
    produce(ep, topic, 10)
    assert commit_group_progress(query, ep, group) == 0
    assert consumer.committed(mq) == -1


def test_commit_group_progress_refuses_a_group_whose_retries_the_query_did_not_read(ep: str) -> None:
    """The query read %RETRY%<its group>: another group name (a typo) would be made holding the
    query's offsets, and the real group would keep showing its lag."""
    topic, group = create(ep, unique("whose-prog"), queues=1), unique("g")
    produce(ep, topic, 3)
    end = {topic: {"broker-a:0": 3}, f"%RETRY%{group}": {"broker-a:0": 0}}
    query = type("StoppedQuery", (), {"lastProgress": {"sources": [{"endOffset": json.dumps(end)}]}})()
    typo = "typo-" + group
    with pytest.raises(ValueError, match=rf"read %RETRY%{group}, so its consumer group is '{group}', "
                                         rf"not '{typo}'"):
        commit_group_progress(query, ep, typo)
    assert typo not in set(Admin(ep).groups(include_internal=True)["group"])
    # two sources, the second the other group's: the first one's offsets were committed before
    plain = {topic: {"broker-a:0": 2}}
    two = type("StoppedQuery", (), {"lastProgress": {"sources": [{"endOffset": json.dumps(plain)},
                                                                  {"endOffset": json.dumps(end)}]}})()
    with pytest.raises(ValueError, match="so its consumer group is"):
        commit_group_progress(two, ep, typo)
    assert PullConsumer(ep, typo).committed(MessageQueue(topic, "broker-a", 0)) == -1
    assert commit_group_progress(query, ep, group) >= 1
    assert PullConsumer(ep, group).committed(MessageQueue(topic, "broker-a", 0)) == 3


@pytest.fixture
def retention_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose 8 MiB commit-log segments expire after ~0.4 s."""
    args = ["--file-reserved-time", "0.0001", "--mapped-file-size-commit-log", str(8 << 20),
            "--clean-resource-interval", "100"]
    with BrokerProcess(tmp_path / "retention-broker", extra_args=args) as proc:
        yield proc


def test_expired_messages_go_through_fail_on_data_loss(
    spark: Any, retention_broker: BrokerProcess, tmp_path: Path
) -> None:
    ep = retention_broker.endpoint
    topic = create(ep, "expire", queues=1)
    produce(ep, topic, 5)
    mq = MessageQueue(topic, PullConsumer(ep, "x").queues(topic)[0].broker_name, 0)
    for fail in ("true", "false"):
        df = stream(spark, ep, topic, consumerGroup=f"g-{fail}", startingOffsets="earliest",
                    failOnDataLoss=fail)
        run_available_now(df, tmp_path / f"o-{fail}", tmp_path / f"c-{fail}")
    # ~24 MiB: the first segments roll over and expire, taking offsets 0.. with them
    produce(ep, topic, 24, start=5, body_size=1 << 20)
    consumer = PullConsumer(ep, "x")
    deadline = time.monotonic() + 60
    lost_until, stable_since = consumer.min_offset(mq), time.monotonic()
    while time.monotonic() < deadline:  # until every segment but the last has expired
        time.sleep(0.1)
        now = consumer.min_offset(mq)
        if now != lost_until:
            lost_until, stable_since = now, time.monotonic()
        elif lost_until > 5 and time.monotonic() - stable_since > 1.5:
            break
    assert lost_until > 5

    df = stream(spark, ep, topic, consumerGroup="g-true", failOnDataLoss="true")
    message = run_expecting_failure(df, tmp_path / "o-true", tmp_path / "c-true")
    assert f"offsets [5, {lost_until}) are no longer on the broker" in message
    assert "failOnDataLoss=false" in message

    df = stream(spark, ep, topic, consumerGroup="g-false", failOnDataLoss="false")
    run_available_now(df, tmp_path / "o-false", tmp_path / "c-false")
    offsets = sorted(r["queue_offset"] for r in output(tmp_path / "o-false"))
    assert offsets == list(range(5)) + list(range(lost_until, 29))

    def batch_read(fail: str) -> Any:
        return (spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
                .option("startingOffsets", json.dumps({topic: {f"{mq.broker_name}:0": 0}}))
                .option("failOnDataLoss", fail).load())

    with pytest.raises(Exception, match="failOnDataLoss=false"):
        batch_read("true").collect()
    assert batch_read("false").count() == 29 - lost_until


# -- errors at start ---------------------------------------------------------------------------


def test_unknown_topic_and_unreachable_broker_fail_at_start(
    spark: Any, ep: str, tmp_path: Path
) -> None:
    missing = unique("missing")
    with pytest.raises(Exception) as info:
        spark.read.format("pymq").option("endpoint", ep).option("topic", missing).load().collect()
    assert f"topic {missing!r} does not exist" in str(info.value)
    assert "create_topic" in str(info.value)

    df = stream(spark, ep, missing, consumerGroup="g")
    message = run_expecting_failure(df, tmp_path / "o", tmp_path / "c")
    assert f"topic {missing!r} does not exist" in message

    with pytest.raises(Exception) as info:  # a group without dead letters: nothing to create
        spark.read.format("pymq").option("endpoint", ep).option("topic", f"%DLQ%{missing}").load().collect()
    assert f"group {missing!r} has no dead letters yet" in str(info.value)
    assert "create_topic" not in str(info.value)

    dead = "127.0.0.1:1"
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        (spark.read.format("pymq").option("endpoint", dead).option("topic", "t")
         .option("connectTimeoutMs", 3000).load().collect())
    assert f"cannot reach the broker at {dead}" in str(info.value)
    assert str(info.value).count("Check that pymq-broker runs there") == 1
    assert time.monotonic() - started < 60


def test_bad_options_fail_with_their_message(spark: Any, ep: str, tmp_path: Path) -> None:
    # caught at load(), before Spark knows stream or batch
    with pytest.raises(Exception, match="pymq option endpoint is required"):
        spark.readStream.format("pymq").option("topic", "t").load()
    with pytest.raises(Exception, match="Did you mean 'startingOffsets'"):
        spark.read.format("pymq").option("endpoint", ep).option("topic", "t") \
            .option("startingOffset", "earliest").load()
    df = stream(spark, ep, "t")  # no consumerGroup
    message = run_expecting_failure(df, tmp_path / "o", tmp_path / "c")
    assert "consumerGroup is required" in message
    assert "UnboundLocalError" not in message  # pyspark's, when streamReader() raised
    with pytest.raises(Exception, match="maxMessagesPerTrigger"):
        (spark.read.format("pymq").option("endpoint", ep).option("topic", "t")
         .option("maxMessagesPerTrigger", 5).load().collect())
    with pytest.raises(Exception, match="names column 'a', which the source does not have"):
        (spark.read.format("pymq").schema("a int").option("endpoint", ep).option("topic", "t")
         .load().collect())
    with pytest.raises(Exception, match="declare 'queue_offset bigint'"):
        (spark.readStream.format("pymq").schema("body binary, queue_offset int").option("endpoint", ep)
         .option("topic", "t").option("consumerGroup", "g").load().writeStream.format("noop").start()
         .awaitTermination(60))


def test_a_schema_of_some_columns_reads_only_those(spark: Any, ep: str, tmp_path: Path) -> None:
    topic = create(ep, unique("cols"))
    ids = produce(ep, topic, 40)
    whole = spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()
    expected = sorted(tuple(r) for r in whole.select("queue_offset", "tags", "body", "msg_id").collect())
    some = (spark.read.format("pymq").schema("queue_offset bigint, tags string, body binary, msg_id string")
            .option("endpoint", ep).option("topic", topic).load())
    assert some.columns == ["queue_offset", "tags", "body", "msg_id"]
    assert sorted(tuple(r) for r in some.collect()) == expected
    assert len(expected) == 40 and {r[3] for r in expected} == set(ids)
    # a stream of the body alone, into files: every message once, and nothing else in them
    df = (spark.readStream.format("pymq").schema("body binary").option("endpoint", ep).option("topic", topic)
          .option("consumerGroup", unique("g")).option("startingOffsets", "earliest").load())
    run_available_now(df, tmp_path / "out", tmp_path / "chk")
    table = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    assert table.column_names == ["body"]
    assert Counter(table.column("body").to_pylist()) == Counter(r[2] for r in expected)
