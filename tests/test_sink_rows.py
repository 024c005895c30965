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
