"""What each send mode promises when the broker misbehaves, and how send backs hold a task.

The broker is a real process: SIGSTOP pauses it (requests time out, then are
answered once it resumes), SIGKILL takes it away. The sink's executor loop
(``write_partition``) is called directly, as a Spark task would.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from broker_process import BrokerProcess
from helpers import read_all, unique
from pymq_proto.record import MAX_REASON_CHARS
from pyspark_pymq import Admin, Message, Producer, PullConsumer
from pyspark_pymq.client import route as route_module
from pyspark_pymq.client.message import MessageQueue
from pyspark_pymq.client.route import TopicRoute
from pyspark_pymq.errors import BrokerUnavailableError, PymqError, RequestTimeoutError
from pyspark_pymq.spark import rows as rows_module
from pyspark_pymq.spark.rows import SEND_BACK_ATTEMPTS, send_back_acknowledged
from pyspark_pymq.spark.sink_options import SinkOptions, parse_sink_options
from pyspark_pymq.spark.writer import PymqSinkWriter, write_partition


def _options(endpoint: str, topic: str, **options: str) -> SinkOptions:
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("body", StringType())])
    return parse_sink_options({"endpoint": endpoint, "topic": topic, **options}, schema, stream=False)


def _rows(n: int) -> Iterator[pa.RecordBatch]:
    return iter([pa.record_batch([pa.array([f"r{i}" for i in range(n)])], names=["body"])])


@contextmanager
def paused(broker: BrokerProcess, seconds: float) -> Iterator[None]:
    """The broker stops answering (SIGSTOP) for ``seconds``, then answers what it was sent."""
    os.kill(broker.pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (broker.pid, signal.SIGCONT))
    timer.start()
    try:
        yield
    finally:
        timer.join()


def test_sync_retries_a_send_the_paused_broker_did_not_answer(broker: BrokerProcess) -> None:
    """Every try times out after 1 s; the broker is back after 1.5 s: a later try is acknowledged."""
    topic = unique("sync-pause")
    Admin(broker.endpoint).create_topic(topic, queues=2, dedup_window_ms=60_000)
    opts = _options(broker.endpoint, topic, sendMsgTimeoutMs="1000")
    with paused(broker, 1.5):
        started = time.monotonic()
        done = write_partition(opts, _rows(200))
    assert time.monotonic() - started > 1.0  # the first try really timed out
    assert done.rows == 200
    got = read_all(broker.endpoint, topic)  # the timed-out try may have been stored too: dropped
    assert sorted(m.body.decode() for m in got) == sorted(f"r{i}" for i in range(200))


def test_sync_without_retries_and_async_by_default_fail_the_task_naming_the_rows(
    broker: BrokerProcess,
) -> None:
    """RocketMQ does not retry async sends (retryTimesWhenSendAsyncFailed 0): the task fails."""
    topic = unique("no-retry")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    for options, what in (
        ({"sendMode": "sync", "retryTimesWhenSendFailed": "0"}, "sending rows 0..49 of partition 0"),
        ({"sendMode": "async"}, "async send of rows 0..49 of partition 0"),
    ):
        opts = _options(broker.endpoint, topic, sendMsgTimeoutMs="500", **options)
        with paused(broker, 1.0), pytest.raises(RequestTimeoutError) as info:
            write_partition(opts, _rows(50))
        assert info.value.code == "REQUEST_TIMEOUT" and what in str(info.value), options


def test_async_with_retries_delivers_through_a_paused_broker(broker: BrokerProcess) -> None:
    topic = unique("async-pause")
    Admin(broker.endpoint).create_topic(topic, queues=2, dedup_window_ms=60_000)
    opts = _options(broker.endpoint, topic, sendMode="async", retryTimesWhenSendAsyncFailed="2",
                    sendMsgTimeoutMs="1000", maxBatchBytes="4096")
    with paused(broker, 1.5):
        done = write_partition(opts, _rows(300))
    assert done.rows == 300
    assert sorted(m.body.decode() for m in read_all(broker.endpoint, topic)) == sorted(
        f"r{i}" for i in range(300))


def test_oneway_to_a_broker_that_does_not_answer_fails_the_task(broker: BrokerProcess) -> None:
    """oneway is lossy in its answers, not in reaching the broker: as RocketMQ's sendOneway throws
    when it finds no route or cannot connect, a dead broker fails the task, naming the rows (it
    reported success with every row lost, the loss only in the executor's log)."""
    topic = unique("oneway-dead")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    opts = _options(broker.endpoint, topic, sendMode="oneway", maxBatchBytes="4096",
                    sendMsgTimeoutMs="500")
    broker.kill()
    with pytest.raises(BrokerUnavailableError) as info:
        write_partition(opts, _rows(100))
    assert "partition 0" in str(info.value), str(info.value)
    broker.start()


def test_oneway_sends_that_reached_no_broker_fail_the_task_at_its_end(broker: BrokerProcess) -> None:
    """The route known (the broker answered it), the broker gone before the sends: each send's
    answer says it never reached the broker, and the task fails once all are answered."""
    from pyspark_pymq.backend.base import cached_backend

    topic = unique("oneway-gone")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    opts = _options(broker.endpoint, topic, sendMode="oneway", maxBatchBytes="4096",
                    sendMsgTimeoutMs="500")
    cached_backend(opts.backend, 0.5).route(topic, refresh=True)  # the task's producer finds it cached
    broker.kill()
    with pytest.raises(BrokerUnavailableError, match=r"sendMode=oneway: \d+ of 100 row\(s\) of partition 0 "
                                                    r"of batch \d+ not sent: a broker could not be reached"):
        write_partition(opts, _rows(100))
    broker.start()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_keyed_rows_a_dead_broker_refused_fail_naming_their_queue_and_why_not_sent_elsewhere(
    broker: BrokerProcess, mode: str
) -> None:
    """A sharding_key pins its rows to one queue: when its broker is gone they are not sent to another
    one, and the task failed saying only "cannot connect to <address>" (after 3 attempts), where a
    plain row goes to another broker: which broker, which queue and why stayed unsaid."""
    from pyspark.sql.types import StringType, StructField, StructType
    from pyspark_pymq.backend.base import cached_backend

    topic = unique("keyed-dead")
    Admin(broker.endpoint).create_topic(topic, queues=2)
    schema = StructType([StructField("body", StringType()), StructField("sharding_key", StringType())])
    opts = parse_sink_options({"endpoint": broker.endpoint, "topic": topic, "sendMode": mode,
                               "sendMsgTimeoutMs": "500", "retryTimesWhenSendFailed": "0"},
                              schema, stream=False)
    route = cached_backend(opts.backend, 0.5).route(topic, refresh=True)  # the task finds it cached
    queue = Producer(backend=cached_backend(opts.backend, 0.5)).message_queue_for_key(topic, "k")
    broker.kill()
    rows = pa.record_batch([pa.array(["a", "b"]), pa.array(["k", "k"])], names=["body", "sharding_key"])
    with pytest.raises(BrokerUnavailableError) as info:
        write_partition(opts, iter([rows]))
    broker.start()
    assert route.publish_queues and "rows 0..1 of partition 0" in str(info.value)
    assert (f"Their sharding_key maps these rows to queue {queue.queue_id} of broker {queue.broker_name!r}, "
            "and a keyed row is not sent to another broker") in str(info.value), str(info.value)


def test_a_oneway_task_failing_on_a_broker_gone_mid_write_says_the_rows_it_had_stored(
    broker: BrokerProcess,
) -> None:
    """sendMode=oneway, the broker gone after a first batch was acknowledged: the task failed saying
    the second batch's rows were not sent, and nothing of the first one's, which are stored (and
    stored twice when Spark runs the task again): the note of the rows sent was left out whenever a
    oneway send had reached no broker."""
    topic = unique("oneway-mid")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    opts = _options(broker.endpoint, topic, sendMode="oneway", sendMsgTimeoutMs="500")

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([pa.array([f"r{i}" for i in range(50)])], names=["body"])
        time.sleep(0.5)  # the first batch's answers are in
        broker.kill()
        yield pa.record_batch([pa.array([f"r{i}" for i in range(50, 80)])], names=["body"])

    with pytest.raises(BrokerUnavailableError, match=r"sendMode=oneway: 30 of 80 row\(s\)") as info:
        write_partition(opts, batches())
    broker.start()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "50 row(s) of partition 0 of batch" in notes, notes
    assert "had been sent before this failure" in notes, notes
    assert len(read_all(broker.endpoint, topic)) == 50


def test_a_failed_task_says_how_many_of_its_rows_it_had_sent(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A write failing at its 41st row had stored 40 and the driver logged "aborted after 0
    row(s)": a user re-running it wrote the 40 twice. The task's error says it had sent them, and
    the abort names the failed tasks."""
    from pyspark_pymq.spark.writer import SinkCommitMessage

    topic = unique("partial")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    good = pa.record_batch([pa.array([f"r{i}" for i in range(40)])], names=["body"])
    bad = pa.record_batch([pa.array(["r40", None])], names=["body"])
    with pytest.raises(ValueError, match=r"row 41 of partition 0 .* null body") as info:
        write_partition(_options(broker.endpoint, topic), iter([good, bad]))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "40 row(s) of partition 0 of batch" in notes and "had been sent before this failure" in notes
    assert len(read_all(broker.endpoint, topic)) == 40
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark.writer"):
        PymqSinkWriter(_options(broker.endpoint, topic)).abort([SinkCommitMessage(0, 7), None])
    assert "the 1 task(s) that finished stored 7 row(s)" in caplog.text
    assert "1 task(s) failed or did not run, and a failed one may have stored rows" in caplog.text


def test_a_failed_route_refresh_keeps_the_route_and_asks_again_only_after_a_pause(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused broker costs one route time-out per ROUTE_RETRY_AFTER_S, not one per send."""
    topic = unique("route-pause")
    Admin(broker.endpoint).create_topic(topic, queues=2)
    producer = Producer(broker.endpoint, send_msg_timeout_ms=300)
    routes = producer.backend._routes  # type: ignore[attr-defined]
    route = routes.get(topic)
    asked: list[str] = []
    query_route = routes.bootstrap.query_route

    def counting_query_route(request: Any, timeout: float | None = None) -> Any:
        asked.append("QueryRoute")
        return query_route(request, timeout)

    monkeypatch.setattr(routes.bootstrap, "query_route", counting_query_route)
    monkeypatch.setattr(route_module, "ROUTE_RETRY_AFTER_S", 0.2)
    routes._routes[topic] = (time.monotonic() - route_module.ROUTE_TTL_S - 1, route)  # expired
    with paused(broker, 1.0):  # the block lasts the whole second: the 0.2 s pass in it
        got = [routes.get(topic) for _ in range(5)]
    assert got == [route] * 5 and asked == ["QueryRoute"]  # one time-out, then the kept route
    assert routes.get(topic) == route and asked == ["QueryRoute", "QueryRoute"]  # asked again


def test_sync_retry_avoids_the_broker_that_just_failed() -> None:
    """Fault avoidance: the retry goes to another broker's queue, and new sends avoid the failed one."""
    producer = Producer("127.0.0.1:1")  # never called: the route is given
    queues = tuple(MessageQueue("t", b, q) for b in ("broker-a", "broker-b") for q in range(2))
    route = TopicRoute("t", queues, queues, {"broker-a": "127.0.0.1:1", "broker-b": "127.0.0.1:2"})
    producer.backend._routes._routes["t"] = (time.monotonic(), route)
    prepared = producer._prepare([Message("t", b"x")])
    for _ in range(8):
        assert producer._select_queue(prepared, "broker-a").broker_name == "broker-b"
    producer._fault.update("broker-b", True)
    picks = {producer._select_queue(prepared, None).broker_name for _ in range(8)}
    assert picks == {"broker-a"}
    producer._fault.update("broker-b", False)
    picks = {producer._select_queue(prepared, None).broker_name for _ in range(8)}
    assert picks == {"broker-a", "broker-b"}


def test_send_backs_are_retried_until_acknowledged_then_fail_the_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A micro-batch does not complete before its send backs are acknowledged."""
    monkeypatch.setattr(rows_module.time, "sleep", lambda s: None)
    calls: list[int] = []

    def flaky(done: list[Any]) -> list[Any]:
        calls.append(1)
        if len(calls) < 3:
            raise BrokerUnavailableError("broker at x is unavailable")
        done[:] = ["acknowledged"] * len(done)
        return done

    def rows(items: list[int]) -> str:
        return f"rows {items} of partition 1"

    assert send_back_acknowledged(flaky, 1, rows) == ["acknowledged"] and len(calls) == 3

    def down(done: list[Any]) -> list[Any]:
        calls.append(1)
        done[1] = "acknowledged"
        raise BrokerUnavailableError("broker at x is unavailable")

    calls.clear()
    with pytest.raises(BrokerUnavailableError) as info:
        send_back_acknowledged(down, 3, rows, wait_s=0)
    assert len(calls) == SEND_BACK_ATTEMPTS
    assert "could not send rows [0, 2] of partition 1 back" in str(info.value)
    assert "Spark runs it again" in str(info.value) and info.value.code == "SERVICE_NOT_AVAILABLE"


class _Clock:
    """time for rows_module: sleep moves monotonic on, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_send_back_waits_out_a_broker_restart_not_just_four_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker restarting (down ~10 s) outlasted the four attempts (3.5 s of backoff): the task, and
    under local[N] the streaming query, failed where the source's pulls wait pollTimeoutMs for it.
    A retriable error is retried for SEND_BACK_WAIT_S; any other still stops after four attempts."""
    clock = _Clock()
    monkeypatch.setattr(rows_module, "time", clock)
    calls: list[float] = []

    def restarting(done: list[Any]) -> list[Any]:
        calls.append(clock.now)
        if clock.now < 10:
            raise BrokerUnavailableError("broker at x is unavailable")
        done[:] = ["acknowledged"] * len(done)
        return done

    assert send_back_acknowledged(restarting, 2, lambda items: "rows") == ["acknowledged"] * 2
    assert len(calls) > SEND_BACK_ATTEMPTS and max(b - a for a, b in itertools.pairwise(calls)) <= 2

    def gone(done: list[Any]) -> list[Any]:
        calls.append(clock.now)
        raise BrokerUnavailableError("broker at x is unavailable")

    calls.clear()
    clock.now = 0.0
    with pytest.raises(BrokerUnavailableError, match="Spark runs it again"):
        send_back_acknowledged(gone, 1, lambda items: "rows")
    assert rows_module.SEND_BACK_WAIT_S - 2 <= calls[-1] <= rows_module.SEND_BACK_WAIT_S

    def refused(done: list[Any]) -> list[Any]:
        calls.append(clock.now)
        raise PymqError("the message has no room for the properties of a send back")

    calls.clear()
    with pytest.raises(PymqError, match="no room"):
        send_back_acknowledged(refused, 1, lambda items: "rows")
    assert len(calls) == SEND_BACK_ATTEMPTS


def _source_rows(endpoint: str, topic: str, group: str) -> pa.RecordBatch:
    """The rows of ``topic``'s one queue as the pymq source gives them."""
    consumer = PullConsumer(endpoint, group)
    (mq,) = consumer.queues(topic)
    return consumer.backend.decode_arrow(consumer.pull_raw(mq, 0, 1000), mq, retry=False)


def _send_back_options(endpoint: str, rows: pa.RecordBatch, **options: str) -> SinkOptions:
    from pyspark.sql.pandas.types import from_arrow_schema

    return parse_sink_options({"endpoint": endpoint, "action": "reconsumeLater", **options},
                              from_arrow_schema(rows.schema), stream=False)


def test_a_retried_send_back_sends_only_the_rows_not_yet_acknowledged(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row 1's properties leave no room for a send back's (nor its direct copy's): it fails on every
    attempt. Row 0, acknowledged by the first, is in the DLQ once, not once per attempt."""
    monkeypatch.setattr(rows_module.time, "sleep", lambda s: None)
    topic, group = unique("send-back-once"), unique("g")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    Producer(broker.endpoint).send_batch([Message(topic, b"good"),
                                          Message(topic, b"full", properties={"pad": "p" * 32_500})])
    rows = _source_rows(broker.endpoint, topic, group)
    opts = _send_back_options(broker.endpoint, rows, consumerGroup=group, delayLevel="-1")
    with pytest.raises(PymqError) as err:
        write_partition(opts, iter([rows.slice(0, 1), rows]))
    dead = read_all(broker.endpoint, f"%DLQ%{group}")
    assert sorted(m.body for m in dead) == [b"good", b"good"]  # once per batch, not per attempt
    # rows 0, then 1..2: the full row is the task's row 2
    assert "could not send row 2 of partition 0 of batch 0 to %RETRY%" in str(err.value)


def test_a_row_copied_to_retry_keeps_its_error_cut_as_the_broker_would(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker cannot send these rows back (their commit-log offsets are gone): each is copied to
    %RETRY% directly, a 40k-character traceback cut to MAX_REASON_CHARS as the broker's send back
    cuts it, and further where the message's own properties leave less room. A row whose own
    properties leave none fails the task, naming the row (not the copy's place in its request)."""
    monkeypatch.setattr(rows_module.time, "sleep", lambda s: None)
    topic, group = unique("copied-back"), unique("g")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    Producer(broker.endpoint).send_batch([
        Message(topic, b"plain"), Message(topic, b"roomy", properties={"pad": "p" * 30_000}),
        Message(topic, b"full", properties={"pad": "p" * 32_600}),
    ])
    rows = _source_rows(broker.endpoint, topic, group)
    offsets = rows.schema.get_field_index("commit_log_offset")
    trace = "Traceback (most recent call last):\n" + "x" * 40_000
    failed = rows.set_column(offsets, "commit_log_offset", pa.array([10**12] * 3, pa.int64())) \
        .append_column("error", pa.array([trace] * 3))
    opts = _send_back_options(broker.endpoint, failed, consumerGroup=group, delayLevel="-1")
    assert write_partition(opts, iter([failed.slice(0, 2)])).rows == 2
    reasons = {m.body: m.properties["CONSUME_FAILURE_REASON"] for m in read_all(broker.endpoint,
                                                                                f"%DLQ%{group}")}
    assert reasons[b"plain"] == trace[:MAX_REASON_CHARS]
    assert trace.startswith(reasons[b"roomy"]) and 0 < len(reasons[b"roomy"]) < MAX_REASON_CHARS
    with pytest.raises(PymqError) as err:
        write_partition(opts, iter([failed.slice(0, 1), failed.slice(2)]))
    assert "could not send row 1 of partition 0 of batch 0 to %RETRY%" in str(err.value)
    assert "message 0 of the batch" not in str(err.value) and "no room" in str(err.value)


def test_rows_copied_to_retry_are_counted_as_copies_not_as_lost_oneway_rows(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture,
) -> None:
    topic, group = unique("copied-count"), unique("g")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    Producer(broker.endpoint).send(Message(topic, b"x"))
    rows = _source_rows(broker.endpoint, topic, group)
    gone = rows.set_column(rows.schema.get_field_index("commit_log_offset"), "commit_log_offset",
                           pa.array([10**12], pa.int64()))
    writer = PymqSinkWriter(_send_back_options(broker.endpoint, gone, consumerGroup=group))
    done = writer.write(iter([gone]))
    assert (done.rows, done.fallbacks, done.unacknowledged) == (1, 1, 0)
    with caplog.at_level(logging.INFO, logger="pyspark_pymq.spark.writer"):
        writer.commit([done])
    assert "1 copied to %RETRY% directly" in caplog.text and "not acknowledged" not in caplog.text


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_send_stored_but_not_flushed_fails_the_task(tmp_path: Any, mode: str) -> None:
    """SYNC_FLUSH with syncFlushTimeout 0: every put is answered FLUSH_DISK_TIMEOUT. The rows
    are stored but not durable: a task that succeeded would never send them again."""
    with BrokerProcess(tmp_path, flush_disk_type="SYNC_FLUSH",
                       extra_args=["--sync-flush-timeout", "0"]) as slow_disk:
        topic = unique("not-flushed")
        Admin(slow_disk.endpoint).create_topic(topic, queues=2)
        assert Producer(slow_disk.endpoint).send(Message(topic, b"x")).status.value == "FLUSH_DISK_TIMEOUT"
        opts = _options(slow_disk.endpoint, topic, sendMode=mode)
        with pytest.raises(PymqError, match=r"rows 0\.\.9 .* answered FLUSH_DISK_TIMEOUT") as err:
            write_partition(opts, _rows(10))
        assert err.value.code == "FLUSH_DISK_TIMEOUT"


def test_max_batch_bytes_sizes_batches_not_rows(broker: BrokerProcess) -> None:
    """maxBatchBytes is how big a request of rows may grow; a row larger than it goes alone
    (the broker takes up to 4 MiB), and only a row over 4 MiB fails, naming that limit."""
    topic = unique("batch-bytes")
    Admin(broker.endpoint).create_topic(topic, queues=2)
    big = b"x" * 2000
    plain = pa.record_batch([pa.array([big] * 3)], names=["body"])
    keyed = pa.record_batch([pa.array([big] * 2), pa.array([["k"], ["k"]])], names=["body", "keys"])
    for batch in (plain, keyed):
        opts = _options(broker.endpoint, topic, maxBatchBytes="1024")
        assert write_partition(opts, iter([batch])).rows == batch.num_rows
    assert len(read_all(broker.endpoint, topic)) == 5
    huge = pa.record_batch([pa.array([b"y" * (4 * 1024 * 1024 + 1)])], names=["body"])
    with pytest.raises(PymqError, match="over maxMessageSize 4194304"):
        write_partition(_options(broker.endpoint, topic, maxBatchBytes="1024"), iter([huge]))


def test_max_message_size_lets_the_sink_send_what_the_broker_takes(tmp_path: Any) -> None:
    """A broker raised to 8 MiB took a 5 MiB row from a Producer, but the sink had no way past its
    producer's 4 MiB, and the error said to raise "max_message_size here"."""
    row = pa.record_batch([pa.array([b"z" * (5 * 1024 * 1024)])], names=["body"])
    with BrokerProcess(tmp_path / "b", ["--max-message-size", str(8 * 1024 * 1024)]) as big:
        topic = unique("big-rows")
        Admin(big.endpoint).create_topic(topic, queues=1)
        with pytest.raises(PymqError, match=r"over maxMessageSize 4194304 .*the Spark sink's option "
                                            r"maxMessageSize"):
            write_partition(_options(big.endpoint, topic), iter([row]))
        opts = _options(big.endpoint, topic, maxMessageSize=str(8 * 1024 * 1024))
        assert opts.max_batch_bytes == 4 * 1024 * 1024  # batches stay at 4 MiB unless asked
        assert write_partition(opts, iter([row])).rows == 1
        [stored] = read_all(big.endpoint, topic)
        assert stored.body == row.column(0)[0].as_py()
    with pytest.raises(ValueError, match=r"maxBatchBytes=8388608 is not valid: at most maxMessageSize "
                                         r"\(4194304\)"):
        _options("127.0.0.1:1", "t", maxBatchBytes=str(8 * 1024 * 1024))
    assert _options("127.0.0.1:1", "t", maxMessageSize="2048").max_batch_bytes == 2048


def test_properties_over_rocketmqs_limit_are_named_before_they_are_sent(broker: BrokerProcess) -> None:
    """A tag of 40,000 characters: the Arrow path leaves the row to the per-row encoding, which
    names it (the broker would refuse the whole request with a message about its records)."""
    topic = unique("big-props")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    tagged = pa.record_batch([pa.array([b"a", b"b"]), pa.array(["T", "T" * 40_000])], names=["body", "tags"])
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    schema = StructType([StructField("body", BinaryType()), StructField("tags", StringType())])
    opts = parse_sink_options({"endpoint": broker.endpoint, "topic": topic}, schema, stream=False)
    with pytest.raises(PymqError, match=r"sending rows 0..1 .* message 1 of the batch: its properties"):
        write_partition(opts, iter([tagged]))
    assert read_all(broker.endpoint, topic) == []


def _body_rows(n: int, **columns: pa.Array) -> Iterator[pa.RecordBatch]:
    return iter([pa.RecordBatch.from_pydict({"body": pa.array([f"r{i}" for i in range(n)]), **columns})])


def test_later_tasks_see_a_topic_created_again_or_scaled_out(shared_broker: BrokerProcess) -> None:
    """A Python worker's tasks share its backend and its routes (kept 30 s): a later task sent to
    the queues of the route an earlier one learnt, so a topic re-created with fewer queues between
    micro-batches failed it (queue id out of range), and a row pinned to a queue just added too
    (review helper-98). Each task's producer asks a topic's route once, as each did alone before."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    ep = shared_broker.endpoint
    admin = Admin(ep)
    recreated, scaled = unique("recreated"), unique("scaled")
    admin.create_topic(recreated, queues=8)
    admin.create_topic(scaled, queues=2)
    plain = parse_sink_options({"endpoint": ep, "topic": recreated},
                               StructType([StructField("body", StringType())]), stream=False)
    pinned = parse_sink_options({"endpoint": ep, "topic": scaled}, StructType(
        [StructField("body", StringType()), StructField("queue_id", IntegerType())]), stream=False)
    assert write_partition(plain, _body_rows(64)).rows == 64  # the worker learns 8 queues
    assert write_partition(pinned, _body_rows(2, queue_id=pa.array([0, 1], pa.int32()))).rows == 2
    admin.delete_topic(recreated)
    admin.create_topic(recreated, queues=2)
    admin.create_topic(scaled, queues=4)  # updateTopic: 4 queues now
    assert write_partition(plain, _body_rows(64)).rows == 64
    assert write_partition(pinned, _body_rows(2, queue_id=pa.array([0, 3], pa.int32()))).rows == 2
    assert sorted(mq.queue_id for mq in PullConsumer(ep, "g").queues(recreated)) == [0, 1]
    assert len(read_all(ep, recreated)) == 64
