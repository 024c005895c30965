"""The exactly-once sink (``deliveryGuarantee=exactly-once``): each micro-batch is committed once.

It is built on RocketMQ's transactional messages:

1. Every task sends its rows as **half messages** (stored, invisible to
   consumers), tagged ``PYMQ_SINK_TXN=<queryId>:<batchId>:<transaction>``, where
   ``<transaction>`` is random per task attempt and a row's msgId is
   ``<transaction><row index as 16 hex digits>``.
2. The driver's ``commit(N)`` first writes the **commit marker**
   ``<checkpointLocation>/pymq/commits/N``: the transactions of the tasks that
   succeeded. That file is the decision. Then it commits those half messages
   (EndTransactionBatch COMMIT_MESSAGE); Spark records batch N in its own
   checkpoint only after that.
3. ``abort(N)`` rolls back the half messages of the tasks it is told about.

After a crash, Spark runs batch N again. Its ``commit(N)`` finds marker N when
an earlier run had decided: that run's transactions are committed (again:
ending a transaction twice is harmless) and this run's are rolled back.
Half messages nobody ended (a failed task attempt, a driver killed before the
marker) are **checked back** by the broker; the driver answers from the markers:
in marker N → COMMIT_MESSAGE; marker N exists without it, or a later batch is
committed → ROLLBACK_MESSAGE; otherwise UNKNOW (the batch is still running or
waits for the restart; the broker asks again after transactionCheckInterval).

Limits: the checkpoint must be a path the driver can write (local or mounted);
rows cannot be delayed. A half message is given up to TRANS_CHECK_MAX_TIME_TOPIC
once the broker has checked it back transactionCheckMax times (every
transactionCheckInterval after transactionTimeOut: about 15 min by default), so
a micro-batch must commit, and a crashed query restart, within that window.
``commit(N)`` refuses to write the marker of a batch whose first rows were sent
about ``transactionTimeOut + transactionCheckMax * transactionCheckInterval`` ago
or longer (the broker's runtime info): some of its rows may be
gone, so it fails the query rather than commit part of the batch (raise the
broker's transactionCheckMax, or make batches shorter with maxMessagesPerTrigger
before the batch is planned).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pymq_proto.record import MessageConst as MC
from pymq_proto.record import encode_properties
from pymq_proto.topics import TRANS_CHECK_MAX_TIME_TOPIC
from pyspark.sql.datasource import WriterCommitMessage

from ..client.admin import Admin
from ..client.message import MessageExt, RowKeys
from ..client.transaction import HalfMessageProducer, LocalTransactionState, TransactionProducer
from ..errors import PymqError
from .sink_options import SinkOptions
from .spark_errors import spark_call
from .writer import PymqStreamSinkWriter, SinkCommitMessage, _send_rows, _summary, _task_ids

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SinkCommitLog", "SinkCommitMarker", "TransactionalStreamSinkWriter", "answer_check"]

log = logging.getLogger(__name__)

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
MARKERS_TO_RETAIN = 100  # like spark.sql.streaming.minBatchesToRetain
CRASH_AT_ENV = "PYMQ_SINK_CRASH_AT"


def msg_ids(transaction: str, rows: int) -> RowKeys:
    """The msgIds of a task's half messages (its rows, keyed under its transaction)."""
    return RowKeys(transaction, 0, rows)


@dataclass(frozen=True)
class SinkCommitMarker:
    """The decision for one micro-batch: these tasks' rows are its output."""

    query_id: str
    batch_id: int
    transactions: tuple[tuple[str, int], ...]  # (transaction, rows)


