"""RocketMQ 5's official Java client (rocketmq-client-java, from Maven Central) against the embedded broker.

``make rocketmq-client-java`` fetches the jar into ``.venv/``; javac compiles
``tests/rocketmq/client-java/*.java``: ``V2ClientCheck`` sends with a Producer,
receives and acks with a SimpleConsumer, and runs a PushConsumer whose listener
fails one message on every attempt until the broker dead-letters it;
``V2TransactionCheck`` commits, rolls back and leaves a transaction to the check-back.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import grpc
from broker_process import BrokerProcess
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pyspark_pymq.client import Admin, PullConsumer

ROOT = Path(__file__).resolve().parent.parent
CLIENT_VERSION = "5.1.0"  # tests/rocketmq/client-java/pom.xml, the Makefile's RMQ_CLIENT_JAVA_VERSION
LIB = ROOT / ".venv" / f"rocketmq-client-java-{CLIENT_VERSION}" / "lib"
SOURCES = sorted((ROOT / "tests" / "rocketmq" / "client-java").glob("*.java"))


def _compile(out: Path) -> str:
    assert any(LIB.glob("*.jar")), (
        f"rocketmq-client-java {CLIENT_VERSION} not found in {LIB}: run `make rocketmq-client-java`"
    )
    classpath = f"{LIB}/*"
    done = subprocess.run(["javac", "-nowarn", "-cp", classpath, "-d", str(out), *map(str, SOURCES)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"javac {SOURCES} failed:\n{done.stdout}{done.stderr}"
    return f"{classpath}:{out}"


def test_java_client_sends_receives_and_dead_letters(tmp_path: Path) -> None:
    classpath = _compile(tmp_path / "classes")
    args = ["--min-invisible-time-mills-for-recv", "1000", "--message-delay-level", "500ms 1s 2s 3s 5s"]
    topic, simple_group, push_group = (f"{p}{uuid.uuid4().hex[:8]}" for p in ("javaT", "javaS", "javaP"))
    with BrokerProcess(tmp_path / "broker", extra_args=args) as broker:
        endpoint = broker.endpoint
        Admin(endpoint).create_topic(topic, 2)
        with grpc.insecure_channel(endpoint) as channel:  # three delivery attempts, retried after 2 s and 3 s
            config = pymq_pb2.SubscriptionGroupConfig(
                group_name=push_group, retry_max_times=2, retry_queue_nums=1,
                consume_from_where="CONSUME_FROM_LAST_OFFSET", consume_enable=True,
            )
            pymq_pb2_grpc.BrokerStub(channel).UpdateSubscriptionGroup(
                pymq_pb2.UpdateSubscriptionGroupRequest(config=config)
            )
        command = ["java", "-cp", classpath, "V2ClientCheck", endpoint, topic, simple_group, push_group]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        lines = done.stdout.splitlines()
        sent = [line.split()[1] for line in lines if line.startswith("SENT ")]
        received = sorted(line.split()[1:] for line in lines if line.startswith("RECEIVED "))
        assert received == sorted([f"java-{i}", "J", f"k{i}", "java", "1", sent[i]] for i in range(3))
        assert "PUSH_FAILED_ATTEMPTS [1, 2, 3]" in lines, done.stdout
        # "ok-0" read as corrupted (its body's CRC32 has a leading 0) was discarded to the DLQ unread
        assert "PUSH_CONSUMED [ok, ok-0]" in lines, done.stdout
        dead = Admin(endpoint).dead_letter_messages(push_group)
        dead_letters = [(d.body, d.tags, d.properties.get("DLQ_ORIGIN_TOPIC")) for d in dead]
        assert dead_letters == [(b"fail", "P", topic)]
        # what the Java client sent reads the same through pymq
        consumer = PullConsumer(endpoint, "readers")
        stored = {m.msg_id: m for mq in consumer.queues(topic) for m in consumer.pull(mq, 0, 100).messages}
        for i, msg_id in enumerate(sent):
            m = stored[msg_id]
            expected = (f"java-{i}".encode(), "J", (f"k{i}",), {"lang": "java"})
            assert (m.body, m.tags, m.keys, m.user_properties) == expected


def test_java_client_transactions_commit_roll_back_and_are_checked_back(tmp_path: Path) -> None:
    classpath = _compile(tmp_path / "classes")
    args = ["--min-invisible-time-mills-for-recv", "1000", "--transaction-timeout", "500",
            "--transaction-check-interval", "500"]
    topic, group = (f"{p}{uuid.uuid4().hex[:8]}" for p in ("javaTx", "javaTxG"))
    with BrokerProcess(tmp_path / "broker", extra_args=args) as broker:
        Admin(broker.endpoint).create_topic(topic, 2, message_type="TRANSACTION")
        command = ["java", "-cp", classpath, "V2TransactionCheck", broker.endpoint, topic, group]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        lines = done.stdout.splitlines()
        assert "RECEIVED [checked-commit, commit-me]" in lines, done.stdout  # never the rolled-back one
        checked = {line.split()[1] for line in lines if line.startswith("CHECKED ")}
        assert checked == {"checked-commit"}, done.stdout  # ended transactions are not checked back
