"""A RocketMQ broker without a master, whose slave may or may not serve reads: no JVM.

One fake server on loopback plays the name server and broker ``b``'s slave (brokerId 1,
no master in the route); it answers as RocketMQ 5.3.3 does: GET_BROKER_CONFIG with the
slave's properties, stats and offsets whatever slaveReadEnable says, and every pull of a
slave with slaveReadEnable=false with NettyRemotingAbstract's SYSTEM_BUSY "[REJECTREQUEST]".
tests/test_rocketmq_slave.py runs the same against a real master and slave.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from pyspark_pymq.backend import BackendConfig, QueueBounds
from pyspark_pymq.backend.rocketmq import RocketMQBackend
from pyspark_pymq.client.message import MessageQueue
from pyspark_pymq.errors import BrokerUnavailableError
from pyspark_pymq.rocketmq.protocol import RemotingCommand, RequestCode, ResponseCode

TOPIC = "T"
REJECT_REMARK = "[REJECTREQUEST]system busy, start flow control for a while"  # RocketMQ's own


class FakeCluster:
    """Answers every request with ``answer(request)``; counts the requests by code."""

    def __init__(self, answer: Callable[[FakeCluster, RemotingCommand], RemotingCommand]) -> None:
        self.answer = answer
        self.asked: Counter[int] = Counter()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.master: str | None = None  # the route's brokerId 0, when set
        self.config = {"brokerRole": "SLAVE", "slaveReadEnable": "false", "brokerId": "1"}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    head = _recv(conn, 4)
                    request = RemotingCommand.decode(head + _recv(conn, struct.unpack(">i", head)[0]))
                except (EOFError, OSError):
                    return
                self.asked[request.code] += 1
                response = self.answer(self, request)
                response.opaque = request.opaque
                conn.sendall(response.encode())

    def route(self) -> bytes:
        addrs = {"1": self.addr} if self.master is None else {"0": self.master, "1": self.addr}
        return json.dumps({
            "brokerDatas": [{"brokerAddrs": addrs, "brokerName": "b", "cluster": "c"}],
            "queueDatas": [{"brokerName": "b", "perm": 6, "readQueueNums": 2, "writeQueueNums": 2,
                            "topicSysFlag": 0}],
        }).encode()

    def close(self) -> None:
        self.listener.close()


def _recv(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _stats_answer(broker: str, queues: int, topic: str = TOPIC) -> RemotingCommand:
    """GET_TOPIC_STATS_INFO's answer: a Map<MessageQueue, TopicOffset> (fastjson writes object keys)."""
    table = ",".join(json.dumps({"brokerName": broker, "queueId": q, "topic": topic})
                     + ':{"maxOffset":5,"minOffset":0}' for q in range(queues))
    return RemotingCommand.response(ResponseCode.SUCCESS, 0, body=f'{{"offsetTable":{{{table}}}}}'.encode())


def _slave(c: FakeCluster, request: RemotingCommand) -> RemotingCommand:
    """A name server whose route of T has broker b's slave only, and that slave."""
    ok = ResponseCode.SUCCESS
    if request.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
        return RemotingCommand.response(ok, 0, body=c.route())
    if request.code == RequestCode.GET_BROKER_CONFIG:
        properties = "".join(f"{k}={v}\n" for k, v in c.config.items())  # MixAll.properties2String
        return RemotingCommand.response(ok, 0, body=properties.encode())
    if request.code == RequestCode.GET_TOPIC_STATS_INFO:
        return _stats_answer("b", 2)
    if request.code == RequestCode.PULL_MESSAGE and c.config["slaveReadEnable"] != "true":
        return RemotingCommand.response(ResponseCode.SYSTEM_BUSY, 0, remark=REJECT_REMARK)
    if request.code == RequestCode.PULL_MESSAGE:
        return RemotingCommand.response(ResponseCode.PULL_NOT_FOUND, 0, ext_fields={
            "nextBeginOffset": "5", "minOffset": "0", "maxOffset": "5", "suggestWhichBrokerId": "0"})
    return RemotingCommand.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 0, remark="not in this fake")


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    c = FakeCluster(_slave)
    yield c
    c.close()


