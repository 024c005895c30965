"""The exactly-once sink (deliveryGuarantee=exactly-once): markers, check-back answers, crashes.

The crash tests kill -9 the Spark driver at every stage of a micro-batch
(while tasks write half messages, before the commit marker, after it, in the
middle of committing, after committing but before Spark's own checkpoint
commit), restart the query from its checkpoint, and check that every source
message is in the destination exactly once, and that no transaction was left
to the broker's give-up topic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from helpers import read_all, unique
from pyspark_pymq import Admin, LocalTransactionState, Message, MessageExt, Producer
from pyspark_pymq.spark.sink_options import parse_sink_options
from pyspark_pymq.spark.transactional_sink import (
    CRASH_AT_ENV,
    SinkCommitLog,
    SinkCommitMarker,
    answer_check,
)

JOB = Path(__file__).resolve().parent / "jobs" / "forward_job.py"
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
# Check-backs come fast, and a killed query has ten minutes to come back before
# its undecided rows would be given up.
TX_FLAGS = ["--transaction-timeout", "500", "--transaction-check-interval", "1000",
            "--transaction-check-max", "600"]


def _half(tag: str) -> MessageExt:
    return MessageExt("dst", 0, "broker-a", 0, "ID", "", 0, b"", None, (),
                      {"PYMQ_SINK_TXN": tag}, 0, 0, 0)


def test_check_back_answers_follow_the_commit_markers(tmp_path: Path) -> None:
    log = SinkCommitLog(str(tmp_path))
    assert log.get(0) is None and log.latest() is None
    log.add(SinkCommitMarker("q1", 3, (("AAAA", 10), ("BBBB", 5))))
    assert log.get(3) == SinkCommitMarker("q1", 3, (("AAAA", 10), ("BBBB", 5)))
    assert answer_check(log, _half("q1:3:AAAA")) == COMMIT
    assert answer_check(log, _half("q1:3:CCCC")) == ROLLBACK  # a failed attempt of batch 3
    assert answer_check(log, _half("q1:4:DDDD")) == UNKNOW  # batch 4 is not decided yet
    assert answer_check(log, _half("q1:2:EEEE")) == ROLLBACK  # batch 3 committed: 2 was decided
    assert answer_check(log, _half("q2:3:AAAA")) == UNKNOW  # another query's: not ours to say
    assert answer_check(log, _half("garbage")) == UNKNOW
    for b in range(4, 110):
        log.add(SinkCommitMarker("q1", b, (("F", 1),)))
    log.purge(109 - 100)
    assert log.get(3) is None and log.get(9) is not None and log.latest() == 109
    assert not [p for p in log.path.iterdir() if p.name.endswith(".tmp")]


def test_exactly_once_options_are_checked(tmp_path: Path) -> None:
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

    schema = StructType([StructField("body", BinaryType())])
    base = {"endpoint": "127.0.0.1:1", "topic": "t", "deliveryGuarantee": "exactly-once",
            "checkpointLocation": str(tmp_path / "ckpt")}
    opts = parse_sink_options(base, schema, stream=True)
    assert opts.exactly_once and opts.checkpoint_location == str(tmp_path / "ckpt")
    assert opts.producer_group.startswith("PYMQ_SPARK_SINK_TX_")
    other = parse_sink_options({**base, "checkpointLocation": str(tmp_path / "other")}, schema, stream=True)
    assert other.producer_group != opts.producer_group, "each query needs its own check-back group"
    assert parse_sink_options({**base, "producerGroup": "mine"}, schema, stream=True).producer_group == "mine"
    assert parse_sink_options({**base, "checkpointLocation": f"file://{tmp_path}/c"}, schema,
                              stream=True).checkpoint_location == f"{tmp_path}/c"
    cases = {
        "deliveryGuarantee='twice'": {**base, "deliveryGuarantee": "twice"},
        "needs acknowledged sends": {**base, "sendMode": "oneway"},
        "needs .option\\('checkpointLocation'": {k: v for k, v in base.items() if k != "checkpointLocation"},
        "must be a local or mounted path": {**base, "checkpointLocation": "s3a://bucket/ckpt"},
        "applies to action=send": {**base, "action": "reconsumeLater", "consumerGroup": "g"},
    }
    for message, options in cases.items():
        with pytest.raises(ValueError, match=message):
            parse_sink_options(options, schema, stream=True)
    for column, kind in (("delay_level", IntegerType()), ("deliver_time_ms", LongType())):
        delayed = StructType([*schema.fields, StructField(column, kind)])
        with pytest.raises(ValueError, match=f"exactly-once cannot send the column '{column}'"):
            parse_sink_options(base, delayed, stream=True)  # refused before the first row, not at the broker
    with pytest.raises(ValueError, match=r"is for df\.writeStream"):
        parse_sink_options(base, schema, stream=False)


def _read_at_least(endpoint: str, topic: str, n: int, timeout_s: float = 10.0) -> list[MessageExt]:
    deadline = time.monotonic() + timeout_s
    while len(got := read_all(endpoint, topic)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_abort_after_the_marker_keeps_the_decided_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark calls abort() when commit() raises, also after the marker was written (an
    # END_TRANSACTION that timed out): the marker's rows must stay for the next run.
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_pymq.errors import RequestTimeoutError
    from pyspark_pymq.spark import transactional_sink as ts

    def rows(task: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"body": pa.array([f"t{task}-{i}".encode() for i in range(5)])})

    with BrokerProcess(tmp_path / "broker") as broker:
        topic = unique("eo")
        Admin(broker.endpoint).create_topic(topic, queues=2)
        opts = parse_sink_options(
            {"endpoint": broker.endpoint, "topic": topic, "deliveryGuarantee": "exactly-once",
             "checkpointLocation": str(tmp_path / "ckpt")},
            StructType([StructField("body", BinaryType())]), stream=True,
        )
        first = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in range(3)]
        end = ts.TransactionProducer.end_transactions
        calls: list[object] = []

        def second_commit_times_out(self: Any, ids: Any, state: Any) -> Any:
            calls.append(state)
            if state is COMMIT and calls.count(COMMIT) == 2:
                raise RequestTimeoutError("EndTransactionBatch timed out")
            return end(self, ids, state)

        monkeypatch.setattr(ts.TransactionProducer, "end_transactions", second_commit_times_out)
        with pytest.raises(RequestTimeoutError):
            ts.TransactionalStreamSinkWriter(opts).commit(first, 7)  # type: ignore[arg-type]
        ts.TransactionalStreamSinkWriter(opts).abort(first, 7)  # type: ignore[arg-type]
        assert ROLLBACK not in calls, "abort rolled back transactions the marker had decided"
        monkeypatch.setattr(ts.TransactionProducer, "end_transactions", end)
        # the query restarts and runs batch 7 again: the marker's rows are the output, once
        again = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in range(3)]
        ts.TransactionalStreamSinkWriter(opts).commit(again, 7)  # type: ignore[arg-type]
        got = Counter(m.body for m in _read_at_least(broker.endpoint, topic, 15))
        assert got == Counter(f"t{t}-{i}".encode() for t in range(3) for i in range(5))
        # and a batch aborted before its marker is rolled back whole, as before
        lost = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(9)]))]
        ts.TransactionalStreamSinkWriter(opts).abort(lost, 8)  # type: ignore[arg-type]
        time.sleep(0.3)
        assert Counter(m.body for m in read_all(broker.endpoint, topic)) == got


def test_markers_of_an_earlier_query_in_the_checkpoint_do_not_drop_a_new_querys_rows(tmp_path: Path) -> None:
    # Spark's checkpoint removed or replaced (a query reset to run from the start) while
    # <checkpointLocation>/pymq stays: the new query (a new id) meets the old one's markers at
    # its batch ids. Following them rolled back every batch's rows while Spark recorded them as
    # written: nothing delivered, no error. Now the commit fails naming the markers to remove.
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_pymq.errors import PymqError
    from pyspark_pymq.spark import transactional_sink as ts

    with BrokerProcess(tmp_path / "broker") as broker:
        ep, topic = broker.endpoint, unique("eo")
        Admin(ep).create_topic(topic, queues=2)
        ckpt = tmp_path / "ckpt"
        markers = SinkCommitLog(str(ckpt))
        markers.add(SinkCommitMarker("earlier-query", 0, (("0123456789ABCDEF", 5),)))
        opts = parse_sink_options(
            {"endpoint": ep, "topic": topic, "deliveryGuarantee": "exactly-once",
             "checkpointLocation": str(ckpt)},
            StructType([StructField("body", BinaryType())]), stream=True,
        )
        batch = pa.RecordBatch.from_pydict({"body": pa.array([b"row-%d" % i for i in range(5)])})
        written = [ts.TransactionalStreamSinkWriter(opts).write(iter([batch]))]
        with pytest.raises(PymqError, match=r"batch 0: the commit marker .* is of another streaming query "
                                            r"\(id earlier-query; .*Remove .*pymq"):
            ts.TransactionalStreamSinkWriter(opts).commit(written, 0)  # type: ignore[arg-type]
        ts.TransactionalStreamSinkWriter(opts).abort(written, 0)  # type: ignore[arg-type]
        assert Admin(ep).broker_info()["transactionsPending"] == "0", "the batch's rows were left pending"
        assert read_all(ep, topic) == []
        # the earlier query's markers removed, the batch runs again and is delivered once
        shutil.rmtree(ckpt / "pymq")
        again = [ts.TransactionalStreamSinkWriter(opts).write(iter([batch]))]
        ts.TransactionalStreamSinkWriter(opts).commit(again, 0)  # type: ignore[arg-type]
        got = Counter(m.body for m in _read_at_least(ep, topic, 5))
        assert got == Counter(b"row-%d" % i for i in range(5))


def test_a_batch_that_ran_past_the_check_window_is_not_committed(tmp_path: Path) -> None:
    """The live driver answers UNKNOW while a batch runs; each answer uses up one of the broker's
    transactionCheckMax checks. An early task's rows were given up to TRANS_CHECK_MAX_TIME_TOPIC,
    and commit() wrote a marker naming them: the batch was recorded, those rows never came."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_pymq.errors import PymqError
    from pyspark_pymq.spark import transactional_sink as ts

    def rows(task: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"body": pa.array([f"t{task}-{i}".encode() for i in range(5)])})

    # scaled down from RocketMQ's 6 s / 60 s / 15 checks (about 14 min): a window of 0.9 s
    flags = ["--transaction-timeout", "300", "--transaction-check-interval", "300",
             "--transaction-check-max", "3"]
    with BrokerProcess(tmp_path / "broker", flags) as broker:
        topic = unique("eo-long")
        Admin(broker.endpoint).create_topic(topic, queues=1)
        opts = parse_sink_options(
            {"endpoint": broker.endpoint, "topic": topic, "deliveryGuarantee": "exactly-once",
             "checkpointLocation": str(tmp_path / "ckpt")},
            StructType([StructField("body", BinaryType())]), stream=True,
        )
        early = ts.TransactionalStreamSinkWriter(opts).write(iter([rows(0)]))
        time.sleep(2.5)  # the rest of the batch still runs
        late = ts.TransactionalStreamSinkWriter(opts).write(iter([rows(1)]))
        with pytest.raises(PymqError, match=r"batch 0 ran \d+ s, longer than the broker gives"):
            ts.TransactionalStreamSinkWriter(opts).commit([early, late], 0)  # type: ignore[list-item]
        assert ts.SinkCommitLog(str(tmp_path / "ckpt")).get(0) is None  # nothing decided
        ts.TransactionalStreamSinkWriter(opts).abort([early, late], 0)  # type: ignore[list-item]
        # the query restarts (its broker now gives batches time enough): the batch runs again, whole
        again = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in range(2)]
        ts.TransactionalStreamSinkWriter(opts).commit(again, 0)  # type: ignore[arg-type]
        got = Counter(m.body for m in _read_at_least(broker.endpoint, topic, 10))
        assert got == Counter(f"t{t}-{i}".encode() for t in range(2) for i in range(5))
    # no check-back at all (transactionCheckMax 0): a half message lives transactionTimeOut (6 s);
    # a batch that commits within it is committed
    with BrokerProcess(tmp_path / "broker0", ["--transaction-check-max", "0"]) as broker:
        Admin(broker.endpoint).create_topic(topic, queues=1)
        opts = parse_sink_options(
            {"endpoint": broker.endpoint, "topic": topic, "deliveryGuarantee": "exactly-once",
             "checkpointLocation": str(tmp_path / "ckpt0")},
            StructType([StructField("body", BinaryType())]), stream=True,
        )
        quick = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(0)]))]
        ts.TransactionalStreamSinkWriter(opts).commit(quick, 0)  # type: ignore[arg-type]
        assert len(_read_at_least(broker.endpoint, topic, 5)) == 5


