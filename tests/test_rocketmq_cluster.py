"""Smoke tests of the real RocketMQ cluster fixture (tests/rocketmq_cluster.py) itself.

If these fail, every test against real RocketMQ would fail for the same reason: look here first.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from rocketmq_cluster import JavaMessage, RocketMQCluster

BROKERS = ("broker-a", "broker-b")


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_both_brokers_registered_in_one_cluster(rocketmq_cluster: RocketMQCluster) -> None:
    out = rocketmq_cluster.mqadmin("clusterList")
    for name in BROKERS:
        addr = rocketmq_cluster.broker_addrs[name]
        assert addr.startswith("127.0.0.1:")
        line = next((ln for ln in out.splitlines() if f" {name} " in ln), "")
        assert rocketmq_cluster.cluster_name in line and addr in line, out


def test_topic_on_both_brokers_and_java_producer(rocketmq_cluster: RocketMQCluster) -> None:
    c = rocketmq_cluster
    topic = _topic("smoke")
    c.create_topic(topic, queues=4)

    route = c.topic_route(topic)
    queue_datas = route["queueDatas"]
    assert isinstance(queue_datas, list)
    assert {q["brokerName"]: q["writeQueueNums"] for q in queue_datas} == dict.fromkeys(BROKERS, 4)

    # 10 KiB of varied text: above the client's 4 KiB threshold, so stored zlib-compressed.
    big = ("".join(f"{i:05d}-" for i in range(1700))).encode()[:10 * 1024]
    messages: list[JavaMessage | bytes | str] = [
        JavaMessage(big, tags="big", keys=["k-big"]),
        *(JavaMessage(f"m{i}", tags="T", keys=f"k{i}", properties={"n": str(i)}) for i in range(8)),
        "plain",
    ]
    sent = c.produce(topic, messages)
    assert len(sent) == 10
    assert {r.status for r in sent} == {"SEND_OK"}
    assert {r.broker_name for r in sent} == set(BROKERS)  # the client's round robin spans both
    assert len({r.msg_id for r in sent}) == 10
    assert all(len(r.offset_msg_id) == 32 for r in sent)

    # A batch lands in one queue with consecutive offsets; a pinned message where it is told.
    batch = c.produce(topic, [JavaMessage(b"b1", keys="kb1"), JavaMessage(b"b2", properties={"p": "v"})],
                      batch=True)
    assert [(r.broker_name, r.queue_id) for r in batch] == [(batch[0].broker_name, batch[0].queue_id)] * 2
    assert batch[1].queue_offset == batch[0].queue_offset + 1
    (pinned,) = c.produce(topic, [JavaMessage(b"here", broker="broker-b", queue_id=2)])
    assert (pinned.broker_name, pinned.queue_id) == ("broker-b", 2)

    status = c.topic_status(topic)
    assert set(status) == {(b, q) for b in BROKERS for q in range(4)}
    assert sum(max_offset for _, max_offset in status.values()) == 13
    for r in [*sent, *batch, pinned]:
        assert r.queue_offset < status[(r.broker_name, r.queue_id)][1]


def test_broker_crash_and_restart_keeps_its_messages(rocketmq_cluster: RocketMQCluster) -> None:
    c = rocketmq_cluster
    topic = _topic("crash")
    c.create_topic(topic, queues=2)
    before = c.produce(topic, [JavaMessage(f"a{i}", broker="broker-a", queue_id=i % 2) for i in range(4)])

    c.kill_broker("broker-a")
    try:
        # Sends still succeed: the name server dropped broker-a when its connection died.
        during = c.produce(topic, [f"d{i}" for i in range(3)])
        assert {r.broker_name for r in during} == {"broker-b"}
    finally:
        c.start_broker("broker-a")

    # ASYNC_FLUSH data survives a process crash (the OS still holds the pages).
    status = c.topic_status(topic)
    assert status[("broker-a", 0)][1] + status[("broker-a", 1)][1] == len(before)
    (after,) = c.produce(topic, [JavaMessage(b"back", broker="broker-a", queue_id=0)])
    assert (after.broker_name, after.queue_offset) == ("broker-a", 2)


def test_the_jvms_keep_their_temporary_files_in_the_sessions_directory(
    rocketmq_cluster: RocketMQCluster, spark: Any, java_tmpdir: Path
) -> None:
    # Spark's driver puts its block manager's directories there; RocketMQ's brokers their
    # self-signed certificates (netty's, never deleted). In /tmp they outlived every run.
    jvm = spark.sparkContext._jvm
    assert jvm.java.lang.System.getProperty("java.io.tmpdir") == str(java_tmpdir)
    names = sorted(p.name for p in java_tmpdir.iterdir())
    assert any(n.startswith("blockmgr-") for n in names), names
    assert any(n.startswith("keyutil_") for n in names), names
