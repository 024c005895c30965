"""pymq -> Delta Lake, exactly once: a streaming query with retries and dead letters.

    python examples/delta_pipeline.py --endpoint 127.0.0.1:8081 --topic orders \\
        --group billing --table /tmp/orders_delta --checkpoint /tmp/orders_ckpt

Reads ``orders`` (and ``%RETRY%billing``) with ``format("pymq")``; in
``foreachBatch`` a RocketMQ-style :class:`MessageListener` "charges" each
order: a failure goes back to ``%RETRY%billing`` and comes back later, after
``--max-reconsume`` retries it goes to ``%DLQ%billing``; the orders charged go
to a Delta table. Each order lands in the table exactly once, whatever crashes:

- the write of micro-batch N is an append with ``txnAppId``/``txnVersion`` =
  (the streaming query's id, N): when Spark replays batch N after a crash, Delta
  sees that version of this query already committed and skips the write (the
  query id lives in the checkpoint: a new checkpoint is a new query, whose
  batch 0 is not mistaken for the old one's);
- a replayed batch also runs the listener again, and its failures are sent back
  again (the listener is at-least-once), so a message may come back from
  %RETRY% twice: the rows are de-duplicated by ``msg_id`` (a retried message
  keeps its msgId) against the table before the append; first deliveries
  cannot repeat (their offsets are exactly-once through the checkpoint), so
  only retried rows are looked up.

Delta comes from ``pip install delta-spark`` (Python) plus its jars, which
Spark resolves through ``spark.jars.packages`` on the first run with the
project's own Ivy settings (``examples/ivysettings.xml``: Maven Central only)
into the project's cache (``.venv/ivy``), then starts offline: nothing in
``~/.m2`` or ``~/.ivy2*`` is read or written (a POM without its jar in
``~/.m2``, which any ``mvn`` build can leave, made Spark's default resolution
fail). ``PYMQ_IVY_SETTINGS`` / ``PYMQ_IVY_CACHE`` / ``PYMQ_DELTA_PACKAGE``
override the settings file, the cache and the coordinates.

Without ``--expect-good`` the query runs until Ctrl-C or SIGTERM. With it, the
pipeline stops once the table holds that many orders and the DLQ
``--expect-dead`` messages. ``examples/demo_pipeline.py`` runs all of it on an
embedded broker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# A fresh clone needs no install: the driver and Spark's Python workers import
# pymq from the repository, and workers run this interpreter.
_EXAMPLES = Path(__file__).resolve().parent
_ROOT = _EXAMPLES.parent
_PATHS = [str(_ROOT / d) for d in ("connector", "broker_stub", "proto") if (_ROOT / d).is_dir()]
_PATHS.append(str(_EXAMPLES))  # workers unpickle the listener of this module by reference
for _p in reversed(_PATHS):
    if _p not in sys.path:
        sys.path.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(
    _PATHS + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in _PATHS]
)
os.environ["PYSPARK_PYTHON"] = sys.executable

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

from pyspark_pymq import Admin, MessageExt  # noqa: E402
from pyspark_pymq.spark.listener import ConsumeConcurrentlyStatus, MessageListener  # noqa: E402
from pyspark_pymq.spark.progress import commit_group_progress  # noqa: E402
from pyspark_pymq.spark.stop import stoppable  # noqa: E402

#: The Delta jars for Spark 4.2 (Scala 2.13). Maven Central has no 4.4.1 jars
#: for the delta-spark 4.4.1 Python package (the newest, 4.4.0, is built for
#: Spark 4.2.0), so ``configure_spark_with_delta_pip``, which asks for the
#: Python package's version, cannot be used.
DELTA_PACKAGE = os.environ.get("PYMQ_DELTA_PACKAGE", "io.delta:delta-spark_4.2_2.13:4.4.0")

#: Where Spark's Ivy resolves them from (Maven Central only) and caches them: the
#: project's own, never ``~/.m2`` or ``~/.ivy2*`` (see :func:`delta_jars_conf`).
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
IVY_SETTINGS = _EXAMPLES / "ivysettings.xml"
IVY_CACHE = _ROOT / ".venv" / "ivy"

#: The order in a message's body (JSON); the table adds where the message came from.
ORDER_DDL = "order_id bigint, customer string, amount double"


def log(text: str) -> None:
    print(f"pipeline: {text}", flush=True)


def order_json(i: int, *, poison: bool = False, flaky: bool = False) -> str:
    """An order message: ``poison`` has an invalid amount (always fails), ``flaky``
    fails on its first delivery (a payment service time-out, simulated)."""
    amount = -1.0 if poison else round(5 + (i * 7919) % 9500 / 100, 2)
    return json.dumps({"order_id": i, "customer": f"customer-{i % 17}", "amount": amount,
                       "flaky": flaky})


def charge(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
    """The business logic, a RocketMQ listener: run on Spark's executors.

    An exception (or RECONSUME_LATER) sends the message back to %RETRY%<group>.
    """
    for m in msgs:
        order = json.loads(m.body)
        if order["amount"] <= 0:
            raise ValueError(f"order {order['order_id']}: invalid amount {order['amount']}")
        if order.get("flaky") and m.reconsume_times == 0:
            raise TimeoutError(f"order {order['order_id']}: payment service timed out")
    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def delta_jars_conf() -> dict[str, str]:
    """The Spark settings that fetch the Delta jars: the project's Ivy settings and cache only.

    Spark's own chain looks in ``~/.m2/repository`` first, and a POM there without its
    jar (which any ``mvn`` build can leave) fails the whole resolution; its cache is
    ``~/.ivy2*``. Here nothing in the user's home is read or written: Maven Central only
    (``examples/ivysettings.xml``, or ``$PYMQ_IVY_SETTINGS``), cached in ``.venv/ivy``
    (or ``$PYMQ_IVY_CACHE``); once there, Spark starts offline.
    """
    return {
        "spark.jars.packages": DELTA_PACKAGE,
        "spark.jars.ivySettings": str(Path(os.environ.get("PYMQ_IVY_SETTINGS") or IVY_SETTINGS).resolve()),
        "spark.jars.ivy": str(Path(os.environ.get("PYMQ_IVY_CACHE") or IVY_CACHE).resolve()),
    }


class DeltaJarsError(RuntimeError):
    """Spark's JVM exited while starting, most often because the Delta jars could not be resolved."""


