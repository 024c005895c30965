"""Apache RocketMQ as a backend: name servers, brokers, RocketMQ's remoting protocol and records.

Pure Python (no JVM in Spark's workers): :mod:`pyspark_pymq.rocketmq` speaks the
protocol (:mod:`~pyspark_pymq.rocketmq.remoting`, ``api``, ``route``) and reads
and writes RocketMQ's ``MessageDecoder`` layout (:mod:`~pyspark_pymq.rocketmq.codec`).
This module maps that onto :class:`~pyspark_pymq.backend.base.Backend`:

- routes come from the name servers (``GET_ROUTEINFO_BY_TOPIC``); every broker
  of a topic's route is read and written, each at its master's address;
- a pull is ``PULL_MESSAGE`` without offset commit or long polling; a tag
  subscription is checked again on the client, since brokers filter tags by
  hash code only (as ``PullAPIWrapper.processPullResult`` does);
- a send of one message is ``SEND_MESSAGE_V2``; of several, one
  ``SEND_BATCH_MESSAGE`` (``MessageDecoder.encodeMessages`` body);
- progress is ``UPDATE_CONSUMER_OFFSET`` (so ``mqadmin consumerProgress`` and
  RocketMQ Dashboard show the lag), a send back ``CONSUMER_SEND_MSG_BACK`` (the
  real broker's retry ladder and ``%DLQ%`` apply).

What differs from the embedded broker: CONSUMER_SEND_MSG_BACK carries no extra
properties, so the failure reasons pymq attaches to sent-back messages are kept
only where pymq falls back to sending the copy itself. Transactional half messages
(``TRAN_MSG=true``) go one at a time with ``TRANSACTION_PREPARED_TYPE`` set, as RocketMQ's
client sends them; their end and check-back are
:class:`~pyspark_pymq.rocketmq.transaction.RocketMQTransactionProducer`'s.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from pymq_proto.topics import is_retry_topic, is_system_topic

from ..client.message import MessageExt, MessageQueue, PullStatus, SendBackColumns, SendResult
from ..client.route import TopicRoute
from ..errors import (
    GROUP_NOT_EXIST,
    BrokerNotReadableError,
    BrokerUnavailableError,
    PymqError,
    RequestTimeoutError,
    SystemBusyError,
    TopicNotExistError,
)
from ..rocketmq import codec
from ..rocketmq.api import (
    ConsumerData,
    MQClientAPI,
    PullResultExt,
    SubscriptionData,
    build_pull_sys_flag,
    default_client_id,
    java_string_hash,
)
from ..rocketmq.remoting import RemotingClient, SessionCredentials
from ..rocketmq.route import BrokerData, NameServerClient, RouteCache
from .base import (
    Backend,
    BackendConfig,
    PullBatch,
    QueueBounds,
    SendBackOutcome,
    SendRequest,
    filter_batch_by_tags,
    filter_by_tags,
    first_queue_per_broker,
    subscribed_tags,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["RocketMQBackend"]

log = logging.getLogger(__name__)

_QUEUE_OFFSET = struct.Struct(">q")
_QUEUE_OFFSET_AT = 20  # QUEUEOFFSET in MessageDecoder's record
_BATCH_ITEM_FIXED = 4 * 5 + 2  # encodeMessages: TOTALSIZE MAGIC BODYCRC FLAG BODYLEN, PROPERTIESLENGTH
DEFAULT_MAX_RECONSUME_TIMES = 16  # a consumer's -1: RocketMQ's default
# Brokers answer at most maxTransferCountOnMessageInMemory (32) messages per pull by default:
# an unfiltered pull of more goes out as pulls of that many, up to PULL_WINDOW in flight; as
# soon as PULL_REFILL of them are answered, as many more go out.
PULL_WINDOW = 64
PULL_REFILL = 32
# A learned per-pull cap is probed again (one single pull) when it is this old.
PULL_CAP_TTL_S = 60.0
# MessageStoreConfig.mappedFileSizeConsumeQueue / 20: a pull does not cross a consume queue file.
CONSUME_QUEUE_FILE_ENTRIES = 300_000
SEND_BACK_WINDOW = 256  # CONSUMER_SEND_MSG_BACK requests in flight
_TRAN_MSG = "TRAN_MSG"  # MessageConst.PROPERTY_TRANSACTION_PREPARED
_RECONSUME_TIME = "RECONSUME_TIME"  # MessageConst.PROPERTY_RECONSUME_TIME
_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"  # MessageConst.PROPERTY_MAX_RECONSUME_TIMES
# Whether a slave serves reads is asked again after this long: once per broker without a master
# and interval, not at every trigger (its slaveReadEnable changes only by updateBrokerConfig or a restart).
SLAVE_READ_TTL_S = 10.0
# How a broker's remoting server answers a request its processor rejects (NettyRemotingAbstract:
# SYSTEM_BUSY "[REJECTREQUEST]system busy, ..."); a pull is rejected only by a slave with
# slaveReadEnable=false (PullMessageProcessor.rejectRequest), before the group or topic is looked at.
_REJECT_REQUEST = "[REJECTREQUEST]"


class RocketMQBackend(Backend):
    """Apache RocketMQ 4.x/5.x clusters reached through their name servers (``namesrvAddr``)."""

    default_max_reconsume_times = DEFAULT_MAX_RECONSUME_TIMES  # as RocketMQ's push consumer sends
    # ConsumerManageProcessor.updateConsumerOffset takes any queue id, and commit_offsets sends
    # one queue per request: a queue cut by a scale-in refuses nothing else's progress
    takes_progress_of_unread_queues = True

    def __init__(self, config: BackendConfig, timeout_s: float = 10.0) -> None:
        assert config.namesrv_addr, "RocketMQBackend needs namesrv_addr"
        self.config = config
        self.timeout_s = timeout_s
        credentials = (
            SessionCredentials(config.access_key, config.secret_key)
            if config.access_key and config.secret_key else None
        )
        self.remoting = RemotingClient.shared(credentials, config.tls)
        self.namesrv = NameServerClient(config.namesrv_addr, remoting=self.remoting, timeout_s=timeout_s)
        self._routes = RouteCache(self.namesrv)
        self.api = MQClientAPI(self.remoting, timeout_s=timeout_s)
        # broker address -> how many messages it answers per pull at most (learned), and when
        self._pull_caps: dict[str, tuple[int, float]] = {}
        # slave address -> whether it serves pulls (slaveReadEnable), and when that was asked
        self._slave_reads: dict[str, tuple[bool, float]] = {}
        self._told_unreadable: set[str] = set()  # slaves warned about (once per outage)

    def _addr(self, mq: MessageQueue) -> str:
        return self._routes.broker_addr(mq.topic, mq.broker_name)

    def broker_addr(self, mq: MessageQueue) -> str:
        """The master address of ``mq``'s broker, from the topic's route."""
        return self._routes.broker_addr(mq.topic, mq.broker_name)

    def _master_addr(self, broker_name: str) -> str:
        """The master address of ``broker_name``, whatever topic: from any route held, else from
        the name servers' cluster info.

        A send back goes to the broker that stores the message, which its original topic's
        route may no longer list (the topic deleted, or a retried message on a broker its
        original topic is not on); RocketMQ's consumer finds the broker by name
        (``DefaultMQPushConsumerImpl.sendMessageBack``: ``findBrokerAddressInPublish``).
        """
        addr = self._routes.master_addr(broker_name)
        if addr is None:
            addr = self.namesrv.get_broker_addrs().get(broker_name)
        if addr is None:
            raise BrokerUnavailableError(
                f"broker {broker_name!r} is not registered with the name servers "
                f"{self.config.namesrv_addr}: it is down, or its name is not this cluster's"
            )
        return addr

    # -- routes and offsets -----------------------------------------------------------------

    def sharding_index(self, sharding_key: str, queues: int) -> int:
        """RocketMQ's SelectMessageQueueByHash over the route's publish queues (brokers by name,
        then queue id, as Java's TopicPublishInfo): ``Math.abs(key.hashCode() % size)``, so that
        pymq's and Java's producers put a key's messages in the same queue."""
        return abs(java_string_hash(sharding_key)) % queues

    def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        return self._routes.get(topic, refresh=refresh)

    def _broker_bounds(self, topic: str, broker_name: str) -> dict[MessageQueue, QueueBounds] | None:
        addr = self._routes.broker_addr(topic, broker_name)
        # A slave answers stats whether it serves pulls or not: bounds of one that does not would
        # plan ranges whose every pull it refuses, until pollTimeoutMs fails the query.
        self._check_reads(topic, broker_name, addr)
        try:
            found = self.api.get_topic_stats_info(addr, topic)
        except TopicNotExistError:
            return {}  # the route still names a broker that dropped the topic
        return {mq: QueueBounds(o.min_offset, o.max_offset) for mq, o in found.items()}

    def _check_reads(self, topic: str, broker_name: str, addr: str) -> None:
        """BrokerNotReadableError when ``addr``, where the route of ``topic`` sends the reads of
        ``broker_name``, is a slave that refuses pulls: the master is not registered (down, or
        restarting) and the slave runs with RocketMQ's default slaveReadEnable=false. Its queues
        then wait, as a broker's that does not answer (see :meth:`Backend.queue_bounds`)."""
        broker = self._routes.route_data(topic).broker(broker_name)
        if broker is None or broker.master_addr is not None:
            if broker is not None:  # the master is back: a later outage is told again
                self._told_unreadable.difference_update(broker.broker_addrs.values())
            return
        if self._slave_serves_reads(addr):
            return
        why = self._unreadable(broker_name, addr, broker)
        if addr not in self._told_unreadable:  # once per outage: the driver asks at every trigger
            self._told_unreadable.add(addr)
            log.warning("%s", why)
        raise BrokerNotReadableError(why)

    def _slave_serves_reads(self, addr: str) -> bool:
        """Whether the slave at ``addr`` serves pulls: what PullMessageProcessor.rejectRequest
        decides from its configuration (GET_BROKER_CONFIG), remembered SLAVE_READ_TTL_S."""
        now = time.monotonic()
        known = self._slave_reads.get(addr)
        if known is not None and now - known[1] < SLAVE_READ_TTL_S:
            return known[0]
        try:
            config = self.api.get_broker_config(addr)
        except (BrokerUnavailableError, RequestTimeoutError):
            raise  # a broker that does not answer: its queues wait anyway
        except PymqError as err:
            # A broker that does not say (an ACL refusing the request, an old or foreign broker):
            # planned as readable, its pulls tell if it is not (see pull).
            log.info("broker %s does not give its configuration (%s): its queues are planned as "
                     "readable", addr, err)
            readable = True
        else:
            readable = (config.get("slaveReadEnable", "false").lower() == "true"
                        or config.get("brokerRole", "SLAVE").upper() != "SLAVE")
        self._slave_reads[addr] = (readable, now)
        if readable:
            self._told_unreadable.discard(addr)
        return readable

    def _unreadable(self, broker_name: str, addr: str, broker: BrokerData | None) -> str:
        """Why ``broker_name`` serves no reads: its master is down, its slave at ``addr`` refuses pulls."""
        ids = sorted(i for i, a in (broker.broker_addrs.items() if broker else ()) if a == addr)
        slave = f"slave {addr} (brokerId {ids[0]})" if ids else f"slave {addr}"
        return (
            f"broker {broker_name!r} serves no reads: its master (brokerId 0) is not registered with "
            f"the name servers {self.config.namesrv_addr} (down or restarting), and its {slave} runs "
            "with slaveReadEnable=false (RocketMQ's default), so it refuses every pull "
            "([REJECTREQUEST]). Its queues are read on once the master is back; to read them from "
            f"the slave meanwhile, set slaveReadEnable=true on it (mqadmin updateBrokerConfig -b {addr} "
            "-k slaveReadEnable -v true)"
        )

    def unavailable_brokers(self, queues: Iterable[MessageQueue]) -> set[str]:
        # ``queues`` are missing from their topics' routes. A broker that is not registered is
        # down; a registered one is asked itself, because the name servers lag behind a
        # restart (they unregister a dead broker's channel asynchronously and may drop the
        # routes of its new registration until its next heartbeat, 30 s later): a broker
        # that still holds such a queue, or does not answer, keeps it waiting.
        by_broker: dict[str, set[MessageQueue]] = {}
        for mq in queues:
            by_broker.setdefault(mq.broker_name, set()).add(mq)
        if not by_broker:
            return set()
        registered = self.namesrv.get_broker_addrs()
        out = set(by_broker) - set(registered)
        for broker in sorted(set(by_broker) & set(registered)):
            for topic in sorted({mq.topic for mq in by_broker[broker]}):
                try:
                    held = self.api.get_topic_stats_info(registered[broker], topic)
                except TopicNotExistError:
                    continue
                except (BrokerUnavailableError, RequestTimeoutError):
                    out.add(broker)
                    break
                if by_broker[broker] & set(held):
                    out.add(broker)
                    break
        return out

    # A broker asked about this many of a read's topics answers them all with one listing of its topic
    # table (which also tells a write-only topic's queues, not read, from readable ones); fewer, with
    # one stats request per topic (the queues of the topic config, whatever its perm).
    LISTING_FROM_TOPICS = 16

    def unlisted_queues(self, topics: Sequence[str]) -> dict[str, dict[str, list[MessageQueue]]]:
        # The brokers registered now in the clusters of each topic's route, that the route does not
        # list, are asked which of the topics they hold: the name servers take a broker's routes from
        # its registrations, and drop them when its channel closes, which may come after a restarted
        # broker registered again (its routes are back only with its next topic change or a new
        # registration), or after a route deleted on the name servers alone. Without this a batch
        # read of such a topic had the listed brokers' rows only, and said nothing.
        # One GET_BROKER_CLUSTER_INFO, then (none where every broker of the cluster has the topic, as
        # `mqadmin updateTopic -c` makes it) each such broker asked about LISTING_FROM_TOPICS topics
        # or more gets one GET_ALL_TOPIC_CONFIG, one asked about fewer a GET_TOPIC_STATS_INFO per
        # topic, all at once: a stats request per topic and broker, one after the other, made a read
        # of 100 topics on 1 of 10 brokers wait for 900 round trips; a listing for a read of one topic
        # downloaded and parsed the broker's whole topic table (100,000 topics: 18.5 MB, 0.3-9 s).
        out: dict[str, dict[str, list[MessageQueue]]] = {}
        if not topics:
            return out
        info = self.namesrv.get_cluster_info()
        asked: dict[str, list[str]] = {}  # broker -> the topics whose routes leave it out
        for topic in dict.fromkeys(topics):
            try:
                route = self._routes.route_data(topic)
            except TopicNotExistError:
                continue
            listed = {q.broker_name for q in route.queue_datas} | {b.broker_name for b in route.broker_datas}
            clusters = {b.cluster for b in route.broker_datas}
            others = set[str]().union(*(info.clusters.get(c, ()) for c in clusters)) - listed
            for broker in sorted(others):
                if info.broker_addrs.get(broker) is not None:
                    asked.setdefault(broker, []).append(topic)
        by_stats = {b: t for b, t in asked.items() if len(t) < self.LISTING_FROM_TOPICS}
        listing = {b: t for b, t in asked.items() if b not in by_stats}
        held = self._held_by_listing(listing, info.broker_addrs, refused=by_stats)
        held.update(self._readable(self._held_by_stats(by_stats, info.broker_addrs), info.broker_addrs))
        for broker, topics_held in held.items():
            for topic, queues in topics_held.items():
                out.setdefault(topic, {})[broker] = queues
        return dict(sorted(out.items()))

    def _held_by_listing(
        self, asked: Mapping[str, Sequence[str]], addrs: Mapping[str, str], *, refused: dict[str, list[str]],
    ) -> dict[str, dict[str, list[MessageQueue]]]:
        """broker -> topic -> the queues a read of it would read there (readQueueNums with PERM_READ),
        by one GET_ALL_TOPIC_CONFIG per broker, all at once. A broker that does not answer cannot tell
        (asked once); one that refuses the listing goes into ``refused``, to be asked per topic."""
        listings = {b: self.api.get_all_topic_config_async(addrs[b]) for b in sorted(asked)}
        out: dict[str, dict[str, list[MessageQueue]]] = {}
        for broker, fut in listings.items():
            try:
                table = fut.result()
            except (BrokerUnavailableError, RequestTimeoutError):
                continue
            except PymqError as err:
                # RocketMQ 5.3.3 checks no permission for the listing; another version or ACL plug-in
                # may: such a broker is asked per topic, as mqadmin topicStatus does
                log.debug("pymq: broker %s refused GET_ALL_TOPIC_CONFIG (%s); asking per topic",
                          broker, err.remark)
                refused[broker] = list(asked[broker])
                continue
            for topic in asked[broker]:
                # a write-only topic, or write queues beyond the read ones, are not read even once a
                # route lists the broker: naming them failed the read
                config = table.get(topic)
                if config is not None and config.read_queue_ids():
                    out.setdefault(broker, {})[topic] = [MessageQueue(topic, broker, q)
                                                         for q in config.read_queue_ids()]
        return out

    def _readable(
        self, held: Mapping[str, Mapping[str, list[MessageQueue]]], addrs: Mapping[str, str],
    ) -> dict[str, dict[str, list[MessageQueue]]]:
        """``held`` (by stats: the topic config's queues, whatever its perm, max of read and write)
        narrowed to those a read reads, by each held topic's config (GET_TOPIC_CONFIG, RocketMQ 5),
        all at once; a broker that cannot tell (4.x, a refusal, no answer) keeps the stats' queues."""
        configs = {(b, t): self.api.get_topic_config_async(addrs[b], t) for b, topics in held.items()
                   for t in topics}
        out: dict[str, dict[str, list[MessageQueue]]] = {}
        for (broker, topic), fut in configs.items():
            queues = held[broker][topic]
            try:
                ids = fut.result().read_queue_ids()
            except PymqError as err:
                log.debug("pymq: broker %s did not give topic %r's config (%s); its stats' queues count",
                          broker, topic, err.remark)
            else:
                queues = [mq for mq in queues if mq.queue_id in ids]
            if queues:
                out.setdefault(broker, {})[topic] = queues
        return out

    def _held_by_stats(
        self, asked: Mapping[str, Sequence[str]], addrs: Mapping[str, str],
    ) -> dict[str, dict[str, list[MessageQueue]]]:
        """broker -> topic -> its queues there, by a GET_TOPIC_STATS_INFO per topic: the first topic's
        of every broker at once, then, of each that answered it, the others' at once (a broker that
        does not answer, or refuses the user, is asked once)."""
        out: dict[str, dict[str, list[MessageQueue]]] = {}

        def ask(wanted: Mapping[str, Sequence[str]]) -> set[str]:
            futs = {(b, t): self.api.get_topic_stats_info_async(addrs[b], t)
                    for b, topics in wanted.items() for t in topics}
            silent: set[str] = set()
            for (broker, topic), fut in futs.items():
                try:
                    held = fut.result()
                except TopicNotExistError:
                    continue  # not there
                except (BrokerUnavailableError, RequestTimeoutError):
                    silent.add(broker)  # a broker that does not answer, which cannot tell
                    continue
                except PymqError as err:
                    # one that refuses (a user its ACLs do not know: RocketMQ 5's users and ACLs are
                    # made per broker with -b) cannot tell either: this look is the read's own, it
                    # must not fail a read of brokers that serve it
                    if broker not in silent:
                        log.warning("pymq: broker %s (%s), which the route of topic %r does not list, "
                                    "could not be asked whether it holds queues of it: %s", broker,
                                    addrs[broker], topic, err.remark)
                    silent.add(broker)
                    continue
                if held:
                    out.setdefault(broker, {})[topic] = sorted(held)
            return silent

        silent = ask({b: topics[:1] for b, topics in asked.items()})
        ask({b: topics[1:] for b, topics in asked.items() if b not in silent and len(topics) > 1})
        return out

    def topic_names(self) -> list[str]:
        # the name servers list every topic, RocketMQ's own and those named after its brokers and
        # clusters too (as RocketMQAdmin.topic_names leaves them out)
        own = self.namesrv.get_cluster_info().own_topics()
        return [t for t in self.namesrv.get_all_topics() if not is_system_topic(t, own)]

    def min_offset(self, mq: MessageQueue) -> int:
        return self.api.get_min_offset(self._addr(mq), mq)

    def max_offset(self, mq: MessageQueue) -> int:
        return self.api.get_max_offset(self._addr(mq), mq)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self.api.search_offset(self._addr(mq), mq, timestamp_ms)

    def committed(self, group: str, mq: MessageQueue) -> int:
        # RocketMQ answers 0 for a group that never committed on a queue still starting at 0
        # (setZeroIfNotFound); pymq's contract is -1 for "no progress", so that
        # consumeFromWhere decides where such a group starts, as on the embedded broker.
        return self.api.query_consumer_offset(self._addr(mq), group, mq, set_zero_if_not_found=False)

    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        # A broker that is down must not hold back the progress kept on the others: its
        # queues are skipped (the next commit carries them) and the first failure raised last.
        failed: PymqError | None = None
        down: set[str] = set()
        for mq, offset in offsets.items():
            if mq.broker_name in down:
                continue
            try:
                self.api.update_consumer_offset(self._addr(mq), group, mq, offset)
            except (BrokerUnavailableError, RequestTimeoutError) as err:
                down.add(mq.broker_name)
                failed = failed or err
            except PymqError as err:
                if err.code != GROUP_NOT_EXIST:
                    raise
                raise self._no_group(err, group, mq, f"its progress on {mq} cannot be kept") from None
        if failed is not None:
            raise failed

    def _no_group(self, err: PymqError, group: str, mq: MessageQueue, what: str) -> PymqError:
        """``err`` (SUBSCRIPTION_GROUP_NOT_EXIST from ``mq``'s broker) saying how to make ``group``."""
        return type(err)(
            f"consumer group {group!r} does not exist on broker {mq.broker_name!r}, so {what}: "
            f"create it (mqadmin updateSubGroup -n {self.config.namesrv_addr} -c <cluster> -g {group}) "
            "or enable the brokers' autoCreateSubscriptionGroup (a pull creates the group then)",
            code=err.code,
        )

    def check_consumer_group(self, group: str, queues: Iterable[MessageQueue]) -> None:
        # One pull per broker at a queue's end (nothing to transfer): a broker that does not
        # create groups (autoCreateSubscriptionGroup=false) refuses an unknown one before the
        # group is checked against the topic (PullMessageProcessor), and one that does creates
        # it now, as the first pull of a task would. Other errors are the pulls' own to report.
        first = first_queue_per_broker(queues)
        for mq in first.values():
            try:
                self.pull(group, mq, self.max_offset(mq), 1)
            except PymqError as err:
                if err.code == GROUP_NOT_EXIST:
                    raise

    def _check_client_config(
        self, group: str, mq: MessageQueue, subscription: str, expression_type: str
    ) -> None:
        # as RocketMQ's push consumer at its start (checkClientInBroker)
        data = SubscriptionData(mq.topic, subscription, expression_type)
        try:
            self.api.check_client_config(self._addr(mq), default_client_id(), group, data)
        except PymqError as err:
            # a broker that does not know the request, or an ACL without a rule for it: the
            # pulls say what is wrong, if anything
            if err.code not in ("REQUEST_CODE_NOT_SUPPORTED", "NO_PERMISSION"):
                raise

    def register_consumer(self, group: str, topics: Sequence[str]) -> None:
        # One HEART_BEAT per broker creates %RETRY%<group> (and the group, where the brokers
        # auto-create groups); the client is unregistered at once, so that push consumers
        # of the same group never count this process when they share out queues.
        read = [t for t in topics if not is_retry_topic(t)]
        data = ConsumerData.for_topics(group, read)
        client_id = default_client_id()
        if read:
            addrs = {addr for t in read for addr in self._routes.get(t).endpoints.values()}
        else:
            # No topic names the brokers: every master registered now, so that %RETRY%<group> is
            # on each broker a send back (or its copy) may have to use, the live ones when one is
            # down. A broker that does not answer is skipped; none answering is the error.
            addrs = set(self.namesrv.get_broker_addrs().values())
        failed: PymqError | None = None
        answered = False
        for addr in sorted(addrs):
            try:
                self.api.heartbeat(addr, client_id, [data])
                self.api.unregister_client(addr, client_id, consumer_group=group)
            except (BrokerUnavailableError, RequestTimeoutError) as err:
                if read:  # the topics' brokers are the ones the stream reads: each must answer
                    raise
                failed = failed or err
                continue
            answered = True
        if failed is not None and not answered:
            raise failed

    # -- pull -------------------------------------------------------------------------------

    def pull(
        self,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
        timeout_s: float | None = None,
    ) -> PullBatch:
        addr = self._addr(mq)
        while True:
            try:
                pulled = self._pull(addr, group, mq, offset, max_nums, subscription, expression_type,
                                    suspend_timeout_ms, timeout_s)
            except PymqError as err:
                if err.code == GROUP_NOT_EXIST:
                    raise self._no_group(err, group, mq, f"{mq} cannot be pulled with it") from None
                if not (isinstance(err, SystemBusyError) and _REJECT_REQUEST in err.remark):
                    raise
                rejected = True
            else:
                # PULL_RETRY_IMMEDIATELY without moving on: a slave that has not the message yet
                # sends the puller to its master (PullMessageProcessor: a slave whose group has a
                # master answers any miss so); read as "nothing matched" it would skip the offset
                if not (pulled.status is PullStatus.NO_MATCHED_MSG and pulled.next_begin_offset <= offset):
                    return pulled
                rejected = False
            # A slave refused the pull (slaveReadEnable=false) or has not the message yet: the
            # route held here named it for a broker without a master, for a range planned before
            # the master went down or after it came back. Its master may be registered again: the
            # route is asked again (at most every ROUTE_RETRY_AFTER_S, so this ends), and the pull
            # goes to the master.
            broker = self._routes.reread(mq.topic).broker(mq.broker_name)
            master = broker.master_addr if broker is not None else None
            if master is None or master == addr:
                # Retriable: the read loop tries again until pollTimeoutMs, as for a broker that
                # is down, since a master's restart takes seconds; Spark's own task retries
                # would come at once, and fail the query after spark.task.maxFailures.
                why = (self._unreadable(mq.broker_name, addr, broker) if rejected else
                       f"broker {addr} answered PULL_RETRY_IMMEDIATELY at offset {offset} (a slave "
                       "behind its master, or a commit log file being removed): asked again")
                raise BrokerUnavailableError(f"{mq} cannot be pulled: {why}") from None
            addr = master

    def _pull(
        self, addr: str, group: str, mq: MessageQueue, offset: int, max_nums: int, subscription: str,
        expression_type: str, suspend_timeout_ms: int, timeout_s: float | None,
    ) -> PullBatch:
        # RocketMQ's broker reads " * " as the tag "*" (FilterAPI.buildSubscriptionData trims
        # only each tag): nothing would match, while every other place here reads it as all
        subscription = subscription.strip() or "*"
        plain = expression_type == "TAG" and subscription == "*" and not suspend_timeout_ms
        learned = self._pull_caps.get(addr)
        now = time.monotonic()
        if plain and learned is not None and max_nums > learned[0] and now - learned[1] < PULL_CAP_TTL_S:
            return self._pull_window(addr, group, mq, offset, max_nums, learned[0], timeout_s)
        # A single pull: the first of this broker, one of a few messages, or a probe of a cap
        # learned a while ago (the broker's settings may have changed, or its byte cap bound).
        r = self._pull_one(addr, group, mq, offset, max_nums, subscription, expression_type,
                           suspend_timeout_ms, timeout_s)
        short = r.next_begin_offset < min(offset + max_nums, r.max_offset)
        if plain and r.status is PullStatus.FOUND and short:
            # fewer than asked while the queue has more: the broker's per-pull cap
            # (maxTransferCountOnMessageInMemory, 32 by default; or its byte cap)
            self._learn_cap(addr, r.next_begin_offset - offset, r.next_begin_offset, now)
        return r

    def _learn_cap(self, addr: str, got: int, next_offset: int, now: float) -> None:
        # A pull also ends at the end of a consume queue file (300,000 entries by default):
        # an answer cut there says nothing about the broker's caps.
        if next_offset % CONSUME_QUEUE_FILE_ENTRIES:
            self._pull_caps[addr] = (max(1, got), now)

    def _pull_one(
        self, addr: str, group: str, mq: MessageQueue, offset: int, max_nums: int, subscription: str,
        expression_type: str, suspend_timeout_ms: int, timeout_s: float | None,
    ) -> PullBatch:
        r = self.api.pull_message(
            addr, group, mq, offset, max_nums,
            sub_expression=subscription or "*", expression_type=expression_type,
            sys_flag=build_pull_sys_flag(suspend=suspend_timeout_ms > 0),
            suspend_timeout_ms=suspend_timeout_ms, timeout_s=timeout_s,
        )  # fmt: skip
        return _pull_batch(r, offset)

    def _pull_window(
        self, addr: str, group: str, mq: MessageQueue, offset: int, max_nums: int, cap: int,
        timeout_s: float | None,
    ) -> PullBatch:
        """One pull of up to ``max_nums`` messages as pulls of ``cap``, PULL_WINDOW of them in flight.

        Queue offsets are dense, so the sub-ranges of an unfiltered pull are known
        before any answer (:meth:`MQClientAPI.pull_range`); the answers are joined in
        order and the pull stops at the first one that came back short (the read loop
        goes on from there). A short answer while the queue holds more lowers the cap.
        """
        r = self.api.pull_range(addr, group, mq, offset, max_nums, cap, window=PULL_WINDOW,
                                refill=PULL_REFILL, sys_flag=build_pull_sys_flag(), timeout_s=timeout_s)
        if r.status is not PullStatus.FOUND:
            return PullBatch(r.status, r.next_begin_offset, r.min_offset, r.max_offset)
        if r.short is not None and r.short < cap:
            self._learn_cap(addr, r.short, r.next_begin_offset, time.monotonic())
        records = r.message_binary
        first = _QUEUE_OFFSET.unpack_from(records, _QUEUE_OFFSET_AT)[0] if len(records) >= 28 else -1
        return PullBatch(PullStatus.FOUND, r.next_begin_offset, r.min_offset, r.max_offset,
                         records, r.next_begin_offset - offset, first)

    def decode_arrow(
        self,
        pulled: PullBatch,
        mq: MessageQueue,
        *,
        retry: bool,
        end_offset: int | None = None,
        subscription: str = "*",
        expression_type: str = "TAG",
        columns: tuple[str, ...] | None = None,
    ) -> pa.RecordBatch:
        tags = subscribed_tags(subscription, expression_type)
        if tags and columns is not None and "tags" not in columns:
            columns = (*columns, "tags")  # the filter below reads them
        batch = codec.decode_to_arrow(
            pulled.records, topic=mq.topic, broker_name=mq.broker_name, retry=retry, end_offset=end_offset,
            columns=columns,
        )
        return filter_batch_by_tags(batch, tags) if tags else batch

    def decode_messages(
        self, pulled: PullBatch, mq: MessageQueue, *, subscription: str = "*", expression_type: str = "TAG"
    ) -> list[MessageExt]:
        messages = codec.decode_messages(pulled.records, mq.broker_name) if pulled.records else []
        tags = subscribed_tags(subscription, expression_type)
        return filter_by_tags(messages, tags) if tags else messages

    # -- send -------------------------------------------------------------------------------

    def encode_records(
        self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes],
        flags: Sequence[int] | None = None,
    ) -> tuple[bytes, npt.NDArray[np.int32]]:
        flag_of = flags or [0] * len(bodies)
        records = codec.encode_batch(zip(bodies, flag_of, properties, strict=True))
        sizes = np.fromiter(
            (_BATCH_ITEM_FIXED + len(b) + len(p) for b, p in zip(bodies, properties, strict=True)),
            dtype=np.int32, count=len(bodies),
        )
        return records, sizes

    def frame_columns(
        self, topic: str, bodies: pa.Array, body_lens: npt.NDArray[np.int64],
        property_parts: Sequence[pa.Array | pa.Scalar], property_lens: npt.NDArray[np.int64],
    ) -> tuple[bytes, npt.NDArray[np.int32]] | None:
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..arrow_arrays import binary_scalar

        if int(property_lens.max(initial=0)) > 32767:  # RocketMQ keeps the length in a short
            return None
        props = pc.binary_join_element_wise(*property_parts, binary_scalar(b""))
        if isinstance(props, pa.Scalar):  # every part was shared by all rows
            props = pa.array([props.as_py()] * len(body_lens), pa.binary())
        records = codec.encode_batch_columns(bodies, props)
        return records, (_BATCH_ITEM_FIXED + body_lens + property_lens).astype(np.int32)

    @staticmethod
    def _check_half(half: bool, count: int) -> None:
        # RocketMQ stores no batch of half messages (SEND_BATCH_MESSAGE refuses TRAN_MSG): the
        # exactly-once sink's HalfMessageProducer is not built on this backend.
        if half and count > 1:
            raise PymqError(
                "batches of transactional (half) messages are not sent to Apache RocketMQ: "
                "RocketMQ stores half messages one at a time (TransactionProducer sends them so); "
                "use a pymq endpoint for deliveryGuarantee=exactly-once",
                code="NOT_SUPPORTED",
            )

    def send(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, *,
        half: bool = False,
    ) -> SendResult:
        result: SendResult = self._send(producer_group, request, mq, timeout_s, half, wait=True)
        return result

    def send_future(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, *,
        half: bool = False,
    ) -> Future[SendResult]:
        future: Future[SendResult] = self._send(producer_group, request, mq, timeout_s, half, wait=False)
        return future

    def _send(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, half: bool,
        *, wait: bool,
    ) -> Any:
        """One message: SEND_MESSAGE_V2 (header properties); several: SEND_BATCH_MESSAGE."""
        self._check_half(half, len(request.sizes))
        addr = self._addr(mq)
        api = self.api
        records = bytes(request.records)  # the same object when it is bytes already
        if len(request.sizes) == 1:
            body, flag, props = codec.decode_batch(records)[0]
            # TRAN_MSG=true makes it a half message (DefaultMQProducerImpl.sendKernelImpl), but for
            # a consumer's own copy to %RETRY% (the broker's exception in SendMessageProcessor)
            tran = props.get(_TRAN_MSG) == "true" and not (
                request.reconsume_times > 0 and props.get("DELAY", "0") not in ("", "0"))
            sys_flag = codec.MessageSysFlag.TRANSACTION_PREPARED_TYPE if half or tran else 0
            reconsume_times, max_times = request.reconsume_times or None, None
            if is_retry_topic(mq.topic):
                # a consumer's own copy to %RETRY%: its counts go in the request header, where the
                # broker's retry and DLQ rule reads them (DefaultMQProducerImpl.sendKernelImpl)
                props = dict(props)
                told = props.pop(_RECONSUME_TIME, None)
                reconsume_times = reconsume_times or (int(told) if told and told.isdecimal() else None)
                most = props.pop(_MAX_RECONSUME_TIMES, None)
                max_times = int(most) if most and most.isdecimal() else None
            single = api.send_message if wait else api.send_message_async
            return single(addr, mq, body, props, producer_group=producer_group, flag=flag, sys_flag=sys_flag,
                          reconsume_times=reconsume_times, max_reconsume_times=max_times, timeout_s=timeout_s)
        batch = api.send_batch_message if wait else api.send_batch_message_async
        return batch(addr, mq, records, request.uniq_keys, producer_group=producer_group,
                     timeout_s=timeout_s)

    # -- send back --------------------------------------------------------------------------

    def send_back(
        self, group: str, columns: SendBackColumns, max_reconsume_times: int | None
    ) -> list[SendBackOutcome | None]:
        max_times = max_reconsume_times or self.default_max_reconsume_times
        try:
            addr = self._master_addr(columns.broker_name)
        except PymqError:
            return [None] * len(columns.commit_log_offsets)  # each item falls back to a direct send
        # all at once (the broker works on them while more arrive), at most SEND_BACK_WINDOW in flight
        out: list[SendBackOutcome | None] = []
        n = len(columns.commit_log_offsets)
        for a in range(0, n, SEND_BACK_WINDOW):
            futures = [
                self.api.consumer_send_msg_back_async(
                    addr, group, columns.commit_log_offsets[i], columns.delay_levels[i],
                    columns.origin_msg_ids[i] if columns.origin_msg_ids else "",
                    columns.origin_topics[i] if columns.origin_topics else "",
                    max_times, broker_name=columns.broker_name,
                )
                for i in range(a, min(n, a + SEND_BACK_WINDOW))
            ]
            for i, future in enumerate(futures, start=a):
                try:
                    future.result()
                except PymqError:
                    out.append(None)
                    continue
                # the broker's rule (SendMessageProcessor.consumerSendMsgBack): the DLQ once the
                # message was consumed max times, or when asked with a negative level
                times = columns.reconsume_times[i] if columns.reconsume_times else 0
                out.append(SendBackOutcome(columns.delay_levels[i] < 0 or times >= max_times))
        return out


def _pull_batch(r: PullResultExt, offset: int) -> PullBatch:
    records = bytes(r.message_binary) if r.message_binary else b""
    first = _QUEUE_OFFSET.unpack_from(records, _QUEUE_OFFSET_AT)[0] if len(records) >= 28 else -1
    # The answer does not count its messages: the offsets it covers are an upper bound
    # (it only sizes the Arrow batches of the read loop).
    count = max(0, r.next_begin_offset - offset) if records else 0
    return PullBatch(r.status, r.next_begin_offset, r.min_offset, r.max_offset, records, count, first)


