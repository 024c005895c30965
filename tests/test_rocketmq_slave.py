"""A RocketMQ broker whose master is down and whose slave serves no reads, against real RocketMQ 5.3.3.

The name servers keep such a broker in the route (brokerAddrs holds the slave's id 1, no id 0),
and the slave answers stats and offsets; but with RocketMQ's default slaveReadEnable=false it
refuses every pull (SYSTEM_BUSY "[REJECTREQUEST]", PullMessageProcessor.rejectRequest). The
source must not plan ranges from the slave's stats: the broker's queues wait, and are read on
from where they were once the master is back.

A cluster of this module's own (one name server, broker-a's master and its slave: three JVMs,
started once for the module), so that killing the master touches no other test's broker.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Message, MessageQueue, Producer
from pyspark_pymq.backend import BackendConfig, open_backend
from pyspark_pymq.backend.rocketmq import RocketMQBackend
from pyspark_pymq.errors import BrokerUnavailableError, PymqError
from pyspark_pymq.rocketmq.api import MQClientAPI
from pyspark_pymq.rocketmq.route import NameServerClient
from rocketmq_cluster import RocketMQCluster

BROKER = "broker-a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQCluster]:
    c = RocketMQCluster(tmp_path_factory.mktemp("rocketmq-slave"), brokers=(BROKER,), slaves=(BROKER,),
                        cluster_name="PymqSlaveCluster")
    c.start()
    yield c
    c.stop(grace=3.0)


@pytest.fixture
def master_back(cluster: RocketMQCluster) -> Iterator[None]:
    """The master runs when the test ends, whatever it did to it (the next test starts with one)."""
    yield
    if not cluster.running(BROKER):
        cluster.start_broker(BROKER)


def _send(c: RocketMQCluster, topic: str, prefix: str, n: int) -> list[bytes]:
    producer = Producer(namesrv_addr=c.namesrv_addr)
    bodies = [f"{prefix}-{i}".encode() for i in range(n)]
    for body in bodies:
        producer.send(Message(topic, body))
    return bodies


def _replicated(c: RocketMQCluster, topic: str, total: int) -> None:
    """Wait until the slave holds ``total`` messages of ``topic`` (replication is asynchronous)."""
    api = MQClientAPI(timeout_s=3.0)
    deadline = time.monotonic() + 30
    held = -1
    while time.monotonic() < deadline:
        try:
            held = sum(o.max_offset for o in api.get_topic_stats_info(c.slave_addrs[BROKER], topic).values())
        except PymqError:
            held = -1  # the slave does not know the topic yet
        if held == total:
            return
        time.sleep(0.3)
    raise AssertionError(f"the slave holds {held} of {total} messages of {topic} after 30 s")


def _kill_master(c: RocketMQCluster, topic: str) -> None:
    """SIGKILL broker-a's master; return once the name servers route reads of it to its slave."""
    c.kill_broker(BROKER)
    ns = NameServerClient(c.namesrv_addr)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        broker = ns.get_route_info(topic).broker(BROKER)
        if broker is not None and broker.master_addr is None:
            assert dict(broker.broker_addrs) == {1: c.slave_addrs[BROKER]}
            return
        time.sleep(0.2)
    raise AssertionError("the name server still routes to broker-a's master 60 s after its kill")


def _says_why(text: str, c: RocketMQCluster) -> bool:
    return all(s in text for s in (f"broker {BROKER!r}", c.slave_addrs[BROKER], "slaveReadEnable=false",
                                   "master"))


