"""The sink's conversions of Arrow columns to Python values, and its send loop (no Spark, no broker)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import datetime, timezone
from typing import Any, cast

import pyarrow as pa
import pytest
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructField, StructType
from pyspark_pymq.backend import BackendConfig
from pyspark_pymq.backend.pymq import PymqBackend
from pyspark_pymq.client.consumer import PullConsumer
from pyspark_pymq.client.message import Message, MessageQueue
from pyspark_pymq.client.producer import Producer
from pyspark_pymq.errors import BrokerUnavailableError, PymqError
from pyspark_pymq.spark.rows import column, epoch_ms
from pyspark_pymq.spark.sink_options import SinkOptions, parse_sink_options
from pyspark_pymq.spark.writer import SinkCommitMessage, _send_rows, _TaskIds


def test_column_gives_the_values_of_to_pylist_for_every_type() -> None:
    batch = pa.RecordBatch.from_pydict({
        "s": pa.array(["a", None, "é"]),
        "ls": pa.array(["a", None, "b"], pa.large_string()),
        "i": pa.array([1, 2, 3], pa.int32()),
        "in": pa.array([1, None, 3], pa.int64()),
        "b": pa.array([b"x", None, b""]),
        "m": pa.array([[("k", "v")], None, [("a", None)]], pa.map_(pa.string(), pa.string())),
        "l": pa.array([["a"], None, []], pa.list_(pa.string())),
    })
    for name in batch.schema.names:
        expected = batch.column(batch.schema.get_field_index(name)).to_pylist()
        got = column(batch, name)
        assert got == expected and [type(v) for v in got] == [type(v) for v in expected], name
    assert column(batch, "absent", "d") == ["d", "d", "d"]


def test_timestamps_become_epoch_milliseconds() -> None:
    when = datetime(2026, 11, 22, 3, 4, 5, 678_901, tzinfo=timezone.utc)
    batch = pa.RecordBatch.from_pydict({
        "t": pa.array([when, None], pa.timestamp("us", tz="UTC")),
        "n": pa.array([when.replace(tzinfo=None), None], pa.timestamp("ns")),
        "ms": pa.array([1234, None], pa.int64()),
    })
    expected = int(when.timestamp() * 1000)
    assert epoch_ms(batch, "t", 0) == [expected, 0]
    assert epoch_ms(batch, "n", 0) == [expected, 0]
    assert epoch_ms(batch, "ms", 0) == [1234, 0]
    assert epoch_ms(batch, "absent", 0) == [0, 0]
    # the sink's deliver_time_ms: a null is no delivery time
    assert epoch_ms(batch, "t") == [expected, None]
    assert epoch_ms(batch, "ms") == [1234, None]
    assert epoch_ms(batch, "absent") == [None, None]
    # floored, as Spark's unix_millis: half a millisecond before 1970 is -1 (a cast made it 0,
    # which passed the sink's check for times before 1970)
    early = pa.RecordBatch.from_pydict({
        "us": pa.array([-500, -1500, 1500], pa.timestamp("us", tz="UTC")),
        "ns": pa.array([-1, 999_999, -1_000_000], pa.timestamp("ns")),
        "s": pa.array([-2, 0, 3], pa.timestamp("s")),
    })
    assert epoch_ms(early, "us") == [-1, -2, 1]
    assert epoch_ms(early, "ns") == [-1, 0, -1]
    assert epoch_ms(early, "s") == [-2000, 0, 3000]
    # in Spark's session time zone, an instant of a DST fall-back hour (01:30 in New York on
    # 2026-11-01 came twice): flooring it in local time raised "Local time is ambiguous"
    fall_back = datetime(2026, 11, 1, 5, 30, 0, 123_456, tzinfo=timezone.utc)
    zoned = pa.RecordBatch.from_pydict({"t": pa.array([fall_back, None], pa.timestamp("us", "UTC")).cast(
        pa.timestamp("us", "America/New_York"))})
    assert epoch_ms(zoned, "t", 0) == [int(fall_back.timestamp() * 1000), 0]


def test_send_back_columns_come_straight_from_the_arrow_columns() -> None:
    from pyspark_pymq.spark.rows import rows_as_messages, send_back_columns

    batch = pa.RecordBatch.from_pydict({
        "topic": pa.array(["t", "t", "u"]),
        "broker_name": pa.array(["a", "b", "a"]),
        "commit_log_offset": pa.array([10, 20, 30], pa.int64()),
        "msg_id": pa.array(["M0", None, "M2"]),
        "body": pa.array([b"0", b"1", b"2"]),
        "delay_level": pa.array([None, 5, None], pa.int32()),
        "error": pa.array(["bad\x02news", None, "x"]),
        "error_class": pa.array(["ValueError", "KeyError", None]),
    })
    parts = send_back_columns(batch, 2, {"CONSUME_FAILURE_STAGE": "s"})
    assert [(c.broker_name, where) for c, _, where in parts] == [("a", [0, 2]), ("b", [1])]  # per broker
    a, rows_a, _ = parts[0]
    assert list(a.commit_log_offsets) == [10, 30] and list(a.delay_levels) == [2, 2]
    assert list(a.origin_msg_ids) == ["M0", "M2"] and list(a.origin_topics) == ["t", "u"]
    assert a.property_columns == {"CONSUME_FAILURE_REASON": ["bad\ufffdnews", "x"],
                                  "CONSUME_FAILURE_EXCEPTION": ["ValueError", ""]}
    assert a.properties == {"CONSUME_FAILURE_STAGE": "s"}
    b, _, _ = parts[1]
    assert list(b.delay_levels) == [5] and list(b.origin_msg_ids) == [""]
    assert [m.body for m in rows_as_messages(rows_a)([1])] == [b"2"]  # the fallback's rows
    without = batch.drop_columns(["delay_level", "error", "error_class"])
    without = without.filter(pa.array([True, False, True]))
    (plain, _, _), = send_back_columns(without, -1, {})
    assert list(plain.delay_levels) == [-1, -1] and plain.property_columns == {}
    no_offset = batch.set_column(2, "commit_log_offset", pa.array([1, None, 3], pa.int64()))
    with pytest.raises(ValueError, match="row 1 has no commit_log_offset or topic"):
        send_back_columns(no_offset, 0, {})
    with pytest.raises(ValueError, match="row 0 has no commit_log_offset or topic"):
        send_back_columns(batch.drop_columns(["topic"]), 0, {})


# -- the send loop (_send_rows) with a producer that records its calls -------------------------

_PREFIX = "0123456789ABCDEF"
_WHERE = "partition 0 of batch 0"


class _RecordingProducer:
    """Producer's send side as the sink uses it, recording (topic, queue id, rows) of each send."""

    def __init__(self, *_: object, send_mode: str = "sync", fail: Exception | None = None,
                 answer: object = None, **__: object) -> None:
        self.send_mode, self.fail, self.answer = send_mode, fail, answer
        self.backend = PymqBackend(BackendConfig("127.0.0.1:1"))  # frames records; never connects
        self.sends: list[tuple[str, int | None, list[int]]] = []
        self.props: dict[int, bytes] = {}
        self.bodies: dict[int, bytes] = {}
        self.queue_look_ups: list[tuple[str, str]] = []
        self.flushed = False
        self.oneway_unacknowledged = 0
        self.oneway_undelivered: Exception | None = None
        self.max_message_size = 4 * 1024 * 1024

    def _sent(self, topic: str, queue_id: int | None, keys: Sequence[str]) -> list[object]:
        if self.fail is not None:
            raise self.fail
        rows = [int(k[len(_PREFIX):], 16) for k in keys]
        assert all(k.startswith(_PREFIX) for k in keys)
        self.sends.append((topic, queue_id, rows))
        return [self.answer]

    def send_encoded(self, topic: str, bodies: list[bytes], props: list[bytes], keys: list[str], *,
                     queue_id: int | None = None, broker_name: str | None = None) -> list[object]:
        rows = [int(k[len(_PREFIX):], 16) for k in keys]
        self.props.update(zip(rows, props, strict=True))
        self.bodies.update(zip(rows, bodies, strict=True))
        return self._sent(topic, queue_id, keys)

    def send_records(self, topic: str, records: bytes, sizes: object, keys: Sequence[str]) -> list[object]:
        return self._sent(topic, None, keys)

    def message_queue_for_key(self, topic: str, sharding_key: str) -> MessageQueue:
        self.queue_look_ups.append((topic, sharding_key))
        if self.fail is not None:
            raise self.fail
        return MessageQueue(topic, "broker-a", {"a": 1, "b": 2}[sharding_key])

    def flush(self) -> None:
        self.flushed = True