def _backend(c: FakeCluster) -> RocketMQBackend:
    return RocketMQBackend(BackendConfig(namesrv_addr=c.addr), timeout_s=3.0)


def _unlisted(c: FakeCluster, topics: list[str], *, timeout_s: float = 3.0,
              listing_from: int | None = None) -> dict[str, dict[str, list[MessageQueue]]]:
    """``unlisted_queues(topics)`` of a backend on ``c``'s name server, the topics' routes looked up
    first (as a batch read does); ``listing_from``: its LISTING_FROM_TOPICS."""
    backend = RocketMQBackend(BackendConfig(namesrv_addr=c.addr), timeout_s=timeout_s)
    if listing_from is not None:
        backend.LISTING_FROM_TOPICS = listing_from
    for topic in dict.fromkeys(topics):
        backend.route(topic, refresh=True)
    return backend.unlisted_queues(topics)


# a write-only topic, one with more write than read queues, one read-only (topicConfigTable entries)
_PERMS = {"wo": {"topicName": "wo", "readQueueNums": 4, "writeQueueNums": 4, "perm": 2},
          "more-w": {"topicName": "more-w", "readQueueNums": 2, "writeQueueNums": 4, "perm": 6},
          "ro": {"topicName": "ro", "readQueueNums": 3, "writeQueueNums": 1, "perm": 4}}
_READ_OF_PERMS = {"more-w": {"x": [MessageQueue("more-w", "x", q) for q in range(2)]},
                  "ro": {"x": [MessageQueue("ro", "x", q) for q in range(3)]}}


def test_a_slave_with_reads_off_makes_its_broker_unreachable_asked_once_per_interval(
    fake: FakeCluster,
) -> None:
    """Its stats would plan ranges whose every pull it refuses: its queues wait instead."""
    backend = _backend(fake)
    for _ in range(3):  # three triggers
        with pytest.raises(BrokerUnavailableError) as info:
            backend._broker_bounds(TOPIC, "b")
        unreachable: set[str] = set()
        assert backend.queue_bounds(TOPIC, unreachable=unreachable) == {}
        assert unreachable == {"b"}
    remark = info.value.remark
    assert "broker 'b' serves no reads" in remark and f"slave {fake.addr} (brokerId 1)" in remark
    assert "slaveReadEnable=false" in remark and "master (brokerId 0) is not registered" in remark
    assert f"mqadmin updateBrokerConfig -b {fake.addr} -k slaveReadEnable -v true" in remark
    assert fake.asked[RequestCode.GET_BROKER_CONFIG] == 1  # remembered, not asked per trigger
    assert fake.asked[RequestCode.GET_TOPIC_STATS_INFO] == 0  # nothing planned from the slave

    # made readable (mqadmin updateBrokerConfig: at once), or one that does not say: read
    fake.config["slaveReadEnable"] = "true"
    read = {MessageQueue(TOPIC, "b", q): QueueBounds(0, 5) for q in (0, 1)}
    assert _backend(fake).queue_bounds(TOPIC) == read

    def refusing(c: FakeCluster, request: RemotingCommand) -> RemotingCommand:
        if request.code == RequestCode.GET_BROKER_CONFIG:  # an ACL that does not allow it
            return RemotingCommand.response(ResponseCode.NO_PERMISSION, 0, remark="no permission")
        return _slave(c, request)

    fake.answer = refusing
    assert len(_backend(fake).queue_bounds(TOPIC) or {}) == 2  # its pulls will say


