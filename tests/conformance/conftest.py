"""The ``target`` of a conformance test: the embedded pymq broker, or a real Apache RocketMQ 5.3.3.

``target`` is parametrised over ``["pymq", "rocketmq"]`` and session-scoped, so pytest runs
every pymq case first, then starts the RocketMQ cluster (tests/rocketmq_cluster.py, the
session's ``rocketmq_cluster``) for the rest; ``-k pymq`` never starts a JVM.

Both targets are configured alike: short delay levels (RocketMQ's fixture: 1s 1s 1s 2s ...,
the pymq broker's: 100ms 200ms 300ms ...), SQL92 filters on (RocketMQ's
``enablePropertyFilter=true``, pymq's ``--enable-property-filter``) and the same transaction
check-back timings (first check 2 s after a half message, then every second). Topics are created on
ONE broker, broker-a, on both, so queue ids, offsets and offsetMsgIds compare directly.

The pymq target is a session broker of this package, not the session's ``shared_broker``:
that one runs without ``--enable-property-filter`` and would refuse every SQL92 pull.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from helpers import unique
from pyspark_pymq import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    SendResult,
    TransactionProducer,
)
from pyspark_pymq.backend import Backend, BackendConfig, open_backend
from pyspark_pymq.errors import PymqError
from rocketmq_cluster import TRANSACTION_CHECK_INTERVAL_MS, TRANSACTION_TIMEOUT_MS, RocketMQCluster

# tests/conftest.py's FAST_DELAY_LEVELS (the session's shared_broker runs with the same)
PYMQ_DELAY_LEVELS = (
    "100ms 200ms 300ms 300ms 300ms 300ms 300ms 300ms 300ms "
    "300ms 300ms 300ms 300ms 300ms 300ms 300ms 300ms 300ms"
)
BROKER = "broker-a"
HEX32 = re.compile(r"[0-9A-F]{32}")
# RocketMQ's defaults for what its broker stamps on every stored message (BrokerConfig.regionId,
# traceOn): SendMessageProcessor puts MSG_REGION and TRACE_ON, the cluster name as CLUSTER.
DEFAULT_REGION = "DefaultRegion"


@dataclass
class Target:
    """Where a conformance scenario runs, and the few helpers that differ per broker kind."""

    kind: str  # "pymq" or "rocketmq"
    config: BackendConfig
    store_host: str  # the IP and port an offsetMsgId of broker-a encodes
    store_port: int
    cluster_name: str | None  # CLUSTER of stored messages (None: not known in advance)
    delay_levels: str  # the broker's messageDelayLevel
    cluster: RocketMQCluster | None = None
    admin_endpoint: str | None = None
    _backend: Backend | None = field(default=None, repr=False)

    # -- the client classes, pointed at this target ---------------------------------------------

    @property
    def is_pymq(self) -> bool:
        return self.kind == "pymq"

    @property
    def client_kwargs(self) -> dict[str, str]:
        """``endpoint=`` or ``namesrv_addr=``: what Producer, PullConsumer and Admin take."""
        if self.config.namesrv_addr:
            return {"namesrv_addr": self.config.namesrv_addr}
        assert self.config.endpoint is not None
        return {"endpoint": self.config.endpoint}

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = open_backend(self.config)
        return self._backend

    def producer(self, **kwargs: Any) -> Producer:
        return Producer(**self.client_kwargs, **kwargs)

    def consumer(self, group: str) -> PullConsumer:
        return PullConsumer(group=group, **self.client_kwargs)

    def admin(self) -> Admin:
        return Admin(**self.client_kwargs)

    def transaction_producer(
        self, group: str, check_listener: Callable[[MessageExt], LocalTransactionState]
    ) -> TransactionProducer:
        return TransactionProducer(producer_group=group, check_listener=check_listener, **self.client_kwargs)

    # -- topics and names ------------------------------------------------------------------------

    @staticmethod
    def unique(prefix: str) -> str:
        """A topic or group name no other test uses (the brokers are shared by the session)."""
        return unique(f"cf-{prefix}")

    def create_topic(self, name: str, queues: int) -> str:
        """``name`` with ``queues`` read and write queues (perm 6) on broker-a only."""
        if self.cluster is not None:
            self.cluster.create_topic(name, queues, brokers=[BROKER])
        else:
            assert self.admin_endpoint is not None
            Admin(self.admin_endpoint).create_topic(name, queues)
        # the name servers learn the topic from broker-a's registration: wait for the route
        deadline = time.monotonic() + 30
        while True:
            try:
                if len(self.backend.route(name, refresh=True).publish_queues) == queues:
                    return name
            except PymqError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {name} has no route with {queues} queues after 30 s")
            time.sleep(0.1)

    def topic(self, prefix: str, queues: int = 1) -> str:
        """A new topic (unique name) with ``queues`` queues on broker-a."""
        return self.create_topic(self.unique(prefix), queues)

    def delay_ms(self, level: int) -> int:
        """How long delay level ``level`` (1-based) lasts on this broker, in ms."""
        text = self.delay_levels.split()[level - 1]
        number, unit = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text).groups()  # type: ignore[union-attr]
        return int(number) * {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[unit]

    @staticmethod
    def mq(topic: str, queue_id: int = 0) -> MessageQueue:
        return MessageQueue(topic, BROKER, queue_id)

    # -- waiting for the store ---------------------------------------------------------------------

    def wait_for(self, mq: MessageQueue, n: int, timeout: float = 30.0) -> None:
        """Wait until ``mq`` holds ``n`` messages (its max offset is ``n`` or more).

        RocketMQ acknowledges a send once it is in the commit log; the consume queue entry a
        pull finds comes a moment later (ReputMessageService). Retry, dead-letter and delayed
        copies come later still. A queue of a topic that does not exist yet counts as empty.
        """
        deadline = time.monotonic() + timeout
        have = -1
        while True:
            try:
                have = self.backend.max_offset(mq)
            except PymqError:
                have = -1
            if have >= n:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{mq} holds {max(have, 0)} message(s) after {timeout} s, expected {n}")
            time.sleep(0.1)

    def message_at(self, mq: MessageQueue, offset: int, timeout: float = 30.0) -> MessageExt:
        """The message at ``offset`` of ``mq``, once it is there."""
        self.wait_for(mq, offset + 1, timeout)
        got = self.consumer("cf-browser").pull(mq, offset, 1).messages
        assert len(got) == 1 and got[0].queue_offset == offset, (mq, offset, got)
        return got[0]

    def messages(self, mq: MessageQueue, n: int, timeout: float = 30.0) -> list[MessageExt]:
        """The first ``n`` messages of ``mq``, once it holds them."""
        self.wait_for(mq, n, timeout)
        consumer = self.consumer("cf-browser")
        out: list[MessageExt] = []
        while len(out) < n:
            got = consumer.pull(mq, len(out), n - len(out)).messages
            assert got, (mq, len(out))
            out.extend(got)
        return out

    def broker_stamps(self, stored: dict[str, str]) -> dict[str, str]:
        """What RocketMQ's broker stamps on every message it stores (SendMessageProcessor):
        CLUSTER (the broker's cluster name), MSG_REGION and TRACE_ON (BrokerConfig defaults).

        The embedded broker stamps none, on purpose (README, "Differences from Apache
        RocketMQ"): 72 bytes on every stored message that nothing reads cost 10% of its send
        throughput and 17% of its pull throughput, and stamping would mean rewriting every
        record of the pre-encoded send path.
        """
        if self.is_pymq:
            return {}
        return {"CLUSTER": self.cluster_name or "", "MSG_REGION": DEFAULT_REGION, "TRACE_ON": "true"}

    def find(
        self, mq: MessageQueue, start: int, msg_id: str, reconsume_times: int | None = None,
        timeout: float = 30.0,
    ) -> MessageExt:
        """The first message of ``mq`` at ``start`` or after with ``msg_id`` (and ``reconsume_times``):
        for queues other tests write to as well (SCHEDULE_TOPIC_XXXX, a group's %RETRY%)."""
        consumer = self.consumer("cf-browser")
        deadline = time.monotonic() + timeout
        offset = start
        while True:
            try:
                got = consumer.pull(mq, offset, 32).messages
            except PymqError:  # the topic does not exist yet
                got = []
            for m in got:
                if m.msg_id == msg_id and reconsume_times in (None, m.reconsume_times):
                    return m
            if got:
                offset = got[-1].queue_offset + 1
                continue
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no message {msg_id} (reconsume times {reconsume_times}) in {mq} from offset "
                    f"{start} after {timeout} s"
                )
            time.sleep(0.1)

    def max_offset(self, mq: MessageQueue) -> int:
        """``mq``'s max offset; 0 for a queue of a topic that does not exist yet."""
        try:
            return self.backend.max_offset(mq)
        except PymqError:
            return 0

    # -- what the embedded broker adds on purpose ----------------------------------------------------

    def send_back_extras(self, reconsume_times: int, max_times: int) -> dict[str, str]:
        """Properties the pymq broker adds to every %RETRY% / %DLQ% copy; RocketMQ's broker adds none
        (it keeps the count in the record's RECONSUMETIMES field only)."""
        if not self.is_pymq:
            return {}
        return {"RECONSUME_TIME": str(reconsume_times), "MAX_RECONSUME_TIMES": str(max_times)}

    def half_extras(self, uniq_key: str) -> dict[str, str]:
        """What RocketMQ's broker adds to a half message (and so to the committed message) that the
        embedded broker does not: ``__transactionId__``, a copy of UNIQ_KEY
        (TransactionalMessageBridge.parseHalfMessageInner). README, "one behaviour": pymq's bulk half
        path (the exactly-once sink) re-addresses pre-encoded records with one suffix shared by all."""
        if self.is_pymq:
            return {}
        return {"__transactionId__": uniq_key}

    def check_extras(self) -> dict[str, str]:
        """What the message of a RocketMQ check-back carries besides the stored half message's
        properties: WAIT=false (the re-put half message's own flag, put in its properties when the
        broker encodes it for the producer). The embedded broker sends the stored half as it is."""
        if self.is_pymq:
            return {}
        return {"WAIT": "false"}

    def dlq_extras(self, origin_topic: str, origin_msg_id: str) -> dict[str, str]:
        """Properties the pymq broker adds to a %DLQ% copy (what Admin.dead_letters shows): the
        original topic and the same id as ORIGIN_MESSAGE_ID. RocketMQ 5's remoting send back adds
        none (its gRPC proxy sets them when it forwards a message to the DLQ)."""
        if not self.is_pymq:
            return {}
        return {"DLQ_ORIGIN_TOPIC": origin_topic, "DLQ_ORIGIN_MESSAGE_ID": origin_msg_id}


@pytest.fixture(scope="session")
def conformance_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The pymq target: one broker for the session, short delay levels, SQL92 filters on."""
    data: Path = tmp_path_factory.mktemp("conformance-broker")
    args = ["--message-delay-level", PYMQ_DELAY_LEVELS, "--enable-property-filter", "--broker-name", BROKER,
            # the RocketMQ fixture's check-back timings (tests/rocketmq_cluster.py)
            "--transaction-timeout", str(TRANSACTION_TIMEOUT_MS),
            "--transaction-check-interval", str(TRANSACTION_CHECK_INTERVAL_MS)]
    with BrokerProcess(data, args) as proc:
        yield proc


@pytest.fixture(scope="session", params=["pymq", "rocketmq"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "pymq":
        broker: BrokerProcess = request.getfixturevalue("conformance_broker")
        host, _, port = broker.endpoint.rpartition(":")
        return Target("pymq", BackendConfig(endpoint=broker.endpoint), host, int(port), None,
                      PYMQ_DELAY_LEVELS, admin_endpoint=broker.endpoint)
    cluster: RocketMQCluster = request.getfixturevalue("rocketmq_cluster")
    host, _, port = cluster.broker_addrs[BROKER].rpartition(":")
    return Target("rocketmq", BackendConfig(namesrv_addr=cluster.namesrv_addr), host, int(port),
                  cluster.cluster_name, cluster.delay_levels, cluster=cluster)


@dataclass(frozen=True)
class ThreeMessages:
    """A 1-queue topic on broker-a holding exactly three messages, sent by pymq's Producer."""

    topic: str
    mq: MessageQueue
    results: list[SendResult]
    messages: list[MessageExt]


# The three messages of ``three_messages``: (body, tags, keys, user properties).
THREE = [
    (b"m0", "TagA", ("k1", "k2"), {"color": "red"}),
    (b"m1", None, (), {}),
    (b"m2", "TagB", ("k3",), {}),
]


@pytest.fixture(scope="session")
def three_messages(target: Target) -> ThreeMessages:
    """Read-only for the tests: the queue's offsets are 0..2 and its max offset 3."""
    topic = target.topic("three")
    producer = target.producer()
    results = [producer.send_sync(Message(topic, body, tags=tags, keys=keys, properties=props))
               for body, tags, keys, props in THREE]
    mq = target.mq(topic)
    return ThreeMessages(topic, mq, results, target.messages(mq, 3))


@pytest.fixture(scope="session")
def scratch_topic(target: Target) -> str:
    """A 1-queue topic on broker-a that tests add messages to (find yours by SendResult.queue_offset)."""
    return target.topic("scratch")


def send_and_read(target: Target, message: Message) -> tuple[SendResult, MessageExt]:
    """Send ``message`` (sync) and read it back from where the send result says it went."""
    result = target.producer().send_sync(message)
    return result, target.message_at(result.message_queue, result.queue_offset)
