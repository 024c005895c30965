"""What a user reads when pymq refuses something inside Spark: pymq's message near the top of the error.

Spark wraps an error of a data source call in its own message and the Python traceback its worker
formats; pyspark drops its own frames from it, not pymq's. ``spark_errors`` raises pymq's user errors
from the methods Spark calls with one frame, so that the message is the traceback's fourth line
(the fourth of ``str(error)`` for a planning error, the fifth for a task's, under Spark's first line
or two for a stream's). The unit tests check the wrapping; the Spark ones what a user sees.
"""

from __future__ import annotations

import io
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Admin
from pyspark_pymq.errors import AccessDeniedError, PymqError, TopicNotExistError
from pyspark_pymq.spark import spark_errors
from pyspark_pymq.spark.data_source import PymqDataSource
from pyspark_pymq.spark.spark_errors import spark_call, spark_iterator

# a frame of pymq's in a traceback: only the one of the method Spark called (in spark_errors.py) should show
PYMQ_FRAME = re.compile(r'File "[^"]*pyspark_pymq/([^"]*)"')


def _frames(err: BaseException) -> list[traceback.FrameSummary]:
    return traceback.extract_tb(err.__traceback__)


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    raise TopicNotExistError("topic 'x' does not exist", code="TOPIC_NOT_EXIST")


class _Calls:
    @spark_call
    def partitions(self) -> list[int]:
        _deep(5)
        return []

    @spark_call
    def bug(self) -> None:
        _ = {}["missing"]  # a KeyError: not a user error, every frame kept

    @spark_iterator
    def read(self, n: int) -> Iterator[int]:
        yield 1
        if n:
            err = ValueError("row 3 of partition 0 has a null body")
            err.add_note("pymq sink: 2 row(s) had been sent")
            raise err

    @spark_call
    def outer(self) -> None:
        self.partitions()


# -- the wrapping (no Spark) ---------------------------------------------------------------------------


def test_a_user_error_leaves_with_one_frame_named_after_the_call_and_its_cause_whole() -> None:
    with pytest.raises(TopicNotExistError) as info:
        _Calls().partitions()
    err = info.value
    assert str(err) == "[TOPIC_NOT_EXIST] topic 'x' does not exist" and err.code == "TOPIC_NOT_EXIST"
    assert isinstance(err, PymqError) and not err.retriable
    in_wrapper = [f for f in _frames(err) if f.filename.endswith("pyspark_pymq/spark/spark_errors.py")]
    assert [f.name for f in in_wrapper] == ["partitions"]  # the call Spark made, one frame
    assert not any(f.name == "_deep" for f in _frames(err))
    cause = err.__cause__  # the original: same error, every frame
    assert isinstance(cause, TopicNotExistError) and cause is not err and str(cause) == str(err)
    assert [f.name for f in _frames(cause)].count("_deep") == 6
    assert "The above exception was the direct cause" in "".join(traceback.format_exception(err))


def test_the_copy_keeps_notes_and_iterators_are_wrapped_while_they_are_read() -> None:
    it = _Calls().read(1)
    assert next(it) == 1
    with pytest.raises(ValueError, match="null body") as info:
        next(it)
    assert info.value.__notes__ == ["pymq sink: 2 row(s) had been sent"]
    ours = [f.name for f in _frames(info.value) if f.filename.endswith("pyspark_pymq/spark/spark_errors.py")]
    assert ours == ["read"]
    assert isinstance(info.value.__cause__, ValueError)
    assert list(_Calls().read(0)) == [1]


def test_other_errors_and_nested_calls() -> None:
    with pytest.raises(KeyError) as info:  # a bug keeps its frames, as raised
        _Calls().bug()
    assert info.value.__cause__ is None and any(f.name == "bug" and "missing" in (f.line or "")
                                                for f in _frames(info.value))
    with pytest.raises(TopicNotExistError) as nested:  # one copy, whose cause is the original
        _Calls().outer()
    assert any(f.name == "_deep" for f in _frames(nested.value.__cause__))  # type: ignore[arg-type]
    assert not getattr(nested.value.__cause__, "_pymq_shown", False)