class SinkCommitLog:
    """``<checkpointLocation>/pymq/commits/<batchId>``: one JSON marker per committed batch."""

    def __init__(self, checkpoint_location: str) -> None:
        self.path = Path(checkpoint_location) / "pymq" / "commits"

    def get(self, batch_id: int) -> SinkCommitMarker | None:
        try:
            data = json.loads((self.path / str(batch_id)).read_text())
        except FileNotFoundError:
            return None
        return SinkCommitMarker(data["queryId"], int(data["batchId"]),
                                tuple((str(t), int(n)) for t, n in data["transactions"]))

    def add(self, marker: SinkCommitMarker) -> None:
        """Write atomically and durably: a marker is there whole, or not at all."""
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / str(marker.batch_id)
        tmp = self.path / f".{marker.batch_id}.{uuid.uuid4().hex}.tmp"
        data = {"version": 1, "queryId": marker.query_id, "batchId": marker.batch_id,
                "transactions": [list(t) for t in marker.transactions]}
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def latest(self) -> int | None:
        batches = self._batches()
        return max(batches) if batches else None

    def remove(self, batch_id: int) -> None:
        """Withdraw a batch's decision (its rows were given up before any was committed)."""
        (self.path / str(batch_id)).unlink(missing_ok=True)
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def purge(self, before: int) -> None:
        for b in self._batches():
            if b < before:
                (self.path / str(b)).unlink(missing_ok=True)

    def _batches(self) -> list[int]:
        if not self.path.is_dir():
            return []
        return [int(p.name) for p in self.path.iterdir() if p.name.isdecimal()]


def answer_check(commit_log: SinkCommitLog, msg: MessageExt) -> LocalTransactionState:
    """The check-back answer for one half message of the exactly-once sink."""
    tag = msg.properties.get(MC.PROPERTY_SINK_TRANSACTION, "")
    parts = tag.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdecimal():
        log.warning("half message %s has no valid %s (%r): cannot tell", msg.msg_id,
                    MC.PROPERTY_SINK_TRANSACTION, tag)
        return UNKNOW
    query_id, batch, transaction = parts[0], int(parts[1]), parts[2]
    marker = commit_log.get(batch)
    if marker is not None and marker.query_id == query_id:
        return COMMIT if any(t == transaction for t, _n in marker.transactions) else ROLLBACK
    latest = commit_log.latest()
    if marker is None and latest is not None and latest > batch:
        newer = commit_log.get(latest)
        if newer is not None and newer.query_id == query_id:
            return ROLLBACK  # batches commit in order: this one was decided without it
    return UNKNOW


_LISTENERS: dict[tuple[str, str, str], TransactionProducer] = {}
_LISTENERS_LOCK = threading.Lock()


def check_listener(opts: SinkOptions) -> TransactionProducer:
    """The driver's TransactionProducer of this query: answers check-backs from the markers.

    One per process and query; it lives as long as the (reused) Python worker
    that runs the sink's commits, so the broker can reach the query between
    micro-batches too.
    """
    assert opts.checkpoint_location is not None
    key = (opts.endpoint, opts.producer_group, opts.checkpoint_location)
    with _LISTENERS_LOCK:
        producer = _LISTENERS.get(key)
        if producer is None:
            commit_log = SinkCommitLog(opts.checkpoint_location)
            producer = TransactionProducer(opts.endpoint, opts.producer_group,
                                           lambda msg: answer_check(commit_log, msg),
                                           send_msg_timeout_ms=max(opts.send_msg_timeout_ms, 10_000),
                                           access_key=opts.backend.access_key,
                                           secret_key=opts.backend.secret_key, tls=opts.backend.tls)
            _LISTENERS[key] = producer
        return producer


def crash_point(stage: str, batch_id: object) -> None:
    """kill -9 of the whole driver at one stage of a batch, for the crash tests.

    ``PYMQ_SINK_CRASH_AT=<stage>@<batchId>``; stages: mid-write (in a task, after
    its first half messages), before-marker, after-marker, mid-commit,
    after-commit. The tests start the driver as a session leader: the session's
    process group is the driver and its JVM; Spark's Python workers have their own.
    """
    if os.environ.get(CRASH_AT_ENV) == f"{stage}@{batch_id}":
        log.error("%s=%s: killing the driver", CRASH_AT_ENV, os.environ[CRASH_AT_ENV])
        os.killpg(os.getsid(0), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)