def _making(producer: _RecordingProducer) -> Callable[..., Producer]:
    return lambda *_, **__: cast(Producer, producer)


def _sink_options(**options: str) -> SinkOptions:
    schema = StructType([StructField("body", BinaryType()), StructField("topic", StringType()),
                         StructField("sharding_key", StringType()), StructField("queue_id", IntegerType()),
                         StructField("delay_level", IntegerType())])
    return parse_sink_options({"endpoint": "127.0.0.1:1", **options}, schema, stream=False)


def _send(batches: list[pa.RecordBatch], producer: _RecordingProducer, extra: bytes = b"",
          **options: str) -> SinkCommitMessage:
    opts = _sink_options(**{"topic": "t", **options})
    return _send_rows(opts, iter(batches), _TaskIds("q", "0", 0, 0),
                      new_producer=_making(producer), prefix=_PREFIX, extra_properties=extra)


def test_rows_go_per_destination_in_batches_of_max_batch_bytes_and_a_delayed_row_alone() -> None:
    plain = pa.RecordBatch.from_pydict({"body": pa.array([b"p0", b"p1"])})
    rows = pa.RecordBatch.from_pydict({
        "body": pa.array(["x" * 299 + "é"] * 7),  # a string column: sent as UTF-8
        "topic": pa.array([None, None, None, None, "u", None, None]),  # the topic option wins
        "sharding_key": pa.array(["a", None, "a", "a", None, "a", "b"]),
        "queue_id": pa.array([None, 3, None, None, None, None, 0], pa.int32()),
        "delay_level": pa.array([None, None, 2, None, None, 0, None], pa.int32()),
    })
    producer = _RecordingProducer()
    extra = b"PYMQ_SINK_TXN\x01x\x02"
    done = _send([plain, rows.slice(0, 0), rows], producer, extra, maxBatchBytes="1024")
    assert done.rows == 9
    # the plain batch whole; rows 2.. (row index i of `rows` is row i + 2): row 4 is delayed,
    # so it goes at once and alone; three rows of ~460 bytes fill (t, queue 1) at row 7
    assert producer.sends == [("t", None, [0, 1]), ("t", 1, [4]), ("t", 1, [2, 5, 7]),
                              ("t", 3, [3]), ("t", None, [6]), ("t", 0, [8])]
    assert producer.queue_look_ups == [("t", "a")] * 4  # a queue_id column wins over the key
    assert producer.props[4] == (b"UNIQ_KEY\x01" + f"{_PREFIX}{4:016X}".encode()
                                 + b"\x02DELAY\x012\x02__SHARDINGKEY\x01a\x02" + extra)
    assert producer.props[6] == b"UNIQ_KEY\x01" + f"{_PREFIX}{6:016X}".encode() + b"\x02" + extra
    assert producer.bodies[8] == ("x" * 299 + "é").encode()
    assert not producer.flushed  # sync: the answers are in hand