def test_pymq_full_tracebacks_raises_errors_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYMQ_FULL_TRACEBACKS", "1")
    with pytest.raises(TopicNotExistError) as info:
        _Calls().partitions()
    assert info.value.__cause__ is None and any(f.name == "_deep" for f in _frames(info.value))


def test_in_spark_s_stream_runners_the_original_is_kept_as_context_which_no_traceback_prints(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner = type(sys)("runner")
    runner.__spec__ = type("Spec", (), {"name": "pyspark.sql.streaming.python_streaming_source_runner"})()
    monkeypatch.setitem(sys.modules, "__main__", runner)
    with pytest.raises(TopicNotExistError) as info:
        _Calls().partitions()
    err = info.value
    assert err.__cause__ is None and err.__suppress_context__
    assert isinstance(err.__context__, TopicNotExistError)
    assert "_deep" in "".join(traceback.format_exception(err.__context__))
    assert "_deep" not in "".join(traceback.format_exception(err))


def test_data_source_methods_raise_option_errors_with_one_frame() -> None:
    ds = PymqDataSource({"endpoint": "127.0.0.1:1", "topic": "t", "pullBatchSize": "0"})
    with pytest.raises(ValueError, match="pullBatchSize='0' is not valid") as info:
        ds.schema()
    assert [f.name for f in _frames(info.value)][-1:] == ["schema"]
    assert any(f.filename.endswith("options.py") for f in _frames(info.value.__cause__))  # type: ignore[arg-type]
    assert set(spark_errors.USER_ERRORS) == {PymqError, ValueError}


def test_pyspark_simplifies_the_one_frame_when_pymq_is_installed_next_to_pyspark(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed, pymq is <site-packages>/pyspark_pymq beside <site-packages>/pyspark, and pyspark's
    # simplifier drops the frames of files whose path starts with its directory: made so here by a
    # pyspark directory next to this pyspark_pymq, and a worker frame of Spark's in it.
    import pyspark
    import pyspark.util

    beside = Path(os.path.abspath(spark_errors.__file__)).parents[2]
    monkeypatch.setattr(pyspark, "__file__", str(beside / "pyspark" / "__init__.py"))
    monkeypatch.setenv("SPARK_SIMPLIFIED_TRACEBACK", "1")
    source = ("def worker_run(call, out):\n"
              "    try:\n        call()\n    except Exception as e:\n        handle(e, out)\n")
    spark_worker: dict[str, Any] = {"handle": pyspark.util.handle_worker_exception}
    exec(compile(source, str(beside / "pyspark" / "sql" / "worker" / "utils.py"), "exec"), spark_worker)
    out = io.BytesIO()
    spark_worker["worker_run"](_Calls().partitions, out)
    text = out.getvalue()[8:].decode()  # after Spark's marker and the length
    ours = os.path.join(beside, ".", "pyspark_pymq", "spark", "spark_errors.py")  # not under pyspark
    assert text.splitlines()[1:] == [
        f'  File "{ours}", line {_raise_line()}, in partitions',
        "    raise error from cause",
        "pyspark_pymq.errors.TopicNotExistError: [TOPIC_NOT_EXIST] topic 'x' does not exist",
    ], text


def _raise_line() -> int:
    lines = Path(spark_errors.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip() == "raise error from cause")


# -- what a user sees in Spark -------------------------------------------------------------------------


def _seen(run: Any) -> str:
    with pytest.raises(Exception) as info:
        run()
    return str(info.value)


def _assert_near_top(text: str, message: str, *, line: int) -> None:
    """pymq's ``message`` on line ``line`` of ``text`` at the latest, and none of pymq's inner frames."""
    lines = text.splitlines()
    at = next((i for i, x in enumerate(lines) if message in x), None)
    assert at is not None, text
    assert at < line, f"pymq's message is on line {at + 1} of:\n{text}"
    assert set(PYMQ_FRAME.findall(text)) == {"spark/spark_errors.py"}, text


@pytest.mark.spark
def test_spark_read_errors_show_pymq_s_message_fourth(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    # an option refused at load(), in Spark's planner process
    text = _seen(lambda: spark.read.format("pymq").option("endpoint", ep).option("topic", "t")
                 .option("pullBatchSize", "0").load())
    _assert_near_top(text, "pymq option pullBatchSize='0' is not valid", line=4)
    assert text.startswith("[PYTHON_DATA_SOURCE_ERROR]") and len(text) < 400
    # a broker's answer when the read is planned
    topic = unique("err-missing")
    text = _seen(lambda: spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
                 .load().collect())
    _assert_near_top(text, f"topic '{topic}' does not exist", line=4)
    assert "in partitions" in text


@pytest.mark.spark
def test_spark_task_errors_show_pymq_s_message_fifth(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic = unique("err-big")
    Admin(ep).create_topic(topic, 1)
    df = spark.range(1).selectExpr("repeat('x', 5000000) AS body")
    text = _seen(lambda: df.write.format("pymq").mode("append").option("endpoint", ep)
                 .option("topic", topic).save())
    _assert_near_top(text, "message body of 5000000 bytes is over maxMessageSize", line=5)
    assert "MessageIllegalError: [MESSAGE_ILLEGAL] sending row 0 of partition " in text
    assert "in write" in text and len(text) < 700


@pytest.mark.spark
def test_spark_stream_errors_show_pymq_s_message_under_spark_s_frames(
        spark: Any, shared_broker: Any, tmp_path: Path) -> None:
    ep = shared_broker.endpoint

    def start(df: Any) -> None:
        q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / unique("chk"))).start()
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    # a batch-only option, refused when the stream starts (pyspark's stream runner adds two frames)
    text = _seen(lambda: start(spark.readStream.format("pymq").option("endpoint", ep).option("topic", "t")
                               .option("consumerGroup", "g").option("endingOffsets", "latest").load()))
    _assert_near_top(text, "pymq option endingOffsets='latest' cannot apply to a stream", line=9)
    assert "direct cause" not in text and "During handling" not in text
    # a sink option, refused when the stream's writer is made
    source = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS body")
    text = _seen(lambda: source.writeStream.format("pymq").option("endpoint", ep).option("topic", "t")
                 .option("sendMode", "bogus")
                 .option("checkpointLocation", str(tmp_path / "chk-sink")).start().processAllAvailable())
    _assert_near_top(text, "pymq sink option sendMode='bogus' is not valid", line=4)


@pytest.mark.spark
def test_an_acl_refusal_in_a_task_s_pull(spark: Any, tmp_path: Path) -> None:
    from broker_process import BrokerProcess

    args = ["--authentication-enabled", "--authorization-enabled", "--init-authentication-user", "root:pw"]
    with BrokerProcess(tmp_path / "auth", args) as proc:
        admin = Admin(proc.endpoint, access_key="root", secret_key="pw")
        admin.create_topic("err-acl", 1)
        admin.create_user("bob", "bob-pw")
        admin.create_acl("User:bob", ["Topic:err-acl"], ["Get"])  # plans the read, may not pull
        from pyspark_pymq import Message, Producer
        with Producer(proc.endpoint, access_key="root", secret_key="pw") as producer:
            producer.send(Message("err-acl", b"x"))
        text = _seen(lambda: spark.read.format("pymq").option("endpoint", proc.endpoint)
                     .option("topic", "err-acl").option("accessKey", "bob").option("secretKey", "bob-pw")
                     .load().collect())
    _assert_near_top(text, "user 'bob' may not Sub on Topic:err-acl", line=5)
    assert AccessDeniedError.__name__ in text and "concurrent/futures" not in text