def delta_spark_session(app_name: str = "pymq-delta-pipeline", spark_log: Path | None = None) -> Any:
    """A local[2] SparkSession with Delta Lake (jars from Maven Central, see :func:`delta_jars_conf`).

    With ``spark_log``, the JVM's own output (the jar resolution report, Spark's
    log) goes to that file instead of the terminal. If the JVM exits while starting,
    :class:`DeltaJarsError` says what failed (from that report) and what to do.
    """
    conf = delta_jars_conf()
    saved, offset = None, 0
    if spark_log is not None:  # the JVM inherits file descriptor 2 when it starts
        spark_log.parent.mkdir(parents=True, exist_ok=True)
        sys.stderr.flush()
        saved = os.dup(2)
        with open(spark_log, "ab") as f:
            offset = f.tell()
            os.dup2(f.fileno(), 2)
    try:
        spark = _build_session(app_name, conf)
    except Exception as e:
        if "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        raise DeltaJarsError(_start_failure(conf, spark_log, offset)) from e
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _start_failure(conf: dict[str, str], spark_log: Path | None, offset: int) -> str:
    """What to tell the user when Spark's JVM exited before the session existed."""
    settings, cache = conf["spark.jars.ivySettings"], conf["spark.jars.ivy"]
    what = f"{conf['spark.jars.packages']} into {cache} with {settings}"
    remedy = (
        f"check network access to {MAVEN_CENTRAL} (or to the repository {settings} names), or set "
        f"PYMQ_IVY_SETTINGS to an Ivy settings file for your mirror (a copy of {IVY_SETTINGS}) or "
        f"PYMQ_DELTA_PACKAGE to other coordinates; if the cache is damaged, delete {cache}"
    )
    if spark_log is None:  # its report went to the terminal
        return (f"Spark's JVM exited while starting (see its output above); if it could not "
                f"resolve {what}: {remedy}")
    with open(spark_log, "rb") as f:  # this start's part of the log
        f.seek(offset)
        lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines()]
    if not any("MavenUtils" in line or "Ivy settings file" in line for line in lines):
        tail = "\n  ".join(lines[-15:])
        return f"Spark's JVM exited while starting (see {spark_log}):\n  {tail}"
    # The summary ("[unresolved dependency: ...]", "[download failed: ...]") and the first
    # network error, if any ("Host ... not found", "Server access error at url ...").
    found = [next((line for line in lines if line.startswith('Exception in thread "main"')), ""),
             next((line for line in lines if line.startswith("Host ") or "Server access error" in line), "")]
    detail = "".join(f"\n  {line[:500]}" for line in found if line)
    return f"could not resolve {what} (see {spark_log}): {remedy}{detail}"