def test_a_pull_the_slave_rejects_says_why_and_goes_to_the_master_once_it_is_back(
    fake: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _backend(fake)
    mq = MessageQueue(TOPIC, "b", 0)
    with pytest.raises(BrokerUnavailableError) as info:
        backend.pull("g", mq, 0, 8)
    assert info.value.retriable  # the read loop tries again until pollTimeoutMs
    assert f"{mq} cannot be pulled: broker 'b' serves no reads" in info.value.remark
    assert "slaveReadEnable=false" in info.value.remark and "[REJECTREQUEST]" in info.value.remark

    # the master is back (here: a second fake that pulls), while this process still holds the
    # route that names the slave: the rejected pull asks the route again and goes to the master
    master = FakeCluster(_slave)
    master.config["slaveReadEnable"] = "true"  # pulls answer NOT_FOUND at the end
    try:
        fake.master = master.addr
        monkeypatch.setattr("pyspark_pymq.rocketmq.route.ROUTE_RETRY_AFTER_S", 0.0)  # held long enough
        pulled = backend.pull("g", mq, 5, 8)
        assert pulled.next_begin_offset == 5 and master.asked[RequestCode.PULL_MESSAGE] == 1
        assert backend.broker_addr(mq) == master.addr  # the next pulls go there at once
    finally:
        master.close()


def test_a_readable_slave_without_the_message_yet_sends_the_pull_to_its_master(
    fake: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slave whose group has a master answers a pull it cannot serve (an offset it has not
    replicated yet) PULL_RETRY_IMMEDIATELY at the same offset: read as "nothing matched", the read
    loop skipped that offset, and the next, silently, to the range's end (review of helper-96's
    fix). The pull goes to the master instead; without one, it is tried again (retriable)."""
    fake.config["slaveReadEnable"] = "true"

    def behind(c: FakeCluster, request: RemotingCommand) -> RemotingCommand:
        if request.code == RequestCode.PULL_MESSAGE:
            offset = request.ext_fields["queueOffset"]
            return RemotingCommand.response(ResponseCode.PULL_RETRY_IMMEDIATELY, 0, ext_fields={
                "nextBeginOffset": offset, "minOffset": "0", "maxOffset": "3", "suggestWhichBrokerId": "0"})
        return _slave(c, request)

    fake.answer = behind
    backend = _backend(fake)
    mq = MessageQueue(TOPIC, "b", 0)
    with pytest.raises(BrokerUnavailableError) as info:
        backend.pull("g", mq, 4, 8)
    assert info.value.retriable and "PULL_RETRY_IMMEDIATELY at offset 4" in info.value.remark
    master = FakeCluster(_slave)
    master.config["slaveReadEnable"] = "true"  # this one answers NOT_FOUND at 5, its end
    try:
        fake.master = master.addr
        monkeypatch.setattr("pyspark_pymq.rocketmq.route.ROUTE_RETRY_AFTER_S", 0.0)
        assert backend.pull("g", mq, 4, 8).next_begin_offset == 5
        assert master.asked[RequestCode.PULL_MESSAGE] == 1
    finally:
        master.close()


def test_a_new_stream_starts_without_a_broker_that_serves_no_reads_a_batch_read_fails(
    fake: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream's start left out nothing: the broker's refusal failed it. Its queues are left out
    now (they join once it serves); a batch read, which cannot wait for them, still fails."""
    from pyspark_pymq.spark.offset_reader import OffsetReader
    from pyspark_pymq.spark.options import parse_source_options

    def reader(stream: bool) -> OffsetReader:
        opts = parse_source_options({"namesrvAddr": fake.addr, "topic": TOPIC, "consumerGroup": "g",
                                     "includeRetry": "false"}, stream=stream)
        return OffsetReader(opts, backend=_backend(fake))

    with caplog.at_level("WARNING", logger="pyspark_pymq.spark"):
        assert reader(stream=True).bounds(require_topics=True) == ({}, [])
    assert any("broker(s) b do not answer or serve no reads; their queues wait" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(BrokerUnavailableError, match="broker 'b' serves no reads") as info:
        reader(stream=False).bounds(require_topics=True)
    # it answers: not told as a broker the source "cannot reach" (with the hint to check its address)
    assert info.value.remark.startswith("pymq source: broker 'b' serves no reads")
    assert "cannot reach" not in info.value.remark


def test_a_new_stream_starting_elsewhere_than_group_or_earliest_fails_on_a_broker_serving_no_reads(
    fake: FakeCluster,
) -> None:
    """Left out at the start, the broker's queues would join later from the group's progress or their
    first message, not where these options start them (latest: its whole history read once it
    served): such a stream's start fails, saying the broker serves no reads (not that it is down)."""
    from pyspark_pymq.errors import BrokerNotReadableError
    from pyspark_pymq.spark.offset_reader import OffsetReader
    from pyspark_pymq.spark.options import parse_source_options

    for start in ({"startingOffsets": "latest"}, {"startingOffsets": f'{{"{TOPIC}": {{"b:0": 0}}}}'},
                  {"startingTimestamp": "1700000000000"}):
        opts = parse_source_options({"namesrvAddr": fake.addr, "topic": TOPIC, "consumerGroup": "g",
                                     "includeRetry": "false", **start}, stream=True)
        with pytest.raises(BrokerNotReadableError, match="broker 'b' serves no reads") as info:
            OffsetReader(opts, backend=_backend(fake)).bounds(require_topics=True)
        assert "down or not registered" not in info.value.remark and "cannot reach" not in info.value.remark
    earliest = parse_source_options({"namesrvAddr": fake.addr, "topic": TOPIC, "consumerGroup": "g",
                                     "includeRetry": "false", "startingOffsets": "earliest"}, stream=True)
    assert OffsetReader(earliest, backend=_backend(fake)).bounds(require_topics=True) == ({}, [])


def _slave_with_cluster_info(c: FakeCluster, request: RemotingCommand) -> RemotingCommand:
    """:func:`_slave`, and the name server's cluster info: broker b registered by its slave alone."""
    if request.code == RequestCode.GET_BROKER_CLUSTER_INFO:
        return RemotingCommand.response(ResponseCode.SUCCESS, 0, body=json.dumps({
            "brokerAddrTable": {"b": {"cluster": "c", "brokerName": "b", "brokerAddrs": {"1": c.addr}}},
            "clusterAddrTable": {"c": ["b"]},
        }).encode())
    return _slave(c, request)


def test_a_new_stream_assigned_queues_of_a_broker_serving_no_reads_starts() -> None:
    """assign gives no offsets: a new stream naming queues of a broker that serves no reads starts
    without them, and they join once it serves, as its topic's queues do without assign. The check
    of assign ran before the bounds' unreadable brokers were known: the start failed saying the
    broker was 'down or not registered' and its route did not list it (it does)."""
    from pyspark_pymq.spark.offset_reader import OffsetReader
    from pyspark_pymq.spark.options import parse_source_options

    c = FakeCluster(_slave_with_cluster_info)
    try:
        opts = parse_source_options({"namesrvAddr": c.addr, "assign": f'{{"{TOPIC}": ["b:0"]}}',
                                     "consumerGroup": "g"}, stream=True)
        reader = OffsetReader(opts, backend=_backend(c))
        assert reader.bounds(require_topics=True) == ({}, [])  # initialOffset
        assert reader.bounds(require_topics=True) == ({}, [])  # the first latestOffset
        assert reader.starting_offsets({}) == {}  # it starts; b:0 joins once b serves
        # so does a queue named by its id alone, which may be the broker's
        opts = parse_source_options({"namesrvAddr": c.addr, "assign": f'{{"{TOPIC}": [1]}}',
                                     "consumerGroup": "g"}, stream=True)
        assert OffsetReader(opts, backend=_backend(c)).bounds(require_topics=True) == ({}, [])
    finally:
        c.close()


def _route_of_a_in_a_cluster_with_x(
    a_addr: str | None = None, x_addr: str | None = None,
    topic_stats: Callable[[], RemotingCommand] | None = None,
    topic_config: Callable[[], RemotingCommand] | None = None,
) -> Callable[[FakeCluster, RemotingCommand], RemotingCommand]:
    """A name server whose route of the topic lists broker ``a`` alone while its cluster ``c`` has
    brokers ``a`` and ``x`` (at the fake's own address where None); ``topic_stats`` answers
    GET_TOPIC_STATS_INFO and ``topic_config`` GET_ALL_TOPIC_CONFIG (sent to the fake; else
    REQUEST_CODE_NOT_SUPPORTED)."""

    def answer(c: FakeCluster, request: RemotingCommand) -> RemotingCommand:
        ok = ResponseCode.SUCCESS
        a, x = a_addr or c.addr, x_addr or c.addr
        if request.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return RemotingCommand.response(ok, 0, body=json.dumps({
                "brokerDatas": [{"brokerAddrs": {"0": a}, "brokerName": "a", "cluster": "c"}],
                "queueDatas": [{"brokerName": "a", "perm": 6, "readQueueNums": 1, "writeQueueNums": 1,
                                "topicSysFlag": 0}]}).encode())
        if request.code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return RemotingCommand.response(ok, 0, body=json.dumps({
                "brokerAddrTable": {
                    "a": {"cluster": "c", "brokerName": "a", "brokerAddrs": {"0": a}},
                    "x": {"cluster": "c", "brokerName": "x", "brokerAddrs": {"0": x}}},
                "clusterAddrTable": {"c": ["a", "x"]}}).encode())
        if request.code == RequestCode.GET_TOPIC_STATS_INFO and topic_stats is not None:
            return topic_stats()
        if request.code == RequestCode.GET_ALL_TOPIC_CONFIG and topic_config is not None:
            return topic_config()
        return RemotingCommand.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 0, remark="not here")

    return answer


def test_unlisted_queues_asks_a_broker_that_does_not_answer_once_not_once_per_topic() -> None:
    """A registered broker of the route's cluster that the routes leave out and that does not
    answer cost one time-out per topic of the read (subscribePattern: 100 topics, 100 time-outs)."""
    import time

    hung = socket.create_server(("127.0.0.1", 0))  # connects (the backlog), never answers
    hung_addr = f"127.0.0.1:{hung.getsockname()[1]}"

    c = FakeCluster(_route_of_a_in_a_cluster_with_x(x_addr=hung_addr))
    try:
        backend = RocketMQBackend(BackendConfig(namesrv_addr=c.addr), timeout_s=0.3)
        topics = [f"t{i}" for i in range(8)]
        for topic in topics:
            backend.route(topic, refresh=True)
        started = time.monotonic()
        assert backend.unlisted_queues(topics) == {}
        assert time.monotonic() - started < 3 * 0.3  # one time-out, not 8
        assert c.asked[RequestCode.GET_BROKER_CLUSTER_INFO] == 1
    finally:
        c.close()
        hung.close()


def _all_topic_config(topics: dict[str, int]) -> RemotingCommand:
    """GET_ALL_TOPIC_CONFIG's answer as RocketMQ 5.3.3 writes it (TopicConfigAndMappingSerializeWrapper)."""
    table = {t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6, "order": False,
                 "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "attributes": {}}
             for t, n in topics.items()}
    return RemotingCommand.response(ResponseCode.SUCCESS, 0, body=json.dumps({
        "dataVersion": {"counter": 3, "stateVersion": 0, "timestamp": 1},
        "topicConfigTable": table, "topicQueueMappingDetailMap": {},
        "mappingDataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 1}}).encode())


def test_unlisted_queues_of_many_topics_cost_one_request_per_broker() -> None:
    """A stats request per topic and broker the route leaves out, one after the other: a read of 100
    topics on 1 of 10 brokers waited for 900 round trips (9 s at 10 ms). One GET_ALL_TOPIC_CONFIG per
    broker answers for every topic, with the queues GET_TOPIC_STATS_INFO would name."""
    topics = [f"t{i}" for i in range(100)]
    held = {"t7": 4, "t42": 2, "other": 8}  # broker x holds two of the read's topics

    c = FakeCluster(_route_of_a_in_a_cluster_with_x(a_addr="127.0.0.1:1",
                                                    topic_config=lambda: _all_topic_config(held)))
    try:
        assert _unlisted(c, topics) == {
            "t42": {"x": [MessageQueue("t42", "x", q) for q in range(2)]},
            "t7": {"x": [MessageQueue("t7", "x", q) for q in range(4)]},
        }
        assert c.asked[RequestCode.GET_ALL_TOPIC_CONFIG] == 1
        assert c.asked[RequestCode.GET_TOPIC_STATS_INFO] == 0
    finally:
        c.close()


def test_unlisted_queues_of_a_few_topics_do_not_list_the_broker_topic_table() -> None:
    """A read of one topic downloaded and parsed the whole topic table of every broker its route leaves
    out (100,000 topics: 18.5 MB, 0.3-9 s per read): a broker asked about few topics answers a stats
    request per topic."""
    c = FakeCluster(_route_of_a_in_a_cluster_with_x(a_addr="127.0.0.1:1",
                                                    topic_stats=lambda: _stats_answer("x", 2),
                                                    topic_config=lambda: _all_topic_config({TOPIC: 2})))
    try:
        assert _unlisted(c, [TOPIC]) == {TOPIC: {"x": [MessageQueue(TOPIC, "x", q) for q in range(2)]}}
        assert c.asked[RequestCode.GET_ALL_TOPIC_CONFIG] == 0
        assert c.asked[RequestCode.GET_TOPIC_STATS_INFO] == 1
    finally:
        c.close()


def test_unlisted_queues_are_those_a_read_would_read_once_the_route_lists_the_broker() -> None:
    """A batch read fails on a broker of the cluster that holds queues of the topic the route does
    not list. GET_ALL_TOPIC_CONFIG's queues were the stats' (max of read and write queues, whatever the
    perm): a write-only topic there, or write queues beyond its read queues, failed the read naming
    queues it would not read even once the route listed the broker (subscribe queues: readQueueNums
    with PERM_READ)."""

    def config() -> RemotingCommand:
        return RemotingCommand.response(ResponseCode.SUCCESS, 0, body=json.dumps(
            {"dataVersion": {"counter": 1}, "topicConfigTable": _PERMS}).encode())

    c = FakeCluster(_route_of_a_in_a_cluster_with_x(a_addr="127.0.0.1:1", topic_config=config))
    try:
        # the listing, as for a read of many topics
        assert _unlisted(c, list(_PERMS), listing_from=len(_PERMS)) == _READ_OF_PERMS
    finally:
        c.close()


def test_unlisted_queues_of_a_broker_refusing_the_listing_are_asked_per_topic() -> None:
    """A broker that refuses GET_ALL_TOPIC_CONFIG (its ACLs grant the user Get on topics, not List)
    is asked per topic, as before (the first topic alone: a broker refusing the user is asked once)."""

    def refused() -> RemotingCommand:
        return RemotingCommand.response(ResponseCode.NO_PERMISSION, 0, remark="no List on Topic")

    def stats() -> RemotingCommand:
        return RemotingCommand.response(ResponseCode.TOPIC_NOT_EXIST, 0, remark="topic not exist")

    c = FakeCluster(_route_of_a_in_a_cluster_with_x(a_addr="127.0.0.1:1", topic_stats=stats,
                                                    topic_config=refused))
    try:
        assert _unlisted(c, [f"t{i}" for i in range(20)]) == {}
        assert c.asked[RequestCode.GET_ALL_TOPIC_CONFIG] == 1
        assert c.asked[RequestCode.GET_TOPIC_STATS_INFO] == 20
    finally:
        c.close()


def test_unlisted_queues_of_a_broker_that_refuses_the_user_do_not_fail_the_read() -> None:
    """A broker of the route's cluster that the route does not list, and whose ACLs do not know the
    user (RocketMQ 5: users made per broker), failed a batch read of a topic its route serves whole."""

    def refused() -> RemotingCommand:  # broker x
        return RemotingCommand.response(ResponseCode.NO_PERMISSION, 0, remark="User:u is not found")

    c = FakeCluster(_route_of_a_in_a_cluster_with_x(a_addr="127.0.0.1:1", topic_stats=refused))
    try:
        assert _unlisted(c, [TOPIC, TOPIC], timeout_s=1.0) == {}
        assert c.asked[RequestCode.GET_TOPIC_STATS_INFO] == 1  # asked once
    finally:
        c.close()


def test_a_batch_read_of_a_topic_a_registered_broker_holds_unlisted_gives_safe_advice() -> None:
    """The advice to bring the route back named `mqadmin updateTopic -b <addr> -t T` alone, which
    sets the topic's queues on that broker to 8 read and 8 write: a topic of 16 queues has 8-15
    read no more."""
    from pyspark_pymq.spark.offset_reader import OffsetReader
    from pyspark_pymq.spark.options import parse_source_options

    x = FakeCluster(lambda c, r: _stats_answer("x", 16) if r.code == RequestCode.GET_TOPIC_STATS_INFO
                    else RemotingCommand.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 0, remark="no"))

    ns = FakeCluster(_route_of_a_in_a_cluster_with_x(x_addr=x.addr,
                                                     topic_stats=lambda: _stats_answer("a", 1)))
    try:
        opts = parse_source_options({"namesrvAddr": ns.addr, "topic": TOPIC, "consumerGroup": "g",
                                     "includeRetry": "false"}, stream=False)
        reader = OffsetReader(opts, backend=_backend(ns))
        with pytest.raises(BrokerUnavailableError, match="broker 'x' holds queue") as info:
            reader.bounds(require_topics=True)
        assert "every 30 s" in info.value.remark
        assert f"not -t {TOPIC} without -r and -w, which would set its queue counts there to 8" in (
            info.value.remark)
    finally:
        ns.close()
        x.close()


def test_unlisted_queues_of_a_few_topics_are_those_a_read_would_read_too() -> None:
    """A read of fewer than LISTING_FROM_TOPICS topics asks per topic; the stats name the queues of the
    topic config whatever its perm (max of read and write queues), so a write-only topic on a broker the
    route leaves out, or its write queues beyond the read ones, failed a one-topic read again, naming
    queues it would not read even once the route lists the broker: the topic's config (GET_TOPIC_CONFIG)
    narrows them to readQueueNums with PERM_READ, as the listing does."""
    route = _route_of_a_in_a_cluster_with_x(a_addr="127.0.0.1:1")

    def answer(c: FakeCluster, request: RemotingCommand) -> RemotingCommand:
        topic = (request.ext_fields or {}).get("topic", "")
        if request.code == RequestCode.GET_TOPIC_STATS_INFO:  # AdminBrokerProcessor: max(read, write)
            conf = _PERMS[topic]
            return _stats_answer("x", max(int(conf["readQueueNums"]), int(conf["writeQueueNums"])), topic)
        if request.code == RequestCode.GET_TOPIC_CONFIG:
            return RemotingCommand.response(ResponseCode.SUCCESS, 0, body=json.dumps(_PERMS[topic]).encode())
        return route(c, request)

    c = FakeCluster(answer)
    try:
        assert _unlisted(c, list(_PERMS)) == _READ_OF_PERMS
        assert c.asked[RequestCode.GET_ALL_TOPIC_CONFIG] == 0
        assert c.asked[RequestCode.GET_TOPIC_CONFIG] == 3
    finally:
        c.close()