def test_the_topic_option_wins_over_a_topic_column_and_without_it_each_row_names_its_own() -> None:
    """As Spark's Kafka sink: rows read from pymq and written on with a topic option must not go back
    into the topics their `topic` column names (a stream would read its own output again)."""
    fields = [StructField("body", BinaryType()), StructField("topic", StringType())]
    plain = pa.RecordBatch.from_pydict({"body": pa.array([b"0", b"1", b"2"]),
                                        "topic": pa.array(["src", "src", "other"])})
    sharded = plain.append_column("sharding_key", pa.array(["a", "b", "a"]))
    for batch in (plain, sharded):  # the columnar path and the per-row path
        schema = StructType(fields + [StructField("sharding_key", StringType())] * (batch is sharded))
        with_option, without = _RecordingProducer(), _RecordingProducer()
        for options, producer in (({"topic": "dst"}, with_option), ({}, without)):
            opts = parse_sink_options({"endpoint": "127.0.0.1:1", **options}, schema, stream=False)
            _send_rows(opts, iter([batch]), _TaskIds("q", "0", 0, 0), new_producer=_making(producer),
                       prefix=_PREFIX)
        assert {t for t, _, _ in with_option.sends} == {"dst"}
        assert sorted(r for _, _, rows in with_option.sends for r in rows) == [0, 1, 2]
        sent = {(t, r) for t, _, rows in without.sends for r in rows}
        assert sent == {("src", 0), ("src", 1), ("other", 2)}