def _build_session(app_name: str, jars_conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in jars_conf.items():
        builder = builder.config(key, value)
    return (
        builder
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )


@dataclass
class Progress:
    """What the query did in this run (the foreachBatch function updates it)."""

    delivered: int = 0  # rows in the table (at start, then after each write)
    batches: int = 0
    consumed: int = 0
    retried: int = 0  # sent back to %RETRY%
    dead_lettered: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def table_exists(spark: Any, table: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, table))


def table_rows(spark: Any, table: str) -> int:
    """Rows in the Delta table (0 if there is none yet); Delta answers from its log."""
    return spark.read.format("delta").load(table).count() if table_exists(spark, table) else 0


class QueryId:
    """The streaming query's id, known once it has started: the Delta txnAppId."""

    def __init__(self) -> None:
        self._id = ""
        self._known = threading.Event()

    def set(self, query_id: str) -> None:
        self._id = query_id
        self._known.set()

    def get(self) -> str:
        if not self._known.wait(120):
            raise RuntimeError("the query id was never set")
        return self._id


def exactly_once_writer(
    spark: Any, listener: MessageListener, table: str, query_id: QueryId, progress: Progress,
    hold_before_write_s: float = 0.0, hold_after_write_s: float = 0.0,
) -> Callable[[Any, int], None]:
    """The ``foreachBatch`` function: listener, then an idempotent append to Delta.

    The holds are crash-test hooks: a pause once the listener has run (failures are
    back in %RETRY%) and the table is not written yet, and one once the table is
    written and the checkpoint does not say so yet.
    """
    from pyspark.sql import functions as F

    def each_batch(df: Any, batch_id: int) -> None:
        app_id = f"pymq-delta-pipeline:{query_id.get()}"
        good = listener.process(df, batch_id)  # failures are already in %RETRY% / %DLQ%
        s = listener.last_stats
        log(f"batch {batch_id}: consumed {s.consumed}, retry later {s.reconsume_later}, "
            f"dead letters {s.dead_letters}")
        time.sleep(hold_before_write_s)
        order = F.from_json(F.col("body").cast("string"), ORDER_DDL)
        rows = good.select(
            order.order_id.alias("order_id"), order.customer.alias("customer"),
            order.amount.alias("amount"), "msg_id", "topic", "queue_id", "queue_offset",
            "reconsume_times", "store_timestamp", F.lit(batch_id).cast("bigint").alias("batch_id"),
        ).dropDuplicates(["msg_id"])
        rows = rows.localCheckpoint(eager=True)
        # Only a retried message can be here twice (a replayed batch sent its failures
        # back again); first deliveries are exactly-once through the checkpoint.
        retried = [r.msg_id for r in rows.filter("reconsume_times > 0").select("msg_id").collect()]
        if retried and table_exists(spark, table):
            seen = (spark.read.format("delta").load(table).select("msg_id")
                    .filter(F.col("msg_id").isin(retried)))
            rows = rows.join(F.broadcast(seen), "msg_id", "left_anti").localCheckpoint(eager=True)
        if rows.isEmpty():
            log(f"batch {batch_id}: nothing to write")
        else:
            before = progress.delivered
            # The commit records (query id, batch id): a replay of this batch after a
            # crash finds it there, and Delta skips the whole append.
            (rows.write.format("delta").mode("append")
             .option("txnAppId", app_id).option("txnVersion", batch_id).save(table))
            after = table_rows(spark, table)
            with progress.lock:
                progress.delivered = after
            if after == before:
                log(f"batch {batch_id}: already in the table (a replay: Delta skipped txnVersion "
                    f"{batch_id})")
            else:
                log(f"batch {batch_id}: wrote {after - before} new row(s) to {table}")
        with progress.lock:
            progress.batches += 1
            progress.consumed += s.consumed
            progress.retried += s.reconsume_later
            progress.dead_lettered += s.dead_letters
        time.sleep(hold_after_write_s)

    return each_batch


