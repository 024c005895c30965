"""The sink's conversions of Arrow columns to Python values (no Spark needed)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
from pyspark_pymq.spark.rows import _ms_column, column


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
    assert _ms_column(batch, "t") == [expected, 0]
    assert _ms_column(batch, "n") == [expected, 0]
    assert _ms_column(batch, "ms") == [1234, 0]
    assert _ms_column(batch, "absent") == [0, 0]


def test_send_back_columns_come_straight_from_the_arrow_columns() -> None:
    import pytest
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
    assert [c.broker_name for c, _ in parts] == ["a", "b"]  # one request per broker
    a, rows_a = parts[0]
    assert list(a.commit_log_offsets) == [10, 30] and list(a.delay_levels) == [2, 2]
    assert list(a.origin_msg_ids) == ["M0", "M2"] and list(a.origin_topics) == ["t", "u"]
    assert a.property_columns == {"CONSUME_FAILURE_REASON": ["bad\ufffdnews", "x"],
                                  "CONSUME_FAILURE_EXCEPTION": ["ValueError", ""]}
    assert a.properties == {"CONSUME_FAILURE_STAGE": "s"}
    b, _ = parts[1]
    assert list(b.delay_levels) == [5] and list(b.origin_msg_ids) == [""]
    assert [m.body for m in rows_as_messages(rows_a)([1])] == [b"2"]  # the fallback's rows
    without = batch.drop_columns(["delay_level", "error", "error_class"])
    without = without.filter(pa.array([True, False, True]))
    (plain, _), = send_back_columns(without, -1, {})
    assert list(plain.delay_levels) == [-1, -1] and plain.property_columns == {}
    no_offset = batch.set_column(2, "commit_log_offset", pa.array([1, None, 3], pa.int64()))
    with pytest.raises(ValueError, match="row 1 has no commit_log_offset or topic"):
        send_back_columns(no_offset, 0, {})
    with pytest.raises(ValueError, match="row 0 has no commit_log_offset or topic"):
        send_back_columns(batch.drop_columns(["topic"]), 0, {})