@pytest.mark.parametrize(("name", "meant"), [
    ("Tags", "tags"), ("KEYS", "keys"), ("tag", "tags"), ("shardingKey", "sharding_key"),
    ("delayLevel", "delay_level"), ("QueueId", "queue_id"), ("BODY", "body"),
])
def test_a_misspelt_send_column_is_refused_naming_the_column_meant(name: str, meant: str) -> None:
    """Other columns are ignored: a misspelt one quietly lost the rows' tags, keys, order or delay."""
    body = [] if name == "BODY" else [StructField("body", BinaryType())]
    schema = StructType([*body, StructField(name, IntegerType() if "Id" in name or "Level" in name
                                            else StringType())])
    with pytest.raises(ValueError, match=rf"column '{name}' is not one it sends \(action=send\): did you "
                                         rf"mean '{meant}'\?"):
        parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t"}, schema, stream=False)
    # the rows the source reads, written on as they are, have no such near miss
    from pyspark_pymq.spark.schema import source_schema

    parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t"}, source_schema(), stream=False)


@pytest.mark.parametrize(("column", "named"), [
    (StructField("key", StringType()), "'sharding_key'"),
    (StructField("partition", IntegerType()), "'queue_id'"),
    (StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                  StructField("value", BinaryType())]))), "'properties'"),
    (StructField("Value", BinaryType()), "drop one of them"),
])
def test_kafka_sink_columns_are_refused_naming_the_pymq_column(column: StructField, named: str) -> None:
    """Spark's Kafka sink sends key, partition and headers: dropped in silence they would lose a
    Kafka user's per-key order, chosen partition or headers."""
    schema = StructType([StructField("body", BinaryType()), column])
    with pytest.raises(ValueError, match="is a column of Spark's Kafka sink") as info:
        parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t"}, schema, stream=False)
    assert named in str(info.value) and repr(column.name) in str(info.value)
    # a Kafka frame with value and no body: the message that says to cast value to body
    with pytest.raises(ValueError, match="needs a 'body' column"):
        parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t"},
                           StructType([StructField("value", BinaryType())]), stream=False)


