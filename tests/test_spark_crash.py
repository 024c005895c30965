"""kill -9 the Spark driver mid-stream, restart from the checkpoint: nothing is lost.

The driver (a separate process group: the Python driver and its JVM) streams
topic -> topic through the pymq source and sink, and is killed while batches
are in flight. The restart drains the rest. Every source message must be in
the destination; with the destination's de-duplication window on, exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import read_all
from pyspark_pymq import Admin, Message, Producer

pytestmark = pytest.mark.spark
JOB = Path(__file__).resolve().parent / "jobs" / "forward_job.py"


def count(endpoint: str, topic: str) -> Counter[bytes]:
    return Counter(m.body for m in read_all(endpoint, topic))


def test_kill9_driver_mid_stream_then_restart_loses_nothing(shared_broker: Any, tmp_path: Path) -> None:
    ep = shared_broker.endpoint
    src, dst, group = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("crash-src", "crash-dst", "crash-g"))
    admin = Admin(ep)
    admin.create_topic(src, queues=2)
    admin.create_topic(dst, queues=2, dedup_window_ms=600_000)
    n = 6000
    Producer(ep).send_batch([Message(src, b"m%05d" % i) for i in range(n)])
    ckpt = str(tmp_path / "ckpt")
    args = [sys.executable, str(JOB), ep, src, dst, group, ckpt]
    driver = subprocess.Popen([*args, "run"], start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300  # a JVM start on a loaded 2-core machine can take minutes
        while time.monotonic() < deadline:
            written = sum(count(ep, dst).values())
            if written >= 600:  # a few micro-batches in: kill while it works
                break
            assert driver.poll() is None, driver.stdout.read() if driver.stdout else ""
            time.sleep(0.2)
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        driver.wait(30)
    partial = sum(count(ep, dst).values())
    assert 0 < partial < n, "the kill should land mid-stream"
    finish = subprocess.run([*args, "finish"], capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stdout[-3000:] + finish.stderr[-3000:]
    got = count(ep, dst)
    assert set(got) == {b"m%05d" % i for i in range(n)}, "messages were lost"
    assert max(got.values()) == 1, "the replayed batch was not de-duplicated"