def start_pipeline(
    spark: Any, endpoint: str, topic: str, group: str, table: str, checkpoint: str, *,
    max_reconsume: int = 3, trigger: str = "500 milliseconds", max_per_trigger: int | None = None,
    hold_before_write_s: float = 0.0, hold_after_write_s: float = 0.0,
    progress: Progress | None = None,
) -> tuple[Any, Progress]:
    """Start the streaming query; returns it and its live :class:`Progress`."""
    progress = progress or Progress()
    progress.delivered = table_rows(spark, table)
    listener = MessageListener(endpoint, group, charge, max_reconsume_times=max_reconsume)
    reader = (spark.readStream.format("pymq")
              .option("endpoint", endpoint)
              .option("topic", topic)
              .option("consumerGroup", group)  # includeRetry: %RETRY%<group> is read too
              .option("consumeFromWhere", "CONSUME_FROM_FIRST_OFFSET"))
    if max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", max_per_trigger)
    query_id = QueryId()
    writer = exactly_once_writer(spark, listener, table, query_id, progress,
                                 hold_before_write_s, hold_after_write_s)
    # stoppable: a stop in the middle of a batch's Spark job stops the query quietly (see
    # pyspark_pymq.spark.stop: Spark's test for it overflows on a Py4J error's Java stack trace).
    query = (reader.load().writeStream.foreachBatch(stoppable(writer))
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=trigger)
             .queryName(f"pymq-{topic}-to-delta")
             .start())
    query_id.set(str(query.id))  # the same on every restart from this checkpoint
    log(f"started query {query.id} ({topic} -> {table})")
    return query, progress


def dead_letter_count(admin: Admin, group: str) -> int:
    stats = admin.topics(include_system=True)
    rows = stats[stats["topic"] == f"%DLQ%{group}"]
    return int(rows["messages"].sum())


def wait_until_done(
    query: Any, progress: Progress, admin: Admin, group: str, expect_good: int, expect_dead: int,
    timeout_s: float = 300.0,
) -> None:
    """Block until the table holds ``expect_good`` orders and the DLQ ``expect_dead``
    messages, then let the query finish what is available."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not query.isActive:
            raise RuntimeError(f"the query stopped: {query.exception()}")
        with progress.lock:
            delivered = progress.delivered
        if delivered >= expect_good and dead_letter_count(admin, group) >= expect_dead:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout_s:.0f} s: {delivered} of {expect_good} "
                               f"delivered, {dead_letter_count(admin, group)} of {expect_dead} "
                               "dead letters")
        time.sleep(0.3)
    query.processAllAvailable()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--endpoint", required=True, help="host:port of the broker")
    p.add_argument("--topic", default="orders")
    p.add_argument("--group", default="billing")
    p.add_argument("--table", required=True, help="path of the Delta table")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument("--max-reconsume", type=int, default=3, help="retries before the DLQ")
    p.add_argument("--max-per-trigger", type=int, default=None, help="maxMessagesPerTrigger")
    p.add_argument("--trigger", default="500 milliseconds")
    p.add_argument("--expect-good", type=int, default=None, help="stop once the table has this many")
    p.add_argument("--expect-dead", type=int, default=0, help="... and the DLQ this many")
    p.add_argument("--hold-before-write-ms", type=int, default=0,
                   help="crash tests: pause in each batch after the listener, before the write")
    p.add_argument("--hold-after-write-ms", type=int, default=0,
                   help="crash tests: pause in each batch after the write")
    args = p.parse_args(argv)

    spark = delta_spark_session()
    log("spark session ready")
    query, progress = start_pipeline(
        spark, args.endpoint, args.topic, args.group, args.table, args.checkpoint,
        max_reconsume=args.max_reconsume, trigger=args.trigger,
        max_per_trigger=args.max_per_trigger, hold_before_write_s=args.hold_before_write_ms / 1000,
        hold_after_write_s=args.hold_after_write_ms / 1000,
    )
    admin = Admin(args.endpoint)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops cleanly too
    try:
        if args.expect_good is None:
            query.awaitTermination()
        else:
            wait_until_done(query, progress, admin, args.group, args.expect_good, args.expect_dead)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        query.stop()
    commit_group_progress(query, args.endpoint, args.group)
    table = spark.read.format("delta").load(args.table)
    rows, distinct = table.count(), table.select("msg_id").distinct().count()
    log(f"done: {rows} row(s) in {args.table} ({distinct} distinct msg_id), "
        f"{dead_letter_count(admin, args.group)} dead letter(s), "
        f"lag {int(admin.group_progress(args.group)['lag'].sum())}")
    spark.stop()


if __name__ == "__main__":
    main()