def test_bad_rows_fail_the_task_naming_the_first_one() -> None:
    def rows(**columns: pa.Array) -> pa.RecordBatch:
        base = {"body": pa.array([b"0", b"1", b"2"]), "sharding_key": pa.array(["a", "a", "a"])}
        return pa.RecordBatch.from_pydict({**base, **columns})

    cases = [  # each batch has two faults: the first row's is named
        (rows(body=pa.array([b"0", None, b"2"]), delay_level=pa.array([None, None, -1], pa.int32())),
         "row 1 of partition 0 of batch 0 has a null body"),
        (rows(delay_level=pa.array([None, -1, None], pa.int32()), sharding_key=pa.array(["a", "a", "\x02"])),
         "row 1 of partition 0 of batch 0 has delay_level -1; use 0 or more"),
        (rows(sharding_key=pa.array(["a", "b\x01", None]), body=pa.array([b"0", b"1", None])),
         r"row 1 of partition 0 of batch 0: a property name or value contains the reserved"),
        (rows(keys=pa.array([["k0"], ["order 7"], ["x y"]])),  # would be stored as keys order, 7
         r"row 1 of partition 0 of batch 0: key 'order 7' of the keys array contains a space"),
        # sent as is, a negative time was delivered at once (the client's Message refuses it)
        (rows(deliver_time_ms=pa.array([None, -5, -1], pa.int64())),
         r"row 1 of partition 0 of batch 0 has deliver_time_ms -5, before 1970"),
        (rows(deliver_time_ms=pa.array([0, datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc), None],
                                       pa.timestamp("us", tz="UTC"))),
         r"row 1 of partition 0 of batch 0 has deliver_time_ms -1000, before 1970"),
    ]
    for batch, match in cases:
        with pytest.raises(ValueError, match=match):
            _send([batch], _RecordingProducer())
    opts = _sink_options()  # no topic option: a null topic is refused
    with pytest.raises(ValueError, match=f"row 0 of {_WHERE} has a null topic and no topic option is set"):
        _send_rows(opts, iter([rows(topic=pa.array([None, "t", "t"]))]),
                   _TaskIds("q", "0", 0, 0), new_producer=_making(_RecordingProducer()))


def test_the_tasks_of_a_python_worker_send_through_its_backend() -> None:
    """Spark reuses a Python worker for later tasks: their producers share its backend, whose
    routes are known, so a task that starts while a RocketMQ name server restarts still sends
    (each task's own backend asked the name servers first, and failed, probe helper-93)."""
    from pyspark_pymq.backend import cached_backend

    opts = _sink_options(topic="t", sendMsgTimeoutMs="2500")
    given: list[object] = []

    def new_producer(*args: object, **kwargs: object) -> Producer:
        given.append(kwargs.get("backend"))
        return cast(Producer, _RecordingProducer())

    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"0"])})
    for task in range(2):
        _send_rows(opts, iter([batch]), _TaskIds("q", str(task), task, 0), new_producer=new_producer,
                   prefix=_PREFIX)
    shared = cached_backend(opts.backend, 2.5)
    assert given == [shared, shared]
    assert Producer(backend=shared).backend is shared
    # a backend and connection keywords: which would it be? refused, naming them
    with pytest.raises(ValueError, match="not both: got backend= and endpoint, secret_key"):
        Producer("127.0.0.1:2", secret_key="s", backend=shared)
    with pytest.raises(ValueError, match="not both: got backend= and namesrv_addr"):
        PullConsumer(group="g", namesrv_addr="127.0.0.1:9876", backend=shared)