def test_a_broker_whose_slave_serves_no_reads_is_unreachable_and_says_why(
    spark: Any, cluster: RocketMQCluster, master_back: None
) -> None:
    c = cluster
    topic = unique("slave")
    c.create_topic(topic, 2)
    _send(c, topic, "m", 10)
    _replicated(c, topic, 10)
    _kill_master(c, topic)
    backend = open_backend(BackendConfig(namesrv_addr=c.namesrv_addr), 5.0)
    assert isinstance(backend, RocketMQBackend)

    # the driver: the slave's stats are not bounds to plan from
    with pytest.raises(BrokerUnavailableError) as info:
        backend._broker_bounds(topic, BROKER)
    assert _says_why(info.value.remark, c), info.value.remark
    unreachable: set[str] = set()
    assert backend.queue_bounds(topic, unreachable=unreachable) == {}
    assert unreachable == {BROKER}
    with pytest.raises(BrokerUnavailableError) as info:
        backend.queue_bounds(topic)  # at a query's start: the error itself
    assert _says_why(info.value.remark, c), info.value.remark

    # an executor with a range planned before the master went down: the slave's refusal, said
    # so (retriable: the read loop tries again until pollTimeoutMs), not "system busy"
    with pytest.raises(BrokerUnavailableError) as info:
        backend.pull(unique("g"), MessageQueue(topic, BROKER, 0), 0, 8)
    assert "[REJECTREQUEST]" in info.value.remark and _says_why(info.value.remark, c), info.value.remark

    # spark.read plans at once: it fails naming the broker and why
    with pytest.raises(Exception) as failed:
        (spark.read.format("pymq").option("namesrvAddr", c.namesrv_addr).option("topic", topic)
         .option("pollTimeoutMs", 3000).load().collect())
    assert _says_why(str(failed.value), c), str(failed.value)[:3000]

    # a slave made readable (slaveReadEnable=true, at once, by updateBrokerConfig) is read
    slave = c.slave_addrs[BROKER]
    c.mqadmin("updateBrokerConfig", "-b", slave, "-k", "slaveReadEnable", "-v", "true")
    try:
        readable = open_backend(BackendConfig(namesrv_addr=c.namesrv_addr), 5.0)  # nothing remembered
        bounds = readable.queue_bounds(topic)
        assert bounds is not None and sum(b.max_offset for b in bounds.values()) == 10
        mq = next(mq for mq, b in bounds.items() if b.max_offset > 0)
        pulled = readable.pull(unique("g"), mq, 0, 32)
        assert len(readable.decode_messages(pulled, mq)) == bounds[mq].max_offset
    finally:
        c.mqadmin("updateBrokerConfig", "-b", slave, "-k", "slaveReadEnable", "-v", "false")

    c.start_broker(BROKER)
    bounds = open_backend(BackendConfig(namesrv_addr=c.namesrv_addr), 5.0).queue_bounds(topic)
    assert bounds is not None and sum(b.max_offset for b in bounds.values()) == 10


