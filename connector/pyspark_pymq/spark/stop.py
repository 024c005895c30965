"""``query.stop()`` in the middle of a Python ``foreachBatch``: a stop, not a StackOverflowError.

In classic PySpark (Py4J's pinned threads), ``query.stop()`` interrupts the stream thread while it
runs the micro-batch's Python function: the Spark action that function is in (a write, a count,
a ``localCheckpoint``) fails with ``java.lang.InterruptedException`` (or its job is cancelled),
and Python gets a ``Py4JJavaError`` whose text carries the whole Java stack trace. The function's
traceback goes back to the JVM as the message of a ``py4j.Py4JException``, and Spark tells the
stop from a failure with a regular expression over that message (``StreamExecution.PROXY_ERROR``
since SPARK-48717; Spark 4.2.0 has it)::

    py4j.protocol.Py4JJavaError: An error occurred while calling((.|\\r\\n|\\r|\\n)*)(java...)

(``java...``: ``java.lang.InterruptedException`` and two more)

Java's regex engine recurses once per character of ``(.|...)*``: past ~1,450 characters after
"An error occurred while calling" (JDK 17, a fresh thread's 1 MB stack; the stack trace of an
interrupted Delta write is 10-25 KB) the stream thread dies with a ``java.lang.StackOverflowError``,
~1,000 lines of ``java.util.regex.Pattern`` frames on the driver's stderr. The stop itself completes
(the query is not active, ``exception()`` is None), but its status is not "Stopped" and the log looks
like a crash.

:func:`stoppable` wraps a ``foreachBatch`` function so that such an interruption is raised again as
a :class:`BatchInterrupted` whose message is the Py4J error without its Java stack trace: short,
and still what Spark recognises as the stop. Anything else propagates unchanged.
:meth:`~pyspark_pymq.spark.listener.MessageListener.process` does the same for its own Spark jobs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["BatchInterrupted", "stoppable"]

log = logging.getLogger(__name__)

#: What Spark's ``StreamExecution.isInterruptionException`` takes for an interruption by a stop.
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")
#: Spark's prefix of a Py4J error in Python (py4j.protocol.Py4JJavaError's), which its regex looks for.
PY4J_ERROR = "py4j.protocol.Py4JJavaError"
_MAX_LINE = 200  # of each exception's first line
_MAX_CAUSES = 4
# the whole message: Spark's regex overflowed a fresh thread's default stack past ~1,450 characters
# after "calling" (JDK 17), less on the stream thread's; the interruption's line comes first
_MAX_MESSAGE = 800

F = TypeVar("F", bound=Callable[..., Any])


class BatchInterrupted(RuntimeError):
    """A micro-batch's Spark action interrupted by ``query.stop()``: the Py4J error, without its
    Java stack trace (``java_stack_trace`` keeps it)."""

    def __init__(self, message: str, java_stack_trace: str = "") -> None:
        super().__init__(message)
        self.java_stack_trace = java_stack_trace


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:_MAX_LINE] if text.strip() else ""


def short_interruption(error: BaseException) -> str | None:
    """The short message of ``error`` if it is a Py4J error of an interrupted or cancelled Spark
    action (one ``query.stop()`` makes), else None.

    Py4J's first line ("An error occurred while calling o123.save.") and the first line of each
    Java exception of the cause chain: Spark's regex finds the interruption's class name there, and
    its test for a cancelled job group ("org.apache.spark.SparkException", "cancelled" and the
    query's runId) finds those.
    """
    try:
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - pyspark depends on py4j
        return None
    if not isinstance(error, Py4JJavaError):
        return None
    try:
        java = error.java_exception
        lines: list[str] = []
        interrupted = False
        while java is not None and len(lines) < _MAX_CAUSES:
            name = str(java.getClass().getName())
            line = _first_line(str(java.toString()))
            this = name in INTERRUPTIONS or (name.startswith("org.apache.spark.") and "cancelled" in line)
            if this:  # first: what Spark's regex must find within the message's first characters
                lines.insert(0 if not interrupted else 1, line)
            else:
                lines.append(line)
            interrupted = interrupted or this
            java = java.getCause()
    except Exception:  # the JVM is going away: leave the error as it is
        return None
    if not interrupted:
        return None
    call = _first_line(getattr(error, "errmsg", "") or "An error occurred while calling a Spark action.")
    return (f"{PY4J_ERROR}: {call}\n" + "\n".join(f": {line}" for line in lines))[:_MAX_MESSAGE]


@contextlib.contextmanager
def interruptions_kept_short() -> Iterator[None]:
    """Raise a Py4J error of an interrupted Spark action as a :class:`BatchInterrupted` (short)."""
    try:
        yield
    except Exception as e:
        message = short_interruption(e)
        if message is None:
            raise
        trace = ""
        with contextlib.suppress(Exception):
            trace = str(e)
        log.debug("a Spark action was interrupted (the query is stopping): %s", trace)
        raise BatchInterrupted(message, trace) from None  # from None: the traceback stays short


def stoppable(func: F) -> F:
    """Wrap a ``foreachBatch`` function: ``query.stop()`` mid-batch stops the query quietly.

    Without it, a stop that interrupts a Spark action of the function (in classic PySpark) kills
    Spark's stream thread with a ``StackOverflowError`` in Spark's own test for an interruption
    (see this module). Other errors of the function propagate unchanged::

        query = df.writeStream.foreachBatch(stoppable(each_batch)).start()
    """

    if not callable(func):  # else the first micro-batch fails, far from the mistake
        raise TypeError(f"stoppable wraps a foreachBatch function f(df, batch_id), got {func!r}")

    @functools.wraps(func)
    def each_batch(*args: Any, **kwargs: Any) -> Any:
        with interruptions_kept_short():
            return func(*args, **kwargs)

    return each_batch  # type: ignore[return-value]