def test_failed_sends_keep_their_code_and_name_their_rows() -> None:
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"0", b"1"])})
    keyed = pa.RecordBatch.from_pydict({"body": pa.array([b"0", b"1"]), "sharding_key": pa.array(["a", "b"])})
    refused = BrokerUnavailableError("down", code="X")
    for rows, match in ((batch, "sending rows 0..1 of "), (keyed, "choosing the queue of row 0 of ")):
        with pytest.raises(BrokerUnavailableError, match=match) as info:
            _send([rows], _RecordingProducer(fail=refused))
        assert info.value.code == "X" and _WHERE in str(info.value) and "failed: down" in str(info.value)
    late: Future[object] = Future()
    late.set_exception(PymqError("no", code="Y"))
    with pytest.raises(PymqError, match=f"async send of rows 0..1 of {_WHERE} failed: no") as failed:
        _send([batch], _RecordingProducer(send_mode="async", answer=late), sendMode="async")
    assert failed.value.code == "Y"
    # rows of one destination between other destinations' rows: the error names those it carried
    mixed = pa.RecordBatch.from_pydict({"body": pa.array([b"r"] * 6),
                                        "sharding_key": pa.array(["a", "b", "b", "a", "b", "a"])})
    answers: Future[object] = Future()
    answers.set_exception(PymqError("no", code="Y"))
    with pytest.raises(PymqError, match=r"async send of rows 0, 3, 5 \(3 rows from 0 to 5\) of ") as failed:
        _send([mixed], _RecordingProducer(send_mode="async", answer=answers), sendMode="async")


def test_oneway_counts_the_rows_not_acknowledged_without_failing() -> None:
    producer = _RecordingProducer(send_mode="oneway")
    producer.oneway_unacknowledged = 2
    done = _send([pa.RecordBatch.from_pydict({"body": pa.array([b"0", b"1", b"2"])})], producer,
                 sendMode="oneway")
    assert producer.flushed and done.unacknowledged == 2 and done.rows == 3


def test_listener_settings_are_checked_when_it_is_made() -> None:
    # not at the first failed message, inside a Spark task that has already run the listener
    from pyspark_pymq.spark.listener import MessageListener

    for bad in (0, -1, "3"):
        with pytest.raises(ValueError, match=r"max_reconsume_times must be an int >= 1 .* got"):
            MessageListener("127.0.0.1:1", "g", lambda m: None, max_reconsume_times=bad)  # type: ignore[arg-type]
    MessageListener("127.0.0.1:1", "g", lambda m: None, max_reconsume_times=1)
    for level in ("3", 2**31, -2, True, 1.0):
        with pytest.raises(ValueError, match=rf"delay_level must be an int in -1\.\.2147483647 .* {level!r}"):
            MessageListener("127.0.0.1:1", "g", lambda m: None, delay_level=level)  # type: ignore[arg-type]
    for level in (-1, 0, 18, 2**31 - 1):
        MessageListener("127.0.0.1:1", "g", lambda m: None, delay_level=level)


def test_sharded_rows_go_where_producer_send_puts_their_key_on_a_topic_of_two_brokers() -> None:
    # a RocketMQ cluster's topic: queue ids 0..3 on broker-a and on broker-b; each key's rows
    # must go to the one queue Producer.send chooses for it (MessageQueueSelector by hash)
    from pyspark_pymq.client.message import SendResult, SendStatus
    from pyspark_pymq.client.route import TopicRoute

    queues = tuple(MessageQueue("t", b, q) for b in ("broker-a", "broker-b") for q in range(4))
    route = TopicRoute("t", queues, (), {"broker-a": "a:1", "broker-b": "b:1"})
    producer = Producer("127.0.0.1:1")  # never connects: route and send are stubbed
    producer._backend.route = lambda topic, refresh=False: route  # type: ignore[method-assign]
    sent: list[tuple[MessageQueue, str]] = []

    def send(group: str, req: Any, mq: MessageQueue, timeout: float, half: bool = False) -> SendResult:
        sent.extend((mq, k) for k in req.uniq_keys)
        return SendResult(SendStatus.SEND_OK, mq, 0, tuple(req.uniq_keys), (), bytes(8))

    producer._backend.send = send  # type: ignore[method-assign]
    keys = [f"order-{i}" for i in range(40)]
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"x"] * 40), "sharding_key": pa.array(keys)})
    opts = parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t"},
                              StructType([StructField("body", BinaryType()),
                                          StructField("sharding_key", StringType())]), stream=False)
    _send_rows(opts, iter([batch]), _TaskIds("q", "0", 0, 0), new_producer=lambda *_, **__: producer,
               prefix=_PREFIX)
    by_key = {keys[int(k[len(_PREFIX):], 16)]: mq for mq, k in sent}
    assert {mq.broker_name for mq in by_key.values()} == {"broker-a", "broker-b"}
    for key in keys:
        assert by_key[key] == producer.message_queue_for_key("t", key)
        sent.clear()
        producer.send(Message("t", b"x", sharding_key=key))
        assert sent[0][0] == by_key[key]


