"""query.stop() in the middle of a foreachBatch's Spark job: the query stops, Spark's stream thread
does not die of a StackOverflowError (pyspark_pymq.spark.stop).

Spark tells a stop from a failure of the batch's Python function with a regular expression over the
function's traceback (StreamExecution.PROXY_ERROR); on the Java stack trace an interrupted job's
Py4J error carries, the regex overflows the thread's stack. The stream thread dies in that test,
before it records the stop: its status message is not "Stopped" (and ~1,000 lines of regex frames
go to the driver's stderr). A stop it recognises leaves "Stopped".
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Admin, Message, MessageExt, Producer
from pyspark_pymq.spark.listener import ConsumeConcurrentlyStatus, MessageListener
from pyspark_pymq.spark.stop import BatchInterrupted, short_interruption, stoppable


def _stop_and_check(query: Any) -> None:
    query.stop()
    assert not query.isActive
    assert query.exception() is None
    assert query.status["message"] == "Stopped", (
        f"Spark did not take the interruption for the stop (status {query.status}): its stream "
        "thread died in StreamExecution.isInterruptionException (StackOverflowError in the regex)")


def test_stop_during_a_spark_job_of_a_stoppable_foreach_batch_stops_the_query(
    spark: Any, tmp_path: Path
) -> None:
    in_job = threading.Event()
    raised: list[BaseException] = []

    def each_batch(df: Any, batch_id: int) -> None:
        in_job.set()
        try:  # minutes of work on both cores, until the stop cancels it (sum(id): a long overflows)
            df.sparkSession.range(0, 10**13, numPartitions=2).selectExpr("sum(id % 2)").collect()
        except BaseException as e:
            raised.append(e)
            raise

    query = (spark.readStream.format("rate").load().writeStream
             .foreachBatch(stoppable(each_batch))
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        assert in_job.wait(120), "no micro-batch started"
        time.sleep(1.0)  # the job is running
    finally:
        _stop_and_check(query)
    # What made the traceback too long for Spark's regex: the Py4J error of the interrupted job.
    assert raised and short_interruption(raised[0]) is not None
    assert len(str(raised[0])) > 3000


def test_stop_during_the_listener_s_job_stops_the_query(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """MessageListener.process keeps its own interrupted jobs' errors short: no stoppable needed."""
    ep = shared_broker.endpoint
    topic, group = unique("stop"), unique("stop-g")
    Admin(ep).create_topic(topic, queues=1)
    Producer(ep).send_batch([Message(topic, str(i)) for i in range(20)])
    started = tmp_path / "listener-started"

    def handle(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:  # on an executor
        started.touch()
        time.sleep(0.5)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    listener = MessageListener(ep, group, handle)
    raised: list[BaseException] = []

    def each_batch(df: Any, batch_id: int) -> None:
        try:
            listener.process(df, batch_id).count()
        except BaseException as e:
            raised.append(e)
            raise

    query = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert time.monotonic() < deadline and query.isActive, f"no listener call: {query.exception()}"
            time.sleep(0.1)
    finally:
        _stop_and_check(query)
    assert raised and isinstance(raised[0], BatchInterrupted), raised
    assert len(str(raised[0])) < 1000 and "java.lang.InterruptedException" in str(raised[0])


class _Java:
    """A Java exception as Py4J shows one: its class name, toString and cause."""

    def __init__(self, name: str, text: str, cause: _Java | None = None) -> None:
        self.name, self.text, self.cause = name, text, cause

    def getClass(self) -> Any:
        return type("Class", (), {"getName": lambda _: self.name})()

    def toString(self) -> str:
        return self.text

    def getCause(self) -> _Java | None:
        return self.cause


def test_the_short_message_stays_short_with_the_interruption_first() -> None:
    """Spark's regex overflows a thread's stack past ~1,450 characters after "calling" (JDK 17): one
    long first line of a Spark exception (a stage failure's text) would bring the overflow back."""
    from py4j.protocol import Py4JJavaError

    aborted = "org.apache.spark.SparkException: Job aborted " + "x" * 5000
    chain = _Java("org.apache.spark.SparkException", aborted,
                  _Java("java.lang.RuntimeException", "java.lang.RuntimeException: " + "y" * 5000,
                        _Java("java.lang.InterruptedException", "java.lang.InterruptedException")))
    error = Py4JJavaError.__new__(Py4JJavaError)
    error.java_exception, error.errmsg = chain, "An error occurred while calling o42.save.\n" + "z" * 5000
    message = short_interruption(error)
    assert message is not None and len(message) <= 800
    assert message.splitlines()[1] == ": java.lang.InterruptedException"
    assert message.startswith("py4j.protocol.Py4JJavaError: An error occurred while calling o42.save.")


def test_stoppable_refuses_what_is_not_a_function() -> None:
    with pytest.raises(TypeError, match=r"a foreachBatch function f\(df, batch_id\), got None"):
        stoppable(None)  # type: ignore[type-var]
