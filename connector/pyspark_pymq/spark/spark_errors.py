"""pymq's errors as Spark shows them: the message a few lines down, not under pymq's own frames.

Spark tells a failed data source call by the Python traceback its worker formats (pyspark's
``handle_worker_exception``), inside its own message (``[PYTHON_DATA_SOURCE_ERROR] Failed to ...:``,
``An exception was thrown from the Python worker:``) and, for a stream, above the query's
description. pyspark drops its own frames from that traceback (``simplifiedTraceback``, on by
default), but not pymq's: an option refused five calls down the parser came out as a dozen lines
of pymq's frames with the one line saying what to change last, 1-3 KB into the message.

The methods Spark calls (:class:`~pyspark_pymq.spark.data_source.PymqDataSource`'s, its readers',
stream readers' and writers') are wrapped by :func:`spark_call` and :func:`spark_iterator`. An
error meant for the user, a :class:`~pyspark_pymq.errors.PymqError` or a ``ValueError`` (option
and row checks), leaves them as a copy of itself (same class, message, code and notes) raised
from the wrapper: its traceback is that one frame, named after the method Spark called, so the
message is the fourth line of the worker's traceback. The original, with every frame and its own
cause, is the copy's ``__cause__``: what a local call (a test, a driver-side helper) shows, and
what Spark shows with ``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled=false``.
With simplification on, pyspark drops ``__cause__`` (the chain stays out of the message).

Spark runs a stream reader's driver calls (``initialOffset``, ``latestOffset``, ``partitions``,
``commit``...) in a runner that never simplifies and would print the whole chain: there the
copy is raised ``from None``, the original kept as its ``__context__``, which no traceback
prints. Errors of other classes (a bug) keep every frame, and so does every error with the
environment variable ``PYMQ_FULL_TRACEBACKS=1`` (in the processes Spark starts: set it before the
session, or through ``spark.executorEnv.PYMQ_FULL_TRACEBACKS`` on a cluster).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

from ..errors import PymqError

__all__ = ["USER_ERRORS", "spark_call", "spark_iterator"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# what pymq raises for the user to act on: the broker's refusals and the client's own, option and row checks
USER_ERRORS: tuple[type[Exception], ...] = (PymqError, ValueError)

# the __main__ of the processes in which pyspark formats a failed call without simplifying it whatever the
# configuration (pyspark 4.x sets SPARK_SIMPLIFIED_TRACEBACK for the planner and task workers only)
_UNSIMPLIFIED_RUNNERS = frozenset({
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.worker.python_streaming_sink_runner",
})


def _in_unsimplified_runner() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in _UNSIMPLIFIED_RUNNERS


def _shown(err: Exception) -> tuple[Exception, BaseException | None] | None:
    """The copy of ``err`` to raise and its cause, or None to raise ``err`` as it is."""
    if os.environ.get("PYMQ_FULL_TRACEBACKS") == "1":
        return None
    original = err
    if getattr(err, "_pymq_shown", False) and isinstance(err.__cause__, Exception):
        original = err.__cause__  # a wrapped method called another: one copy, of the first error
    try:
        shown = copy.copy(original)  # class, args and __dict__ (code, remark, __notes__): no frames
    except Exception:
        return None
    if type(shown) is not type(original) or str(shown) != str(original):
        return None  # an exception class whose args do not rebuild it
    shown._pymq_shown = True  # type: ignore[attr-defined]
    return shown, None if _in_unsimplified_runner() else original


# This module's file as its frames name it: its path with a "." after the sys.path entry it was
# imported from (``.../site-packages/./pyspark_pymq/spark/spark_errors.py``). pyspark's simplifier
# (``try_simplify_traceback``) drops every frame whose file starts with pyspark's directory,
# ``.../site-packages/pyspark``, which an installed ``.../site-packages/pyspark_pymq/...`` does too:
# with every frame taken for pyspark's, it simplified nothing and Spark printed the whole chain, the
# original's frames included (~45 lines, the message last). The same file, named so, is not under it
# (a relative name would be, but a directory holding another pyspark_pymq/ would then be read for it).
_FILENAME = os.path.join(str(Path(os.path.abspath(__file__)).parents[2]), ".", *__name__.split(".")[:-1],
                         Path(__file__).name)


def _named(wrapper: Callable[P, R], method: Callable[..., object]) -> Callable[P, R]:
    """``wrapper`` whose frame reads as ``method``'s (``in partitions``, ``in write``): the one frame
    Spark's message shows says which call failed."""
    code = wrapper.__code__
    if sys.version_info >= (3, 11):  # co_qualname: 3.11 on
        code = code.replace(co_qualname=getattr(method, "__qualname__", method.__name__))
    wrapper.__code__ = code.replace(co_name=method.__name__, co_filename=_FILENAME)
    return functools.wraps(method)(wrapper)


def spark_call(method: Callable[P, R]) -> Callable[P, R]:
    """A method Spark calls: a user error leaves it with one frame (see the module's docstring)."""

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except USER_ERRORS as err:
            shown = _shown(err)
            if shown is None:
                raise
            error, cause = shown
            raise error from cause

    return _named(call, method)


def spark_iterator(method: Callable[P, Iterator[T]]) -> Callable[P, Iterator[T]]:
    """:func:`spark_call` for a method that returns an iterator (``read``, run in Spark's tasks):
    errors raised while it is iterated leave it as those of the call."""

    def read(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        try:
            yield from method(*args, **kwargs)
        except USER_ERRORS as err:
            shown = _shown(err)
            if shown is None:
                raise
            error, cause = shown
            raise error from cause

    return _named(read, method)