def test_a_write_inside_foreach_batch_keys_its_rows_by_its_write_and_names_the_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyspark
    from pyspark_pymq.spark.writer import _task_ids

    class Ctx:
        props = {"sql.streaming.queryId": "Q", "streaming.sql.batchId": "7"}

        def getLocalProperty(self, key: str) -> str | None:
            return self.props.get(key)

        def partitionId(self) -> int:
            return 3

        def attemptNumber(self) -> int:
            return 0

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: Ctx()))
    schema = StructType([StructField("body", BinaryType())])

    def ids(stream: bool, **options: str) -> _TaskIds:
        return _task_ids(parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t", **options}, schema,
                                            stream=stream))

    orders, refunds = ids(False, writeId="orders"), ids(False, writeId="refunds")
    assert orders.key_prefix() != refunds.key_prefix()  # two writes of one micro-batch
    assert orders.key_prefix() == ids(False, writeId="orders").key_prefix()  # the same write again
    assert ids(False).key_prefix() != ids(False).key_prefix()  # no writeId: new keys each run
    # the stream's query id, as failed rows sent back name it (CONSUME_FAILURE_QUERY_ID)
    assert orders.query_id == "Q" and (orders.batch_id, orders.partition_id) == ("7", 3)
    # a writeStream's keys stay what they were: its query, batch and partition
    assert ids(True).key_prefix() == _TaskIds("Q", "7", 3, 0).key_prefix()


def test_a_row_stored_but_not_durable_is_sent_again_to_another_broker() -> None:
    # broker-a is a SYNC_MASTER whose slave is down: it stores every message and answers
    # SLAVE_NOT_AVAILABLE. The sink sends those rows again to broker-b (RocketMQ's
    # retryAnotherBrokerWhenNotStoreOK) rather than fail the task, and fails it only when
    # no broker stores them as it should.
    from pyspark_pymq.client.message import SendResult, SendStatus
    from pyspark_pymq.client.route import TopicRoute

    queues = tuple(MessageQueue("t", b, q) for b in ("broker-a", "broker-b") for q in range(2))
    schema = StructType([StructField("body", BinaryType())])
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"x" * 500] * 20)})
    both = ("broker-a", "broker-b")
    for brokers, down in ((both, {"broker-a"}), (both, set(both)), (("broker-a",), {"broker-a"})):
        route = TopicRoute("t", tuple(q for q in queues if q.broker_name in brokers), (),
                           {"broker-a": "a:1", "broker-b": "b:1"})
        stored: list[str] = []
        keys: list[str] = []

        def send(group: str, req: Any, mq: MessageQueue, timeout: float, half: bool = False,
                 down: set[str] = down, stored: list[str] = stored,
                 keys: list[str] = keys) -> SendResult:
            stored.append(mq.broker_name)
            keys.extend(req.uniq_keys)
            status = SendStatus.SLAVE_NOT_AVAILABLE if mq.broker_name in down else SendStatus.SEND_OK
            return SendResult(status, mq, 0, tuple(req.uniq_keys), (), bytes(8))

        def stubbed(*args: Any, route: TopicRoute = route, **kwargs: Any) -> Producer:  # no network
            producer = Producer(*args, **kwargs)  # the sink's own settings
            producer._backend.route = lambda topic, refresh=False: route  # type: ignore[method-assign]
            producer._backend.send = send  # type: ignore[method-assign]
            return producer

        opts = parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t", "maxBatchBytes": "1024"},
                                  schema, stream=False)

        def send_rows(opts: SinkOptions = opts, new_producer: Any = stubbed) -> SinkCommitMessage:
            return _send_rows(opts, iter([batch]), _TaskIds("q", "0", 0, 0), new_producer=new_producer,
                              prefix=_PREFIX)

        if len(brokers) == 2 and down == {"broker-a"}:
            assert send_rows().rows == 20 and "broker-a" in stored and "broker-b" in stored
            continue
        with pytest.raises(PymqError, match="answered SLAVE_NOT_AVAILABLE"):
            send_rows()
        if len(brokers) == 2:  # each request tried three times (retryTimesWhenSendFailed 2), on both
            assert len(stored) % 3 == 0 and set(stored) == {"broker-a", "broker-b"}
        else:  # no other broker: no row stored again on the same one
            assert set(stored) == {"broker-a"} and len(keys) == len(set(keys)) == 20


