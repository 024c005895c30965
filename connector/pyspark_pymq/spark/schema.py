"""The row schema of the pymq source: one row per message.

Defined once here, in three forms that must agree exactly:

- :data:`SOURCE_DDL`: the DDL string, for docs and for users who want to pass
  ``.schema(...)`` themselves;
- :func:`source_schema`: the Spark ``StructType`` that ``DataSource.schema()``
  returns;
- :func:`arrow_schema`: the Arrow schema that ``read()`` must produce. Spark
  checks every first RecordBatch of a partition against
  ``to_arrow_schema(schema, timezone="UTC")`` with ``Schema.equals``, so the
  Arrow side is derived from the Spark side rather than written by hand
  (``string`` not ``large_string``, ``timestamp[us, tz=UTC]``, map entries
  with a non-null key).

The columns carry everything a consumer needs to send a message back to the
broker (``commit_log_offset``, ``msg_id``, ``topic``, ``reconsume_times``).
For a message read from ``%RETRY%<group>``, ``topic`` is the original topic
(RocketMQ's ``RETRY_TOPIC`` property) and ``retry_topic`` the retry topic it was
read from; for any other message ``retry_topic`` is null.

A query may read fewer columns: ``.schema("body binary, queue_offset bigint")``
names the columns it keeps (any subset, any order, the types above).
:func:`select_columns` checks such a schema; the executors then decode only what
those columns need (:func:`wants`) and hand Spark only them (:func:`project`).
Spark's Python data sources get no column pruning from ``select()``, and every
column costs the JVM time to convert (the ``properties`` map most of all).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "COLUMNS", "SOURCE_DDL", "arrow_schema", "needs_properties", "project", "select_columns", "source_schema",
    "wants",
]

#: (name, Spark SQL type, meaning) of every column, in order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("topic", "string", "topic of the message; for a retried message, its original topic"),
    ("queue_id", "int", "queue id within the topic on its broker"),
    ("broker_name", "string", "broker that stores the queue"),
    ("queue_offset", "bigint", "offset of the message in its queue (0, 1, 2 ...)"),
    ("msg_id", "string", "producer's message id (UNIQ_KEY), else the offset_msg_id"),
    ("offset_msg_id", "string", "broker's id: store host and commit log offset (32 hex)"),
    ("commit_log_offset", "bigint", "physical offset in the broker's commit log"),
    ("tags", "string", "the message's tag (TAGS), or null"),
    ("keys", "array<string>", "the message's keys (KEYS), empty if none"),
    ("body", "binary", "the payload"),
    ("properties", "map<string,string>", "all properties, system ones included"),
    ("born_timestamp", "timestamp", "when the producer created the message"),
    ("store_timestamp", "timestamp", "when the broker stored the message"),
    ("reconsume_times", "int", "how many times the message was delivered before"),
    ("retry_topic", "string", "the %RETRY% topic a retried message was read from, else null "
                              "(its topic is the original)"),
)

SOURCE_DDL = ", ".join(f"{name} {sql_type}" for name, sql_type, _ in COLUMNS)

_INDEX = {name: i for i, (name, _, _) in enumerate(COLUMNS)}


@lru_cache(maxsize=1)
def source_schema() -> StructType:
    """The Spark schema of the source (all columns nullable, as Spark's DDL makes them).

    Built without a JVM (``StructType.fromDDL`` needs a session), so it also
    works in planner and worker processes.
    """
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {
        "string": StringType(),
        "int": IntegerType(),
        "bigint": LongType(),
        "binary": BinaryType(),
        "timestamp": TimestampType(),
        "array<string>": ArrayType(StringType(), containsNull=True),
        "map<string,string>": MapType(StringType(), StringType(), valueContainsNull=True),
    }
    return StructType([StructField(name, types[t], nullable=True) for name, t, _ in COLUMNS])


@lru_cache(maxsize=1)
def arrow_schema() -> pa.Schema:
    """The Arrow schema Spark expects from ``read()`` for :func:`source_schema`."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema: pa.Schema = to_arrow_schema(source_schema(), timezone="UTC")
    return schema


def select_columns(schema: StructType | None) -> tuple[str, ...] | None:
    """The columns a user's ``.schema(...)`` keeps, in its order; None when it is the whole schema.

    Raises ValueError naming the column and what to declare instead when the schema
    names a column the source does not have, gives one another type, names one twice,
    marks one not nullable, or is empty.
    """
    full = source_schema()
    if schema is None or schema == full:
        return None
    if not schema.fields:
        raise ValueError(f"pymq source: .schema(...) keeps no column; name at least one of: {SOURCE_DDL}")
    seen: set[str] = set()
    for field in schema.fields:
        name = field.name
        if name not in _INDEX:
            close = [c for c in _INDEX if c.lower() == name.lower()]
            hint = f" (column names are matched exactly: did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"pymq source: .schema(...) names column {name!r}, which the source does not have{hint}; "
                f"keep any of its columns: {SOURCE_DDL}"
            )
        want = full.fields[_INDEX[name]].dataType
        if field.dataType != want:
            got, expected = field.dataType.simpleString(), _ddl_type(want)
            why = ("elements and map values that may be null" if got == want.simpleString()
                   else f"type {expected}")
            raise ValueError(
                f"pymq source: .schema(...) declares column {name!r} as {got}{_nullability(field.dataType)}, "
                f"but the source reads it with {why}: declare '{name} {expected}' and cast after load()"
            )
        if not field.nullable:
            raise ValueError(
                f"pymq source: .schema(...) declares column {name!r} NOT NULL; the source's columns are "
                "all nullable: leave out NOT NULL (nullable=True)"
            )
        if name in seen:
            raise ValueError(f"pymq source: .schema(...) names column {name!r} twice")
        seen.add(name)
    return tuple(field.name for field in schema.fields)