class _SinkHalfProducer(HalfMessageProducer):
    def __init__(self, *args: Any, batch_id: str, first_sent: list[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_id = batch_id
        self.first_sent = first_sent  # the time of the task's first send, once it sent

    def _send_prepared(self, *args: Any, **kwargs: Any) -> list[Any]:
        # every send path (per-row and whole Arrow batches) ends here
        if not self.first_sent:
            self.first_sent.append(int(time.time() * 1000))
        results = super()._send_prepared(*args, **kwargs)
        crash_point("mid-write", self.batch_id)
        return results


class TransactionalStreamSinkWriter(PymqStreamSinkWriter):
    """``writeStream.format("pymq").option("deliveryGuarantee", "exactly-once")``.

    Rows become visible to consumers only when their micro-batch commits, and
    once: see the module's documentation for how.
    """

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)
        # Spark builds the writer on the driver (at query start, and for each
        # commit): answer check-backs from then on, so that a restarted query
        # resolves what a killed run left before its own first commit.
        check_listener(options)

    @spark_call
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        opts = self.options
        ids = _task_ids(opts)
        transaction = uuid.uuid4().hex[:16].upper()
        tag = f"{ids.query_id}:{ids.batch_id}:{transaction}"
        extra = encode_properties({
            MC.PROPERTY_TRANSACTION_PREPARED: "true",
            MC.PROPERTY_PRODUCER_GROUP: opts.producer_group,
            MC.PROPERTY_SINK_TRANSACTION: tag,
        })
        first_sent: list[int] = []
        new_producer = functools.partial(_SinkHalfProducer, batch_id=ids.batch_id, first_sent=first_sent)
        sent = _send_rows(opts, iterator, ids, new_producer=new_producer, prefix=transaction,
                          extra_properties=extra)
        return replace(sent, transaction=transaction, query_id=ids.query_id,
                       first_sent_ms=first_sent[0] if first_sent else 0)

    @spark_call
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts = self.options
        assert opts.checkpoint_location is not None
        producer = check_listener(opts)
        ours = _transactions(messages)
        commit_log = SinkCommitLog(opts.checkpoint_location)
        crash_point("before-marker", batchId)
        marker = _own_marker(commit_log, batchId, messages)
        if marker is None:
            if not ours:
                log.info("pymq exactly-once sink batch %d: no rows", batchId)
                return
            query_id = next(m.query_id for m in messages if isinstance(m, SinkCommitMessage))
            _check_window(opts, messages, batchId)
            marker = SinkCommitMarker(query_id, batchId, ours)
            commit_log.add(marker)
            crash_point("after-marker", batchId)
        earlier = set(marker.transactions) != set(ours)
        if earlier:
            # An earlier run decided this batch before it died: its rows are the output.
            log.warning("pymq exactly-once sink batch %d was committed by an earlier run; "
                        "rolling back this run's %d row(s)", batchId, sum(n for _t, n in ours))
        short = {}  # transactions with rows no longer pending (committed before, or given up): ended now
        for i, tx in enumerate(marker.transactions):
            if (ended := _end(producer, (tx,), COMMIT)) < tx[1]:
                short[tx] = ended
            if i == 0:
                crash_point("mid-commit", batchId)
        if short:
            _check_not_given_up(opts, commit_log, marker, short)
        if earlier:
            _end(producer, ours, ROLLBACK)
        crash_point("after-commit", batchId)
        commit_log.purge(batchId - MARKERS_TO_RETAIN)
        log.info("pymq exactly-once sink batch %d committed: %s", batchId, _summary(messages))

    @spark_call
    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Spark also aborts when commit() raised after writing the marker (an END_TRANSACTION
        # that timed out, say): the marker decided those transactions, so they stay pending
        # for the next run's commit() or the broker's check-back to commit. Rolling them back
        # here would lose the batch: the next run finds the marker and keeps its rows, not its own.
        opts = self.options
        assert opts.checkpoint_location is not None
        commit_log = SinkCommitLog(opts.checkpoint_location)
        marker = commit_log.get(batchId)
        if marker is not None and marker.query_id != _query_id(messages, marker.query_id):
            marker = None  # another query's (see _own_marker): it decided nothing of this one
        decided = set(marker.transactions) if marker is not None else set()
        ours = tuple(t for t in _transactions(messages) if t not in decided)
        if ours:
            _end(check_listener(opts), ours, ROLLBACK)
        if decided:
            log.warning("pymq exactly-once sink batch %d aborted after its commit marker: its %d row(s) "
                        "are committed by the next run or the broker's check-back; rolled back %d other "
                        "row(s)", batchId, sum(n for _t, n in decided), sum(n for _t, n in ours))
            return
        log.warning("pymq exactly-once sink batch %d aborted (rolled back): %s", batchId, _summary(messages))


def _query_id(messages: Sequence[WriterCommitMessage | None], default: str) -> str:
    """The streaming query that wrote ``messages`` (``default`` when no task sent a message)."""
    return next((m.query_id for m in messages if isinstance(m, SinkCommitMessage) and m.query_id), default)


def _own_marker(commit_log: SinkCommitLog, batch_id: int,
                messages: Sequence[WriterCommitMessage | None]) -> SinkCommitMarker | None:
    """Marker ``batch_id``, when this query wrote it; fails on another query's marker.

    The markers live under ``<checkpointLocation>/pymq``, next to Spark's checkpoint but not in
    it: when Spark's own files are removed or replaced (a query reset to run from the start)
    and ``pymq/`` stays, a new query (a new id) finds the markers of the old one at its batch
    ids. Following them would commit the old query's transactions (ended long ago) and roll
    this batch's rows back, every batch up to the old query's last, while Spark records them as
    written: the rows would be lost without a word.
    """
    marker = commit_log.get(batch_id)
    query_id = _query_id(messages, "")
    if marker is None or not query_id or marker.query_id == query_id:
        return marker
    raise PymqError(
        f"pymq exactly-once sink batch {batch_id}: the commit marker {commit_log.path / str(batch_id)} "
        f"is of another streaming query (id {marker.query_id}; this query's id is {query_id}): "
        f"{commit_log.path.parent} holds the markers of an earlier query whose Spark checkpoint was "
        "removed or replaced. Following them would roll back this batch's rows, so nothing is "
        f"committed (the batch is rolled back). Remove {commit_log.path.parent} (the earlier query's "
        "markers; its batches are long decided) and restart the query, or give it a new checkpointLocation"
    )


def _check_window(opts: SinkOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
    """Refuse to decide a batch whose oldest half messages the broker may have given up already.

    Each check-back the driver answers UNKNOW (the batch still runs) counts towards the
    broker's transactionCheckMax; past it the half message goes to TRANS_CHECK_MAX_TIME_TOPIC
    and the marker would name rows that never come.
    """
    sent = [m.first_sent_ms for m in messages
            if isinstance(m, SinkCommitMessage) and m.transaction and m.rows and m.first_sent_ms]
    if not sent:
        return
    try:
        admin = Admin(opts.endpoint, access_key=opts.backend.access_key,  # channels are shared
                      secret_key=opts.backend.secret_key, tls=opts.backend.tls)
        info = admin.broker_info()
        timeout, interval = int(info["transactionTimeOut"]), int(info["transactionCheckInterval"])
        # given up at the check that finds transactionCheckMax checks done: timeout + max x interval
        # after the send at the earliest; half the shorter period to spare (clocks, the check's tick)
        checks = max(0, int(info["transactionCheckMax"]))
        window_ms = timeout + checks * interval - min(timeout, interval) // 2
    except (PymqError, KeyError, ValueError) as err:  # no runtime info (an ACL, an older broker)
        log.warning("pymq exactly-once sink batch %d: cannot read the broker's transaction check "
                    "settings (%s); not checking how long the batch ran", batch_id, err)
        return
    age_ms = int(time.time() * 1000) - min(sent)
    if age_ms >= window_ms:
        raise PymqError(
            f"pymq exactly-once sink batch {batch_id} ran {age_ms / 1000:.0f} s, longer than the broker "
            f"gives an undecided half message (about {window_ms / 1000:.0f} s: transactionTimeOut + "
            "transactionCheckMax x transactionCheckInterval): some of its rows may have been "
            "given up to TRANS_CHECK_MAX_TIME_TOPIC, so the batch is not committed (it is rolled back and "
            "runs again when the query restarts). Raise the broker's --transaction-check-max (or "
            "--transaction-check-interval) so a batch fits, or plan smaller batches with "
            "maxMessagesPerTrigger"
        )


def _check_not_given_up(opts: SinkOptions, commit_log: SinkCommitLog, marker: SinkCommitMarker,
                        short: dict[tuple[str, int], int]) -> None:
    """Fail the commit of ``marker``'s batch when the broker gave up rows it decided.

    ``short``: its transactions whose rows were not all pending any more, with how many of their
    rows the commit just now ended. Usually an earlier run committed them before it died; but a
    driver that stays down longer than transactionTimeOut + transactionCheckMax x
    transactionCheckInterval after writing a marker answers no check-back, and the broker gives
    the halves up to TRANS_CHECK_MAX_TIME_TOPIC: committing nothing and recording the batch would
    lose its rows without a word. A transaction whose first msgId is there was given up. When
    every transaction of the marker was given up and none of its rows ended now, no row of the
    batch is in the topic: the marker is withdrawn, so that the restarted query runs the batch
    again and commits it once. Otherwise (some rows committed) the commit fails naming them.
    """
    try:
        admin = Admin(opts.endpoint, access_key=opts.backend.access_key,
                      secret_key=opts.backend.secret_key, tls=opts.backend.tls)
        given_up = [(t, n) for t, n in short if _given_up(admin, next(iter(msg_ids(t, n))))]
    except PymqError as err:  # cannot be told (an ACL without Get on the system topic)
        log.warning("pymq exactly-once sink batch %d: %d transaction(s) of its marker were not pending; "
                    "cannot look whether the broker gave them up to %s (%s)", marker.batch_id, len(short),
                    TRANS_CHECK_MAX_TIME_TOPIC, err)
        return
    if not given_up:
        return
    rows = sum(n for _t, n in given_up)
    why = (f"the broker gave up {rows} row(s) of pymq exactly-once sink batch {marker.batch_id} "
           f"({len(given_up)} task(s)) to {TRANS_CHECK_MAX_TIME_TOPIC} before they were committed: "
           "the query was down, after deciding the batch, longer than the broker keeps an undecided "
           "half message (transactionTimeOut + transactionCheckMax x transactionCheckInterval)")
    if set(given_up) == set(marker.transactions) and not any(short.values()):
        commit_log.remove(marker.batch_id)
        raise PymqError(f"{why}. None of the batch's rows is in the topic: its commit marker is withdrawn; "
                        "restart the query and the batch runs again and commits its rows once")
    first = ", ".join(next(iter(msg_ids(t, n))) for t, n in given_up)
    raise PymqError(
        f"{why}, and its other rows are committed: the batch cannot be completed exactly once. The "
        f"given-up rows are in {TRANS_CHECK_MAX_TIME_TOPIC} (msgIds from {first}): re-send them, then "
        f"write {commit_log.path / str(marker.batch_id)} with only the transactions committed and "
        "restart the query; raise the broker's --transaction-check-max so a restart fits"
    )


def _given_up(admin: Admin, msg_id: str) -> bool:
    """Whether the broker put ``msg_id``'s half message into TRANS_CHECK_MAX_TIME_TOPIC."""
    try:
        admin.view_message(msg_id, TRANS_CHECK_MAX_TIME_TOPIC)
    except PymqError as err:
        if err.code in ("QUERY_NOT_FOUND", "TOPIC_NOT_EXIST"):  # none there, or nothing given up ever
            return False
        raise
    return True


def _transactions(messages: Sequence[WriterCommitMessage | None]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((m.transaction, m.rows) for m in messages
                        if isinstance(m, SinkCommitMessage) and m.transaction and m.rows))


def _end(producer: TransactionProducer, transactions: Sequence[tuple[str, int]],
         state: LocalTransactionState) -> int:
    """How many of the transactions' rows were pending (and are ended now)."""
    return producer.end_transactions([m for t, n in transactions for m in msg_ids(t, n)], state)
