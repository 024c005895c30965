"""Topic routes from RocketMQ name servers: which brokers serve a topic, with how many queues.

A RocketMQ client is configured with name servers only (``namesrvAddr``,
``"host:port;host2:port"``); each broker registers its topics with every name server,
and a client asks one name server (the others if it does not answer) for a topic's
``TopicRouteData``: per broker a ``QueueData`` (read/write queue numbers and
permission) and a ``BrokerData`` (addresses by broker id; id 0 is the master).

Usage::

    ns = NameServerClient("127.0.0.1:9876")
    data = ns.get_route_info("orders")      # TopicRouteData
    routes = RouteCache(ns)
    route = routes.get("orders")            # pymq's TopicRoute (refreshed every 30 s)
    route.subscribe_queues                  # MessageQueue(topic, broker name, queue id)...
    routes.broker_addr("orders", "broker-a")

Queues, as RocketMQ's client builds them (``MQClientInstance.topicRouteData2Topic*Info``):
publish queues are ``writeQueueNums`` per broker with ``PERM_WRITE`` and a master;
subscribe queues are ``readQueueNums`` per broker with ``PERM_READ``; both ordered by
broker name, then queue id. Brokers are named by their real ``brokerName``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymq_proto.topics import not_created_yet

from ..client.message import MessageQueue
from ..client.route import PERM_READ, PERM_WRITE, TopicRoute
from ..errors import (
    CONNECT_HINT,
    NAMESRV_HINT,
    BrokerUnavailableError,
    PymqError,
    RequestTimeoutError,
    TopicNotExistError,
)
from .protocol import RemotingCommand, RequestCode, ResponseCode, loads_fastjson, response_error
from .remoting import RemotingClient, parse_address

__all__ = [
    "BROKERS_SEEN_TTL_S",
    "MASTER_ID",
    "ROUTE_RETRY_AFTER_S",
    "ROUTE_TTL_S",
    "BrokerData",
    "ClusterInfo",
    "NameServerClient",
    "QueueData",
    "RouteCache",
    "TopicRouteData",
    "parse_namesrv_addr",
]

MASTER_ID = 0
ROUTE_TTL_S = 30.0  # RocketMQ's pollNameServerInterval
# After a failed refresh the last route is served this long before asking again, so a name
# server that does not answer costs one time-out per interval, not one per call.
ROUTE_RETRY_AFTER_S = 2.0
DEFAULT_TIMEOUT_S = 3.0
# A name server that showed a broker registered (a route, or its cluster info) over the connection
# open now, less than this ago, has not restarted since: its TOPIC_NOT_EXIST is a missing topic,
# without asking it whether it knows any broker (see NameServerClient._registered).
BROKERS_SEEN_TTL_S = ROUTE_RETRY_AFTER_S


def parse_namesrv_addr(value: object) -> tuple[str, ...]:
    """The addresses of ``"host:port;host2:port"`` (RocketMQ's namesrvAddr), or a ValueError."""
    if isinstance(value, str):
        addrs = tuple(a.strip() for a in value.split(";") if a.strip())
        try:
            for a in addrs:
                parse_address(a)
        except ValueError:
            addrs = ()
        if addrs:
            return addrs
    raise ValueError(
        f"namesrvAddr {value!r} is not a ';'-separated list of name server addresses "
        "'host:port' (e.g. '127.0.0.1:9876' or '10.0.0.1:9876;10.0.0.2:9876')"
    )


@dataclass(frozen=True, slots=True)
class QueueData:
    """A topic's queues on one broker (``QueueData``)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@dataclass(frozen=True, slots=True)
class BrokerData:
    """One broker (master and slaves) of a route (``BrokerData``): addresses by broker id."""

    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str]

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)

    def read_addr(self) -> str | None:
        """The master, else the slave with the lowest id (reads may go to slaves)."""
        if MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MASTER_ID]
        return self.broker_addrs[min(self.broker_addrs)] if self.broker_addrs else None


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """A name server's route of one topic (``TopicRouteData``)."""

    topic: str
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    order_topic_conf: str | None = None
    static: bool = False  # a static topic: topicQueueMappingByBroker maps logical queues

    @staticmethod
    def from_json(topic: str, body: bytes | bytearray | str) -> TopicRouteData:
        """Parse the JSON body of a ``GET_ROUTEINFO_BY_TOPIC`` answer (either fastjson form)."""
        doc = loads_fastjson(body)
        if not isinstance(doc, dict):
            raise ValueError(f"route of topic {topic!r} is not a JSON object: {str(doc)[:200]!r}")
        queues = tuple(
            sorted(
                (
                    QueueData(
                        broker_name=str(q["brokerName"]),
                        read_queue_nums=int(q.get("readQueueNums", 0)),
                        write_queue_nums=int(q.get("writeQueueNums", 0)),
                        perm=int(q.get("perm", 0)),
                        topic_sys_flag=int(q.get("topicSysFlag", 0)),
                    )
                    for q in doc.get("queueDatas") or ()
                ),
                key=lambda q: q.broker_name,
            )
        )
        brokers = tuple(
            sorted(
                (
                    BrokerData(
                        cluster=str(b.get("cluster", "")),
                        broker_name=str(b["brokerName"]),
                        # keys are strings in standard JSON and numbers in fastjson's own form
                        broker_addrs={int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()},
                    )
                    for b in doc.get("brokerDatas") or ()
                ),
                key=lambda b: b.broker_name,
            )
        )
        conf = doc.get("orderTopicConf")
        return TopicRouteData(topic, queues, brokers, str(conf) if conf else None,
                              bool(doc.get("topicQueueMappingByBroker")))

    def broker(self, broker_name: str) -> BrokerData | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b
        return None

    def master_addrs(self) -> dict[str, str]:
        """Broker name -> master address, for brokers that have a master."""
        return {b.broker_name: a for b in self.broker_datas if (a := b.master_addr) is not None}

    def publish_queues(self) -> tuple[MessageQueue, ...]:
        """The queues to send to: writable queues of brokers with a master."""
        masters = self.master_addrs()
        if self.order_topic_conf:
            # "broker-a:4;broker-b:4": an ordered topic's fixed queues (order of the conf kept)
            out: list[MessageQueue] = []
            for item in self.order_topic_conf.split(";"):
                name, _, nums = item.partition(":")
                if name and nums.strip().isdecimal():
                    out.extend(MessageQueue(self.topic, name, i) for i in range(int(nums)))
            return tuple(out)
        return tuple(
            MessageQueue(self.topic, q.broker_name, i)
            for q in self.queue_datas
            if q.perm & PERM_WRITE and q.broker_name in masters
            for i in range(q.write_queue_nums)
        )

    def subscribe_queues(self) -> tuple[MessageQueue, ...]:
        """The queues to read: readable queues of every broker."""
        return tuple(
            MessageQueue(self.topic, q.broker_name, i)
            for q in self.queue_datas
            if q.perm & PERM_READ
            for i in range(q.read_queue_nums)
        )

    def to_topic_route(self) -> TopicRoute:
        """pymq's TopicRoute; ``endpoints`` are the masters (a slave for a broker without one)."""
        endpoints = {b.broker_name: a for b in self.broker_datas if (a := b.read_addr()) is not None}
        return TopicRoute(self.topic, self.publish_queues(), self.subscribe_queues(), endpoints)


_REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"  # each cluster's <cluster>_REPLY_TOPIC (request-reply messages)


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What the name servers answer to ``GET_BROKER_CLUSTER_INFO`` (``ClusterInfo``).

    ``broker_addrs``: broker name -> master address (a slave's for a broker without one), of every
    broker registered now; ``clusters``: cluster name -> the names of its brokers.
    """

    broker_addrs: Mapping[str, str]
    clusters: Mapping[str, frozenset[str]]

    def own_topics(self) -> frozenset[str]:
        """The topics RocketMQ names after its brokers and clusters: each broker's and cluster's
        name, and ``<cluster>_REPLY_TOPIC`` (``MixAll.REPLY_TOPIC_POSTFIX``)."""
        return frozenset(self.broker_addrs).union(
            *((cluster, f"{cluster}_{_REPLY_TOPIC_POSTFIX}") for cluster in self.clusters)
        )


class NameServerClient:
    """Requests to the name servers of ``namesrvAddr``, asking them in turn.

    Args:
        namesrv_addr: ``"host:port;host2:port"`` or a sequence of addresses.
        remoting: the connections to use (the process's shared client by default).
        timeout_s: the default time-out of one call, over all name servers it tries.

    A call goes to the name server that answered last (a random one at first, so that
    many clients spread their load), and to the next on a connection failure or time-out.
    """

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        *,
        remoting: RemotingClient | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if isinstance(namesrv_addr, str):
            self.addrs = parse_namesrv_addr(namesrv_addr)
        else:
            self.addrs = parse_namesrv_addr(";".join(namesrv_addr))
        self.remoting = remoting if remoting is not None else RemotingClient.shared()
        self.timeout_s = timeout_s
        self._index = random.randrange(len(self.addrs))
        # name server -> (connection id, monotonic s): where and when it last showed a broker registered
        self._brokers_seen: dict[str, tuple[int, float]] = {}

    @property
    def namesrv_addr(self) -> str:
        return ";".join(self.addrs)

    def _saw_brokers(self, addr: str) -> None:
        """``addr`` answered with a broker registered, over the connection open now."""
        conn = self.remoting.connection_id(addr)
        if conn is not None:
            self._brokers_seen[addr] = (conn, time.monotonic())

    def _registered(self, addr: str, timeout_s: float | None) -> bool:
        """Whether the name servers know any broker now (False when none answers either).

        A name server that restarted closed its connections: one that showed a broker over the
        connection open now, a moment ago (BROKERS_SEEN_TTL_S), is taken at its word without
        another round trip, as a stream asks a route that is there and one that is not (a
        deleted topic, a %RETRY% topic without retries yet) at every trigger.
        """
        seen = self._brokers_seen.get(addr)
        if (seen is not None and seen[0] == self.remoting.connection_id(addr)
                and time.monotonic() - seen[1] < BROKERS_SEEN_TTL_S):
            return True
        try:
            return bool(self.get_broker_names(timeout_s=timeout_s))
        except (BrokerUnavailableError, RequestTimeoutError):
            return False

    def get_route_info(self, topic: str, *, timeout_s: float | None = None) -> TopicRouteData:
        """The route of ``topic`` (``GET_ROUTEINFO_BY_TOPIC``).

        Raises TopicNotExistError if no broker registered the topic, BrokerUnavailableError
        if no name server answered, or the one that did knows no broker (it just restarted).
        """
        response, addr = self.invoke(
            lambda: RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": "true"}
            ),
            f"GET_ROUTEINFO_BY_TOPIC of topic {topic!r}",
            timeout_s,
        )
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            if not self._registered(addr, timeout_s):
                # a name server that just restarted knows no broker until their next heartbeat
                # (30 s): a transient answer, as RocketMQ's clients keep their route meanwhile;
                # the next request (a retry) goes to the next name server, which may know them
                self._index = (self.addrs.index(addr) + 1) % len(self.addrs) if addr in self.addrs else 0
                raise BrokerUnavailableError(
                    f"name server {addr} has no broker registered (restarted? brokers register "
                    f"again within 30 s): the route of topic {topic!r} is not known yet "
                    f"(name servers {self.namesrv_addr})"
                )
            why = not_created_yet(topic)  # a group's %RETRY% / %DLQ%: made by the brokers, not by hand
            raise TopicNotExistError(
                f"topic {topic!r} does not exist: name server {addr} has no route for it "
                f"(name servers {self.namesrv_addr})"
                + (f": {why}." if why is not None else
                   f". Create it, e.g. `mqadmin updateTopic -c <cluster> -t {topic}`, or check the "
                   "topic name and namesrvAddr.")
            )
        if response.code != ResponseCode.SUCCESS or not response.body:
            raise _namesrv_error(response, addr, f"GET_ROUTEINFO_BY_TOPIC of topic {topic!r}")
        try:
            route = TopicRouteData.from_json(topic, response.body)
        except (ValueError, KeyError, TypeError) as err:
            raise PymqError(
                f"name server {addr} sent a route of topic {topic!r} that pymq cannot read: {err}"
            ) from None
        if route.broker_datas:
            self._saw_brokers(addr)
        if route.static:
            # Its queue ids are logical ones across brokers, its offsets logical ones moved by
            # offsetDelta: read as plain queues, rows would be read twice or not at all.
            raise PymqError(
                f"topic {topic!r} is a static topic (its route from name server {addr} maps logical "
                "queues onto brokers: topicQueueMappingByBroker); pymq reads and writes RocketMQ's "
                "ordinary topics only. Use an ordinary topic, or RocketMQ's own clients for this one.",
                code="NOT_SUPPORTED",
            )
        return route

    def get_cluster_info(self, *, timeout_s: float | None = None) -> ClusterInfo:
        """The brokers registered now and their clusters (``GET_BROKER_CLUSTER_INFO``)."""
        response, addr = self.invoke(
            lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO),
            "GET_BROKER_CLUSTER_INFO",
            timeout_s,
        )
        if response.code != ResponseCode.SUCCESS:
            raise _namesrv_error(response, addr, "GET_BROKER_CLUSTER_INFO")
        doc: Any = loads_fastjson(response.body) if response.body else {}
        out: dict[str, str] = {}
        for name, data in (doc.get("brokerAddrTable") or {}).items():
            addrs = {str(k): str(v) for k, v in ((data or {}).get("brokerAddrs") or {}).items()}
            master = addrs.get("0") or next(iter(addrs.values()), None)
            if master:
                out[str(name)] = master
        clusters = {str(name): frozenset(str(b) for b in brokers or ())
                    for name, brokers in (doc.get("clusterAddrTable") or {}).items()}
        if out:
            self._saw_brokers(addr)
        return ClusterInfo(out, clusters)

    def get_broker_addrs(self, *, timeout_s: float | None = None) -> dict[str, str]:
        """Broker name -> master address of every broker registered now (GET_BROKER_CLUSTER_INFO)."""
        return dict(self.get_cluster_info(timeout_s=timeout_s).broker_addrs)

    def get_broker_names(self, *, timeout_s: float | None = None) -> set[str]:
        """The brokers registered with the name servers now.

        A broker that stopped or crashed leaves this set at once (its connection to
        the name server closes), while a topic deleted on a live broker leaves only
        that topic's route: this tells the two apart.
        """
        return set(self.get_broker_addrs(timeout_s=timeout_s))

    def get_all_topics(self, *, timeout_s: float | None = None) -> list[str]:
        """Every topic the name servers know (``GET_ALL_TOPIC_LIST_FROM_NAMESERVER``), sorted."""
        response, addr = self.invoke(
            lambda: RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
            "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
            timeout_s,
        )
        if response.code == ResponseCode.SYSTEM_ERROR and (response.remark or "").strip() == "disable":
            # NamesrvConfig.enableAllTopicList=false: the name server's whole answer is "disable"
            raise PymqError(
                f"GET_ALL_TOPIC_LIST_FROM_NAMESERVER to {addr}: the name servers do not list their "
                "topics (enableAllTopicList=false in their configuration). Set enableAllTopicList=true "
                "in namesrv.conf and restart them, or name the topics", code="NOT_SUPPORTED",
            )
        if response.code != ResponseCode.SUCCESS:
            raise _namesrv_error(response, addr, "GET_ALL_TOPIC_LIST_FROM_NAMESERVER")
        doc: Any = loads_fastjson(response.body) if response.body else {}
        return sorted(str(t) for t in doc.get("topicList") or ())

    def invoke(
        self, make_request: Callable[[], RemotingCommand], what: str, timeout_s: float | None = None
    ) -> tuple[RemotingCommand, str]:
        """Send a request made by ``make_request`` to the name servers in turn until one answers.

        Returns the answer (any code) and the name server that gave it. Each name server
        gets an equal share of what is left of ``timeout_s``.
        """
        total = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + total
        failures: list[str] = []
        n = len(self.addrs)
        start = self._index
        for k in range(n):
            i = (start + k) % n
            addr = self.addrs[i]
            left = deadline - time.monotonic()
            if left <= 0:
                failures.append(f"{addr}: not tried, the {total:g} s time-out was used up")
                continue
            try:
                response = self.remoting.invoke_sync(addr, make_request(), left / (n - k))
            except (BrokerUnavailableError, RequestTimeoutError) as err:
                failures.append(f"{addr}: {err.remark.replace(f' {CONNECT_HINT}.', '')}")  # said once, below
                continue
            self._index = i
            return response, addr
        raise BrokerUnavailableError(
            f"no name server answered {what} (namesrvAddr {self.namesrv_addr}): "
            + "; ".join(f.rstrip(".") for f in failures)
            + f". {NAMESRV_HINT}."
        )


def _namesrv_error(response: RemotingCommand, addr: str, call: str) -> PymqError:
    """:func:`response_error` of a name server's answer; a request it does not know is most
    likely a broker's address given as a name server's."""
    err = response_error(response, addr, call)
    if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
        err.remark += (f". Is {addr} a broker (port 10911) rather than a name server (port 9876)? "
                       "namesrvAddr takes the name servers' addresses")
    return err


class RouteCache:
    """Routes by topic, refreshed after ROUTE_TTL_S (30 s, RocketMQ's poll interval).

    As RocketMQ's client keeps its last topic route when the name servers do not answer,
    a refresh that fails transiently (no name server reachable, or none answered in time)
    keeps serving the route it had, and asks again only after ROUTE_RETRY_AFTER_S. A
    topic that does not exist (any more) raises TopicNotExistError.
    """

    def __init__(self, namesrv: NameServerClient) -> None:
        self.namesrv = namesrv
        self._routes: dict[str, tuple[float, TopicRouteData, TopicRoute]] = {}
        self._lock = threading.Lock()

    def _entry(self, topic: str, refresh: bool) -> tuple[float, TopicRouteData, TopicRoute]:
        now = time.monotonic()
        hit = self._routes.get(topic)
        if hit is not None and not refresh and now - hit[0] < ROUTE_TTL_S:
            return hit
        try:
            data = self.namesrv.get_route_info(topic)
        except (BrokerUnavailableError, RequestTimeoutError):
            if hit is None:
                raise
            kept = (time.monotonic() - ROUTE_TTL_S + ROUTE_RETRY_AFTER_S, hit[1], hit[2])
            with self._lock:
                self._routes[topic] = kept
            return kept
        entry = (now, data, data.to_topic_route())
        with self._lock:
            self._routes[topic] = entry
        return entry

    def get(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The route of ``topic`` as pymq's TopicRoute (endpoints: broker name -> address)."""
        return self._entry(topic, refresh)[2]

    def route_data(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """The route of ``topic`` as the name server gave it."""
        return self._entry(topic, refresh)[1]

    def broker_addr(self, topic: str, broker_name: str) -> str:
        """The address of ``broker_name`` (its master) in the route of ``topic``.

        Refreshes the route if the broker is not in it (it may have just registered; at most
        once per ROUTE_RETRY_AFTER_S); raises BrokerUnavailableError if it still is not.
        """
        fetched, _, route = self._entry(topic, False)
        addr = route.endpoints.get(broker_name)
        if addr is None and time.monotonic() - fetched >= ROUTE_RETRY_AFTER_S:
            addr = self.get(topic, refresh=True).endpoints.get(broker_name)
        if addr is None:
            raise BrokerUnavailableError(
                f"broker {broker_name!r} has no address in the route of topic {topic!r} "
                f"(name servers {self.namesrv.namesrv_addr}): it is down or not registered"
            )
        return addr

    def reread(self, topic: str) -> TopicRouteData:
        """The route of ``topic`` asked of the name servers again, unless the one held was
        fetched less than ROUTE_RETRY_AFTER_S ago: a caller retrying every second asks them
        once per interval, not once per try."""
        fetched, data, _ = self._entry(topic, False)
        if time.monotonic() - fetched >= ROUTE_RETRY_AFTER_S:
            data = self._entry(topic, True)[1]
        return data

    def master_addr(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` in any route held (the newest first), or None.

        As RocketMQ's client finds a broker by name in the addresses of every route it
        fetched (``MQClientInstance.findBrokerAddressInPublish``), whatever the topic.
        """
        with self._lock:
            entries = sorted(self._routes.values(), key=lambda e: e[0], reverse=True)
        for _, data, _ in entries:
            broker = data.broker(broker_name)
            if broker is not None and broker.master_addr is not None:
                return broker.master_addr
        return None

    def invalidate(self, topic: str) -> None:
        """Forget the route of ``topic``: the next call asks the name servers."""
        with self._lock:
            self._routes.pop(topic, None)