def _ddl_type(data_type: DataType) -> str:
    """How to write ``data_type`` in a DDL whatever ``spark.sql.timestampType`` says ("timestamp"
    means TIMESTAMP_NTZ when it is TIMESTAMP_NTZ)."""
    text = data_type.simpleString()
    return "timestamp_ltz" if text == "timestamp" else text


def _nullability(data_type: DataType) -> str:
    """" with elements / values NOT NULL" where a list or map type says so (simpleString does not)."""
    from pyspark.sql.types import ArrayType, MapType

    if isinstance(data_type, ArrayType) and not data_type.containsNull:
        return " with elements NOT NULL"
    if isinstance(data_type, MapType) and not data_type.valueContainsNull:
        return " with values NOT NULL"
    return ""


def wants(columns: tuple[str, ...] | None, *names: str) -> bool:
    """Whether a query that keeps ``columns`` (None: all) keeps any of ``names``."""
    return columns is None or any(name in columns for name in names)


def needs_properties(columns: tuple[str, ...] | None, *, retry: bool) -> bool:
    """Whether a query that keeps ``columns`` needs each message's properties parsed: for the
    columns read from them (and ``topic`` of a retried message: its RETRY_TOPIC)."""
    return wants(columns, "properties", "tags", "keys", "msg_id") or (retry and wants(columns, "topic"))


@lru_cache(maxsize=16)
def _projected_schema(columns: tuple[str, ...]) -> pa.Schema:
    import pyarrow as pa

    full = arrow_schema()
    return pa.schema([full.field(_INDEX[name]) for name in columns])


def project(batch: pa.RecordBatch, columns: tuple[str, ...] | None) -> pa.RecordBatch:
    """The ``columns`` of a batch of the source schema (the batch itself when None)."""
    if columns is None:
        return batch
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [batch.column(_INDEX[name]) for name in columns], schema=_projected_schema(columns)
    )