def test_a_producer_refuses_batches_larger_than_its_messages() -> None:
    with pytest.raises(ValueError, match="max_batch_bytes"):
        Producer("127.0.0.1:1", max_message_size=1024, max_batch_bytes=4096)


def test_send_back_rows_without_a_topic_are_refused_by_name() -> None:
    from pyspark_pymq.spark.rows import send_back_columns

    for topics in ([None, "orders"], ["", "orders"]):
        batch = pa.RecordBatch.from_pydict({"topic": pa.array(topics, pa.string()),
                                            "commit_log_offset": pa.array([1, 2], pa.int64())})
        with pytest.raises(ValueError, match="row 0 has no commit_log_offset or topic"):
            send_back_columns(batch, 0, {})



@pytest.mark.parametrize(("option", "value"), [
    ("consumerGroup", "g"), ("maxReconsumeTimes", "3"), ("delayLevel", "18"), ("stage", "x"),
])
def test_send_back_options_are_refused_with_action_send(option: str, value: str) -> None:
    """They would be ignored: rows 'sent with delayLevel 18' would arrive at once."""
    schema = StructType([StructField("body", StringType())])
    with pytest.raises(ValueError, match=rf"sink option {option} applies to action=reconsumeLater") as err:
        parse_sink_options({"endpoint": "127.0.0.1:1", "topic": "t", option: value}, schema, stream=False)
    assert ("delay_level column" in str(err.value)) == (option == "delayLevel")


def test_send_back_levels_and_times_are_java_ints() -> None:
    """RocketMQ carries them as Java ints: past 2**31-1 the option is refused by name, and so is a
    row's delay_level, before anything is sent (protobuf's bare 'Value out of range' failed every task)."""
    from pyspark.sql.types import LongType, MapType
    from pyspark_pymq.spark.writer import write_partition

    schema = StructType([
        StructField("commit_log_offset", LongType()), StructField("msg_id", StringType()),
        StructField("topic", StringType()), StructField("broker_name", StringType()),
        StructField("reconsume_times", IntegerType()), StructField("body", BinaryType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("delay_level", LongType()),
    ])
    base = {"endpoint": "127.0.0.1:1", "action": "reconsumeLater", "consumerGroup": "g"}
    for option in ("maxReconsumeTimes", "delayLevel"):
        with pytest.raises(ValueError, match=rf"{option}='2147483648'.*2147483647"):
            parse_sink_options({**base, option: "2147483648"}, schema, stream=False)
        parse_sink_options({**base, option: "2147483647"}, schema, stream=False)
    opts = parse_sink_options(base, schema, stream=False)
    big = pa.RecordBatch.from_pydict({"delay_level": pa.array([None, 2, 3_000_000_000], pa.int64())})
    with pytest.raises(ValueError, match=r"row 2 of partition 0 of batch 0 has delay_level 3000000000; "
                                         r"action=reconsumeLater takes -1\.\.2147483647"):
        write_partition(opts, iter([big]))