def test_rows_the_broker_gave_up_while_the_query_was_down_are_not_recorded_as_committed(
    tmp_path: Path,
) -> None:
    """The driver dies after writing batch N's marker and stays down past the broker's check window:
    nobody answers the check-backs and the broker gives the halves up. The restarted query's
    commit(N) committed nothing and recorded the batch: its rows were lost without a word. Now,
    every row given up, the marker is withdrawn and the commit fails; the next run commits the
    batch once. Some rows committed and others given up: the commit fails naming them."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_pymq.errors import PymqError
    from pyspark_pymq.spark import transactional_sink as ts

    def rows(task: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"body": pa.array([f"t{task}-{i}".encode() for i in range(5)])})

    def driver_dies(opts: Any) -> None:  # its check-back listener goes with it
        ts._LISTENERS.pop((opts.endpoint, opts.producer_group, opts.checkpoint_location)).close()

    def given_up(ep: str) -> None:
        deadline = time.monotonic() + 30
        while Admin(ep).broker_info()["transactionsPending"] != "0":
            assert time.monotonic() < deadline
            time.sleep(0.2)

    flags = ["--transaction-timeout", "300", "--transaction-check-interval", "300",
             "--transaction-check-max", "3"]
    with BrokerProcess(tmp_path / "broker", flags) as broker:
        ep, topic = broker.endpoint, unique("eo-gone")
        Admin(ep).create_topic(topic, queues=1)
        ckpt = tmp_path / "ckpt"
        opts = parse_sink_options(
            {"endpoint": ep, "topic": topic, "deliveryGuarantee": "exactly-once",
             "checkpointLocation": str(ckpt)},
            StructType([StructField("body", BinaryType())]), stream=True,
        )
        sent = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in range(2)]
        log = SinkCommitLog(str(ckpt))
        log.add(SinkCommitMarker(sent[0].query_id, 4, ts._transactions(sent)))  # after-marker
        driver_dies(opts)
        given_up(ep)
        again = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in range(2)]
        with pytest.raises(PymqError, match=r"gave up 10 row\(s\) of .* batch 4 .*marker is withdrawn"):
            ts.TransactionalStreamSinkWriter(opts).commit(again, 4)  # type: ignore[arg-type]
        assert log.get(4) is None
        ts.TransactionalStreamSinkWriter(opts).abort(again, 4)  # type: ignore[arg-type]
        rerun = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in range(2)]
        ts.TransactionalStreamSinkWriter(opts).commit(rerun, 4)  # type: ignore[arg-type]
        got = Counter(m.body for m in _read_at_least(ep, topic, 10))
        assert got == Counter(f"t{t}-{i}".encode() for t in range(2) for i in range(5))

        # one task's rows committed before the driver died, the other's given up: named, not hidden
        sent = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in (5, 6)]
        marker = SinkCommitMarker(sent[0].query_id, 5, ts._transactions(sent))
        log.add(marker)
        ts._end(ts.check_listener(opts), [(sent[0].transaction, sent[0].rows)], COMMIT)  # mid-commit
        driver_dies(opts)
        given_up(ep)
        again = [ts.TransactionalStreamSinkWriter(opts).write(iter([rows(t)])) for t in (5, 6)]
        with pytest.raises(PymqError, match=r"gave up 5 row\(s\) of .* batch 5 .*other rows are committed"):
            ts.TransactionalStreamSinkWriter(opts).commit(again, 5)  # type: ignore[arg-type]
        assert log.get(5) == marker


@pytest.mark.spark
def test_stream_commits_every_batch_once_and_a_replayed_batch_adds_nothing(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    ep = shared_broker.endpoint
    src, dst = unique("eo-src"), unique("eo-dst")
    Admin(ep).create_topic(src, queues=2)
    Admin(ep).create_topic(dst, queues=2)
    Producer(ep).send_batch([Message(src, b"r%04d" % i) for i in range(900)])
    ckpt = tmp_path / "ckpt"

    def run() -> None:
        (spark.readStream.format("pymq").option("endpoint", ep).option("topic", src)
         .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 300)
         .option("consumerGroup", unique("eo-g")).load().select("body")
         .writeStream.format("pymq").option("endpoint", ep).option("topic", dst)
         .option("deliveryGuarantee", "exactly-once").option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start().awaitTermination())

    run()
    got = read_all(ep, dst)
    assert Counter(m.body for m in got) == Counter(b"r%04d" % i for i in range(900))
    markers = SinkCommitLog(str(ckpt))
    last = markers.latest()
    assert last is not None
    decided = [m for b in range(last + 1) if (m := markers.get(b)) is not None]
    assert len(decided) >= 3, "900 rows at 300 per trigger: three batches with rows or more"
    committed = {t for m in decided for t, _n in m.transactions}
    assert {m.properties["PYMQ_SINK_TXN"].rsplit(":", 1)[1] for m in got} == committed
    assert {m.msg_id[:16] for m in got} == committed
    # The driver dies after the sink committed the last batch but before Spark recorded
    # it: Spark runs that batch again; its commit finds the marker and rolls its own rows back.
    decision = markers.get(last)
    for name in (str(last), f".{last}.crc"):
        (ckpt / "commits" / name).unlink()
    run()
    assert Counter(m.body for m in read_all(ep, dst)) == Counter(b"r%04d" % i for i in range(900))
    assert markers.get(last) == decision, "the replay must keep the first run's decision"


STAGES = ("mid-write", "before-marker", "after-marker", "mid-commit", "after-commit")


@pytest.mark.spark
def test_kill9_at_every_stage_of_a_batch_then_restart_gives_exactly_once(tmp_path: Path) -> None:
    """One query killed once per stage: each run recovers from the last kill, then dies at the next stage."""
    with BrokerProcess(tmp_path / "broker", TX_FLAGS) as broker:
        ep = broker.endpoint
        src, dst, group = unique("eo-src"), unique("eo-dst"), unique("eo-g")
        Admin(ep).create_topic(src, queues=2)
        Admin(ep).create_topic(dst, queues=2)
        n = 3000  # 300 per micro-batch: ten batches with rows
        Producer(ep).send_batch([Message(src, b"m%05d" % i) for i in range(n)])
        args = [sys.executable, str(JOB), ep, src, dst, group, str(tmp_path / "ckpt")]
        seen = 0
        for batch, stage in enumerate(STAGES, start=2):
            crash_at = {**os.environ, CRASH_AT_ENV: f"{stage}@{batch}"}
            run = subprocess.run([*args, "run", "exactly-once"], env=crash_at, start_new_session=True,
                                 capture_output=True, text=True, timeout=420)
            assert run.returncode == -9, f"the driver was not killed at {stage}: {run.stderr[-3000:]}"
            visible = Counter(m.body for m in read_all(ep, dst))
            assert max(visible.values()) == 1, f"rows duplicated after the kill at {stage}"
            assert visible.total() > seen, f"no batch committed before the kill at {stage}"
            seen = visible.total()
        finish = subprocess.run([*args, "finish", "exactly-once"], capture_output=True, text=True,
                                timeout=300)
        assert finish.returncode == 0, finish.stdout[-3000:] + finish.stderr[-3000:]
        got = Counter(m.body for m in read_all(ep, dst))
        assert set(got) == {b"m%05d" % i for i in range(n)}, "rows lost"
        assert max(got.values()) == 1, "rows duplicated"
        give_up = "TRANS_CHECK_MAX_TIME_TOPIC"
        exists = give_up in Admin(ep).topic_names(include_system=True)
        given_up = [m.properties.get("PYMQ_SINK_TXN") for m in (read_all(ep, give_up) if exists else [])]
        assert given_up == [], f"transactions given up instead of decided: {Counter(given_up)}"
