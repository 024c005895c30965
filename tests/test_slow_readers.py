"""A client that stops reading its pull answers cannot make the broker hold them without bound
(PullAnswerBudget): a real broker process, a real client process frozen with SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from broker_process import BrokerProcess
from pymq_broker.common.broker_exception import BrokerException
from pymq_broker.remoting.pull_answer_budget import PullAnswerBudget
from pyspark_pymq.client import Admin, Message, MessageQueue, Producer, PullConsumer

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024

# Fires PULLS pulls of PULL_BYTES each at the broker, then freezes itself before reading any answer.
_FROZEN_READER = r"""
import os, signal, sys
import grpc
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
endpoint, pulls, pull_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
channel = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 256 << 20)])
stub = pymq_pb2_grpc.BrokerStub(channel)
mq = pymq_pb2.MessageQueue(topic="big", broker_name="broker-a", queue_id=0)
calls = [stub.PullMessage.future(pymq_pb2.PullMessageRequest(
    consumer_group="frozen", message_queue=mq, queue_offset=0, max_msg_nums=100_000, max_bytes=pull_bytes,
    subscription="*", expression_type="TAG")) for _ in range(pulls)]
print("SENT", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _broker_rss(broker: BrokerProcess) -> int:
    return int(psutil.Process(broker.pid).memory_info().rss)


def test_pull_answer_budget_counts_per_connection() -> None:
    budget = PullAnswerBudget(max_bytes=100)
    budget.check("ipv4:127.0.0.1:1")
    budget.hold("ipv4:127.0.0.1:1", 60)
    budget.hold("ipv4:127.0.0.1:1", 60)
    with pytest.raises(BrokerException, match="120 bytes of pull answers it has not read yet"):
        budget.check("ipv4:127.0.0.1:1")
    budget.check("ipv4:127.0.0.1:2")  # another connection has its own budget
    budget.release("ipv4:127.0.0.1:1", 60)
    budget.check("ipv4:127.0.0.1:1")
    budget.release("ipv4:127.0.0.1:1", 60)
    assert budget.held == {} and budget.refused == 1


def test_a_frozen_reader_cannot_make_the_broker_hold_its_answers(tmp_path: Path) -> None:
    args = ["--max-pull-bytes-in-flight-per-client", str(32 * MiB)]
    with BrokerProcess(tmp_path / "b", args) as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("big", 1)
        producer = Producer(ep)
        body = os.urandom(64 * 1024)
        for _ in range(6):  # 24 MiB stored: every pull below answers ~8 MiB of it
            producer.send_batch([Message("big", body) for _ in range(64)])
        producer.close()
        before = _broker_rss(broker)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("proto", "connector"))}
        frozen = subprocess.Popen([sys.executable, "-c", _FROZEN_READER, ep, "60", str(8 * MiB)],
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert frozen.stdout is not None and frozen.stdout.readline().strip() == "SENT"
            time.sleep(4)  # the broker answers all 60 pulls (480 MiB of answers without the budget)
            grown = _broker_rss(broker) - before
            assert grown < 200 * MiB, f"broker RSS grew {grown / MiB:.0f} MiB for a client that reads nothing"
            # everyone else is served meanwhile
            got = PullConsumer(ep, "reader").pull(MessageQueue("big", "broker-a", 0), 0, 4)
            assert len(got.messages) == 4
        finally:
            frozen.send_signal(signal.SIGKILL)
            frozen.wait()
