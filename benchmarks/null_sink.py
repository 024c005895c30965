"""A Python data source whose writer discards its rows: what Spark's Arrow path to a Python sink costs.

``bench_sink.py`` registers it as ``format("pymq-bench-null")`` and measures it next to Spark's
``noop`` sink: the gap between the two is Spark's own cost of handing rows to Python,
which every Python sink pays before its first byte is sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage


class _Discard(DataSourceArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _batch in iterator:
            pass
        return WriterCommitMessage()


class NullDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pymq-bench-null"

    def writer(self, schema: Any, overwrite: bool) -> _Discard:
        return _Discard()
