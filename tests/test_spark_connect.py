"""pymq under Spark Connect: a client process of its own (``remote("local[2]")``), a broker process.

Connect has no SparkContext, no accumulators, and runs a ``foreachBatch`` function on the
server: the source, the sink, the listener and the examples must work there as in classic
Spark (Databricks' serverless compute and shared clusters are Connect). The job runs in a
subprocess: a Connect client cannot share this process with the suite's classic session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import read_all, unique
from pyspark_pymq import Admin, Message, Producer

pytestmark = pytest.mark.spark

JOB = Path(__file__).resolve().parent / "jobs" / "connect_job.py"


def test_source_sink_and_listeners_work_under_spark_connect(broker: Any, tmp_path: Path) -> None:
    ep = broker.endpoint
    topic, group = unique("connect"), unique("cg")
    admin = Admin(ep)
    for name in (topic, f"{topic}-copy"):
        admin.create_topic(name, queues=4)
    # a de-duplication window: a writeId repeated across micro-batches would drop rows here
    admin.create_topic(f"{topic}-good", queues=4, dedup_window_ms=600_000)
    keys = [f"ok-{i}" if i % 5 else f"bad-{i}" for i in range(30)]
    with Producer(ep) as producer:
        for key in keys:
            producer.send(Message(topic, f"body of {key}", keys=[key]))
    good = sorted(k for k in keys if k.startswith("ok"))
    bad = sorted(k for k in keys if k.startswith("bad"))

    proc = subprocess.run([sys.executable, str(JOB), ep, topic, group, str(tmp_path)],
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])

    assert seen["remote"] is True  # a Connect session, not classic Spark
    assert seen["read"] == 30
    assert seen["listener_good"] == len(good)
    assert seen["listener_stats"] == {"consumed": len(good), "reconsume_later": 0,
                                      "dead_letters": len(bad), "dropped": 0, "retried_in_place": 0}
    assert seen["orderly_good"] == len(good)
    assert seen["orderly_stats"] == {"consumed": len(good), "reconsume_later": 0,
                                     "dead_letters": len(bad), "dropped": 0,
                                     "retried_in_place": len(bad)}
    assert seen["parquet"] == len(good)
    assert seen["dead_letter_keys"] == bad  # the deadLetters view
    for listener_group in ("batch", "orderly", "stream"):  # every failure is a dead letter, once
        dlq = read_all(ep, f"%DLQ%{group}-{listener_group}")
        assert sorted(m.keys[0] for m in dlq) == bad, listener_group
    # foreachBatch wrote each micro-batch's successes back once: its writeId carries the batch id
    written = read_all(ep, f"{topic}-good")
    assert sorted(m.keys[0] for m in written) == good
    assert len(Counter(m.msg_id for m in written)) == len(good)
    copied = read_all(ep, f"{topic}-copy")  # the stream sink
    assert sorted(m.body.decode() for m in copied) == sorted(f"body of {k}" for k in keys)