def test_stream_waits_for_a_broker_whose_slave_serves_no_reads(
    spark: Any, cluster: RocketMQCluster, master_back: None, tmp_path: Path
) -> None:
    """A stream restarted while the master is down keeps running: broker-a's queues wait (before
    the fix its slave's stats planned ranges whose pulls it refused, and the query failed after
    pollTimeoutMs), then are read on from where they were once the master is back: every message
    exactly once.

    The query is stopped before the kill and started again from its checkpoint after it, so
    that the messages the slave holds are not planned yet when the master dies, whatever the
    machine's speed (a running query would race its next trigger against the kill)."""
    c = cluster
    topic, group = unique("slave-stream"), unique("g")
    c.create_topic(topic, 2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    poll_timeout_ms = 4000

    def start() -> Any:
        reader = (spark.readStream.format("pymq").option("namesrvAddr", c.namesrv_addr)
                  .option("topic", topic).option("consumerGroup", group)
                  .option("startingOffsets", "earliest").option("pollTimeoutMs", poll_timeout_ms))
        return (reader.load().select("body", "queue_id", "queue_offset").writeStream.format("parquet")
                .option("checkpointLocation", str(ckpt)).trigger(processingTime="500 milliseconds")
                .start(str(out)))

    def rows() -> list[dict[str, Any]]:
        # the files of committed batches only (the sink's log), not those being written
        log = out / "_spark_metadata"
        if not log.exists() or not any(f.name.isdigit() for f in log.iterdir()):
            return []  # no batch committed yet
        return [r.asDict() for r in spark.read.parquet(str(out)).collect()]

    def wait_rows(query: Any, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(rows()) < n and time.monotonic() < deadline:
            assert query.isActive, f"the query stopped: {query.exception()}"
            time.sleep(0.5)
        assert len(rows()) >= n, f"{len(rows())} of {n} rows after {timeout:.0f} s"

    first = _send(c, topic, "before", 30)
    query = start()
    try:
        wait_rows(query, len(first))
    finally:
        query.stop()
    second = _send(c, topic, "during", 30)  # on the master and the slave, not read yet
    _replicated(c, topic, len(first) + len(second))
    _kill_master(c, topic)

    query = start()
    try:
        # several triggers and twice pollTimeoutMs: a range planned from the slave fails by then
        deadline = time.monotonic() + 2 * poll_timeout_ms / 1000 + 4
        while time.monotonic() < deadline:
            assert query.isActive, f"the query stopped while broker-a's master was down: {query.exception()}"
            time.sleep(0.5)
        assert len(rows()) == len(first)  # broker-a's queues wait where they were
        c.start_broker(BROKER)
        wait_rows(query, len(first) + len(second))
        time.sleep(1.5)  # a few more triggers: nothing read twice
        assert query.isActive, f"the query stopped: {query.exception()}"
    finally:
        query.stop()
    read = rows()
    assert Counter(bytes(r["body"]) for r in read) == Counter(first + second)  # all, each exactly once
    offsets = Counter((r["queue_id"], r["queue_offset"]) for r in read)
    assert max(offsets.values()) == 1 and len(offsets) == len(first) + len(second)


def test_a_new_stream_starts_while_a_broker_serves_no_reads_and_reads_it_once_back(
    spark: Any, cluster: RocketMQCluster, master_back: None, tmp_path: Path
) -> None:
    """A new stream (no checkpoint) started while broker-a's master was down failed at its start,
    naming the slave, where RocketMQ's consumers go on with the brokers that serve. It starts now
    without broker-a's queues, which join once the master is back, from their first message
    (startingOffsets=earliest): every message exactly once, none skipped."""
    c = cluster
    topic, group = unique("slave-new"), unique("g")
    c.create_topic(topic, 2)
    sent = _send(c, topic, "m", 20)
    _replicated(c, topic, len(sent))
    _kill_master(c, topic)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    poll_timeout_ms = 4000

    def rows() -> list[dict[str, Any]]:
        log = out / "_spark_metadata"  # the files of committed batches only
        if not log.exists() or not any(f.name.isdigit() for f in log.iterdir()):
            return []
        return [r.asDict() for r in spark.read.parquet(str(out)).collect()]

    query = (spark.readStream.format("pymq").option("namesrvAddr", c.namesrv_addr).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("pollTimeoutMs", poll_timeout_ms).load()
             .select("body", "queue_id", "queue_offset").writeStream.format("parquet")
             .option("checkpointLocation", str(ckpt)).trigger(processingTime="500 milliseconds")
             .start(str(out)))
    try:
        # several triggers and twice pollTimeoutMs: a range planned from the slave fails by then
        deadline = time.monotonic() + 2 * poll_timeout_ms / 1000 + 4
        while time.monotonic() < deadline:
            assert query.isActive, f"the query stopped while broker-a's master was down: {query.exception()}"
            time.sleep(0.5)
        assert rows() == []  # broker-a's queues are not read from its slave
        c.start_broker(BROKER)
        deadline = time.monotonic() + 120
        while len(rows()) < len(sent) and time.monotonic() < deadline:
            assert query.isActive, f"the query stopped: {query.exception()}"
            time.sleep(0.5)
        time.sleep(1.5)  # a few more triggers: nothing read twice
        assert query.isActive, f"the query stopped: {query.exception()}"
    finally:
        query.stop()
    read = rows()
    assert Counter(bytes(r["body"]) for r in read) == Counter(sent)  # all, each exactly once
    offsets = Counter((r["queue_id"], r["queue_offset"]) for r in read)
    assert max(offsets.values()) == 1 and len(offsets) == len(sent)
