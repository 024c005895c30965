"""The notebook tables of :class:`~pyspark_pymq.client.admin.Admin`, from an Apache RocketMQ cluster.

``Admin(namesrv_addr="host:9876")`` is a :class:`RocketMQAdmin`: the same DataFrames
(topics, queues, groups, lag, dead letters) as on the embedded broker, from what
RocketMQ's name servers and brokers answer (the requests ``mqadmin topicList``,
``topicStatus``, ``consumerProgress`` and ``subscriptionGroupList`` make). The
Spark views (``option("view", ...)``) use it too. Changing the cluster (topics,
groups, dead-letter re-sends) stays with RocketMQ's own tools.

A broker that does not answer (hung, or gone but still registered at the name servers) fails
a table with an error naming it (broker name and address), as ``mqadmin topicStatus`` and
``consumerProgress -g`` fail: a table with its rows silently missing would show less lag than
there is (the Spark views run on executors, where no warning reaches the user). The one
exception: a group's progress is asked of the brokers of ``%RETRY%<group>``'s route (those its
consumers registered with, as ``mqadmin consumerProgress`` asks) and of the topic's; the other
brokers are asked too, in case a consumer committed there without registering, but one of them
that does not answer is left out with a warning and not asked again for ``UNANSWERED_RETRY_S``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from pymq_proto.topics import (
    get_retry_topic,
    is_retry_topic,
    is_system_topic,
)

from ..backend.base import BackendConfig, QueueBounds, client_tls, open_backend
from ..client.admin import (
    GROUP_COLUMNS,
    INTERNAL_GROUPS,
    Admin,
    GroupConfig,
    _frame,
)
from ..client.consumer import PullConsumer, dlq_topic
from ..client.credentials import check_credentials
from ..client.message import MessageQueue
from ..errors import (
    GROUP_NOT_EXIST,
    BrokerUnavailableError,
    NoPermissionError,
    PymqError,
    RequestTimeoutError,
    TopicNotExistError,
)
from ..spark.option_registry import TOOLS_CONSUMER_GROUP

if TYPE_CHECKING:
    import pandas as pd

    from ..tls import TlsConfig
    from .api import MQClientAPI
    from .route import NameServerClient

__all__ = ["UNANSWERED_RETRY_S", "RocketMQAdmin", "is_system_group", "is_system_topic"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# A broker that did not answer is not asked again by the same Admin for this long (its rows are
# left out, with a warning each time), as a route the name servers did not give is kept 30 s.
UNANSWERED_RETRY_S = 30.0



# RocketMQ's own consumer groups: those every broker creates (SubscriptionGroupManager.init():
# MixAll's TOOLS_CONSUMER_GROUP, FILTERSRV_CONSUMER_GROUP, SELF_TEST_CONSUMER_GROUP,
# ONS_HTTP_PROXY_GROUP, CID_ONSAPI_PULL_GROUP, CID_ONSAPI_PERMISSION_GROUP, CID_ONSAPI_OWNER_GROUP
# and CID_SYS_RMQ_TRANS), and MixAll.isSysConsumerGroup's CID_RMQ_SYS_ prefix. Any other name is a
# user's group, however it is spelt (ORDER_X_CONSUMER is one).
_SYSTEM_GROUPS = frozenset({
    "TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY", "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_RMQ_SYS_TRANS",
})
_SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"


def is_system_group(group: str) -> bool:
    """RocketMQ's own consumer groups: those its brokers create (``TOOLS_CONSUMER``,
    ``CID_ONSAPI_PULL``, ...) and ``CID_RMQ_SYS_*``."""
    return group in _SYSTEM_GROUPS or group.startswith(_SYSTEM_GROUP_PREFIX)


def _refused(name: str, *, changes: bool) -> Callable[..., Any]:
    """An Admin method a cluster does not answer here: it raises NOT_SUPPORTED naming its call."""

    def refused(self: RocketMQAdmin, *args: Any, **_: Any) -> Any:
        # the first argument only (a topic, group, user or subject): a later one may be a password
        call = f"{name}({args[0]!r})" if args else f"{name}()"
        raise self._not_here(call) if changes else self._not_read(call)

    refused.__name__ = refused.__qualname__ = name
    return refused


class RocketMQAdmin(Admin):
    """Tables of an Apache RocketMQ cluster, as :class:`Admin` gives them for a pymq broker.

    Args:
        namesrv_addr: ``"host:9876;host2:9876"``.
        access_key, secret_key: RocketMQ ACL credentials.
        tls, tls_ca_file, tls_cert_file, tls_key_file: TLS to the name servers and brokers,
            as :class:`Admin` takes them.

    Example::

        admin = Admin(namesrv_addr="127.0.0.1:9876")   # a RocketMQAdmin
        admin.topic_stats("orders")        # one row per queue of every broker
        admin.group_progress("billing")    # what `mqadmin consumerProgress` shows
        admin.dead_letters("billing")
    """

    def __init__(
        self, endpoint: str | None = None, *, namesrv_addr: str | None = None,
        access_key: str | None = None, secret_key: str | None = None, timeout_ms: int = 10_000,
        tls: bool | TlsConfig | None = None, tls_ca_file: str | None = None,
        tls_cert_file: str | None = None, tls_key_file: str | None = None,
    ) -> None:
        from ..backend.rocketmq import RocketMQBackend

        if not namesrv_addr:
            raise ValueError("RocketMQAdmin needs namesrv_addr ('host:9876;host2:9876')")
        check_credentials(access_key, secret_key)
        config = BackendConfig(None, namesrv_addr, access_key, secret_key,
                               client_tls(tls, tls_ca_file, tls_cert_file, tls_key_file))
        backend = open_backend(config, timeout_ms / 1000.0)
        assert isinstance(backend, RocketMQBackend)
        self._backend = backend
        self._namesrv: NameServerClient = backend.namesrv
        self._api: MQClientAPI = backend.api
        self._unanswered: dict[str, float] = {}  # broker address -> when it last did not answer

    @property
    def endpoint(self) -> str:
        return self._backend.config.address

    def __repr__(self) -> str:
        return f"RocketMQAdmin(namesrv_addr={self.endpoint!r})"

    def _brokers_here(self) -> str:
        return f"every broker registered with the name servers at {self.endpoint}"

    def _not_here(self, what: str) -> PymqError:
        return PymqError(
            f"{what} changes an Apache RocketMQ cluster: use RocketMQ's tools (mqadmin, RocketMQ "
            f"Dashboard) with namesrvAddr {self.endpoint}; pymq's Admin only reads it",
            code="NOT_SUPPORTED",
        )

    def _not_read(self, what: str) -> PymqError:
        return PymqError(
            f"{what} is not read from an Apache RocketMQ cluster by pymq's Admin: use RocketMQ's tools "
            f"(mqadmin, RocketMQ Dashboard) with namesrvAddr {self.endpoint}",
            code="NOT_SUPPORTED",
        )

    # What changes the cluster stays with RocketMQ's tools, and the reads pymq does not make of
    # it say so too (NOT_SUPPORTED, naming the tools), not an AttributeError of the pymq client.
    create_topic = _refused("create_topic", changes=True)
    delete_topic = _refused("delete_topic", changes=True)
    update_group = _refused("update_group", changes=True)
    reset_offset = _refused("reset_offset", changes=True)  # mqadmin resetOffsetByTime
    resend_dead_letters = _refused("resend_dead_letters", changes=True)
    purge_dead_letters = _refused("purge_dead_letters", changes=True)
    create_user = _refused("create_user", changes=True)
    update_user = _refused("update_user", changes=True)
    delete_user = _refused("delete_user", changes=True)
    create_acl = _refused("create_acl", changes=True)
    delete_acl = _refused("delete_acl", changes=True)
    list_users = _refused("list_users", changes=False)
    list_acls = _refused("list_acls", changes=False)
    topic_config = _refused("topic_config", changes=False)
    view_message = _refused("view_message", changes=False)
    query_message = _refused("query_message", changes=False)

    # -- brokers ------------------------------------------------------------------------------

    def _ask(
        self, broker_name: str, addr: str, what: str, call: Callable[[], T], *, optional: bool = False,
    ) -> T | None:
        """``call()``, a request to broker ``broker_name`` at ``addr`` for ``what``; its errors name
        the broker. One that does not answer (time-out, or gone) fails the table, unless
        ``optional``: then None, with a warning that its rows are missing, and it is not asked
        again for UNANSWERED_RETRY_S (so that the ``lag`` of many groups waits one time-out for it).
        """
        since = self._unanswered.get(addr)
        if optional and since is not None and time.monotonic() - since < UNANSWERED_RETRY_S:
            log.warning("%s: broker %r (%s) did not answer %.0f s ago and is not asked again yet; rows "
                        "it may hold are missing", what, broker_name, addr, time.monotonic() - since)
            return None
        try:
            result = call()
        except (RequestTimeoutError, BrokerUnavailableError) as err:
            if not optional:
                raise type(err)(f"{what}: broker {broker_name!r} ({addr}) did not answer, and the table "
                                f"would miss its rows: {err.remark}", code=err.code) from None
            self._unanswered[addr] = time.monotonic()
            log.warning("%s: broker %r (%s) did not answer; rows it may hold are missing: %s", what,
                        broker_name, addr, err.remark)
            return None
        except PymqError as err:
            raise type(err)(f"{what}: broker {broker_name!r} ({addr}): {err.remark}", code=err.code) from None
        self._unanswered.pop(addr, None)
        return result

    def broker_names(self) -> list[str]:
        """The cluster's brokers, as its name servers list them now."""
        return sorted(self._namesrv.get_broker_addrs())

    def broker_info(self, broker_name: str | None = None) -> dict[str, str]:
        """A broker's runtime info, as ``mqadmin brokerStatus`` shows it (GET_BROKER_RUNTIME_INFO):
        ``commitLogDiskRatio``, ``commitLogMaxOffset``, ``brokerVersionDesc``, ...

        ``broker_name``: which broker; it may be left out when the cluster has one.
        """
        addrs = self._namesrv.get_broker_addrs()
        if broker_name is None and len(addrs) == 1:
            broker_name = next(iter(addrs))
        if broker_name not in addrs:
            what = "broker_name is needed" if broker_name is None else f"no broker {broker_name!r}"
            has = f"has brokers {', '.join(sorted(addrs))}" if addrs else "has no broker registered"
            raise ValueError(f"{what}: the cluster at {self.endpoint} {has}")
        addr = addrs[broker_name]
        return {"broker_name": broker_name, "endpoint": addr, **self._api.get_broker_runtime_info(addr)}

    # -- topics -------------------------------------------------------------------------------

    def topic_names(self, include_system: bool = False) -> list[str]:
        if include_system:
            return self._namesrv.get_all_topics()
        return self._backend.topic_names()

    def _stats(self, name: str, *, refresh: bool = True) -> dict[Any, tuple[QueueBounds, int]]:
        """Bounds and last store time of every queue of ``name`` (one request per broker);
        ``refresh=False`` when its route was just fetched."""
        route = self._backend.route(name, refresh=refresh)
        out: dict[Any, tuple[QueueBounds, int]] = {}
        for broker, addr in sorted(route.endpoints.items()):
            try:
                found = self._ask(broker, addr, f"stats of topic {name!r}",
                                  partial(self._api.get_topic_stats_info, addr, name))
            except TopicNotExistError:
                continue
            for mq, o in (found or {}).items():
                out[mq] = (QueueBounds(o.min_offset, o.max_offset), o.last_update_timestamp)
        return dict(sorted(out.items()))

    def _route_brokers(self, topic: str, *, refresh: bool = True) -> dict[str, str]:
        """Broker name -> address of ``topic``'s route (none when it has no route): the brokers
        that hold its queues, and so every group's progress on it. Fetched anew unless
        ``refresh=False`` (the cached route, at most ``ROUTE_TTL_S`` old, as a consumer uses)."""
        try:
            return dict(self._backend.route(topic, refresh=refresh).endpoints)
        except TopicNotExistError:
            return {}

    def _topic_row(self, name: str) -> dict[str, Any] | None:
        """``name``'s row of :meth:`topics`, from the brokers of its route only (None when it has
        no route); its queue counts and its stats share the one route request."""
        try:
            data = self._backend._routes.route_data(name, refresh=True)
            stats = self._stats(name, refresh=False)
        except TopicNotExistError:
            return None
        bounds = [b for b, _ in stats.values()]
        return {
            "topic": name,
            "read_queues": sum(q.read_queue_nums for q in data.queue_datas),
            "write_queues": sum(q.write_queue_nums for q in data.queue_datas),
            "perm": max((q.perm for q in data.queue_datas), default=0),
            "messages": sum(b.max_offset - b.min_offset for b in bounds),
            "min_offset": min((b.min_offset for b in bounds), default=0),
            "max_offset": max((b.max_offset for b in bounds), default=0),
            "last_store_timestamp": max((t for _, t in stats.values()), default=0),
        }

    def topics(self, include_system: bool = False, topic: str | None = None) -> pd.DataFrame:
        """One row per topic; ``topic``: that topic's row only, a system topic too (none if it does
        not exist), so a broker outside its route need not answer."""
        names = [topic] if topic is not None else self.topic_names(include_system)
        rows = [row for row in map(self._topic_row, names) if row is not None]
        return _frame(rows, ["topic", "read_queues", "write_queues", "perm", "messages", "min_offset",
                             "max_offset", "last_store_timestamp"])

    def topic_stats(self, name: str) -> pd.DataFrame:
        rows = [
            {"topic": mq.topic, "broker_name": mq.broker_name, "queue_id": mq.queue_id,
             "min_offset": b.min_offset, "max_offset": b.max_offset, "messages": b.max_offset - b.min_offset,
             "last_store_timestamp": t}
            for mq, (b, t) in self._stats(name).items()
        ]
        return _frame(rows, ["topic", "broker_name", "queue_id", "min_offset", "max_offset", "messages",
                             "last_store_timestamp"])

    # -- groups -------------------------------------------------------------------------------

    def group_config(self, group: str) -> GroupConfig:
        """The settings of ``group`` on the first broker that has it (RocketMQ's defaults for a
        group no broker has met)."""
        cfg: dict[str, Any] = {}
        for broker, addr in sorted(self._namesrv.get_broker_addrs().items()):
            found = self._ask(broker, addr, f"settings of group {group!r}",
                              partial(self._api.get_all_subscription_groups, addr))
            cfg = (found or {}).get(group) or {}
            if cfg:
                break
        return GroupConfig(group, int(cfg.get("retryMaxTimes", 16)), int(cfg.get("retryQueueNums", 1)),
                           str(cfg.get("consumeFromWhere", "") or ""), bool(cfg.get("consumeMessageOrderly")),
                           bool(cfg.get("consumeEnable", True)))

    def groups(self, include_internal: bool = False, topic: str | None = None) -> pd.DataFrame:
        """Every consumer group the brokers know, with its retry settings. Left out unless
        ``include_internal``: RocketMQ's own groups (:func:`is_system_group`: those its brokers
        create, such as ``TOOLS_CONSUMER`` and ``CID_ONSAPI_PULL``, and ``CID_RMQ_SYS_*``) and
        pymq's (:data:`~pyspark_pymq.client.admin.INTERNAL_GROUPS`, such as ``PYMQ_SPARK_READER``).

        ``topic``: the groups the brokers of its route know, as :meth:`group_progress` of a topic
        asks only them: a group with progress on the topic committed it there (a broker meets a
        group at its first pull), so the other brokers need not answer."""
        brokers = self._namesrv.get_broker_addrs() if topic is None else self._route_brokers(topic)
        seen: dict[str, dict[str, Any]] = {}
        for broker, addr in sorted(brokers.items()):
            found = self._ask(broker, addr, "consumer groups",
                              partial(self._api.get_all_subscription_groups, addr))
            for name, cfg in (found or {}).items():
                seen.setdefault(name, cfg)
        rows = [
            {"group": name, "retry_max_times": int(cfg.get("retryMaxTimes", 16)),
             "retry_queue_nums": int(cfg.get("retryQueueNums", 1)),
             "consume_from_where": str(cfg.get("consumeFromWhere", "") or ""),
             "consume_message_orderly": bool(cfg.get("consumeMessageOrderly", False)),
             "consume_enable": bool(cfg.get("consumeEnable", True))}
            for name, cfg in sorted(seen.items())
            if include_internal or not (name in INTERNAL_GROUPS or is_system_group(name))
        ]
        return _frame(rows, GROUP_COLUMNS)

    def _progress_brokers(self, group: str, topic: str | None) -> dict[str, tuple[str, bool]]:
        """Broker name -> (address, optional) of the brokers to ask for ``group``'s progress.

        Required: those of ``%RETRY%<group>``'s route (every consumer's heartbeat makes it on the
        brokers of its topics; ``DefaultMQAdminExtImpl.examineConsumeStats`` asks them) and of
        ``topic``'s; every registered broker when the retry topic has no route. Without ``topic``
        the other registered brokers are asked as optional: a consumer may commit without
        registering there (``PullConsumer.commit`` does not heartbeat)."""
        try:
            required = dict(self._backend.route(get_retry_topic(group), refresh=True).endpoints)
            others = topic is None
        except TopicNotExistError:  # no consumer of the group has met the brokers
            required, others = self._namesrv.get_broker_addrs(), False
        if topic is not None:
            # a topic without a route fails, as on the embedded broker and in ``mqadmin
            # consumerProgress -t``: its brokers would answer an empty table, a misspelt topic "no lag"
            required.update(self._backend.route(topic, refresh=True).endpoints)
        optional = self._namesrv.get_broker_addrs() if others else {}
        return {**{b: (a, True) for b, a in optional.items()}, **{b: (a, False) for b, a in required.items()}}

    def group_progress(
        self, group: str, topic: str | None = None, *, committed_only: bool = False,
    ) -> pd.DataFrame:
        """One row per queue the group has progress on: broker offset, consumer offset, lag.

        The brokers of ``%RETRY%<group>``'s route and of ``topic``'s must answer (as ``mqadmin
        consumerProgress`` asks them); without ``topic`` the other brokers are asked too, and one
        of them that does not answer is left out with a warning (see the module).
        ``committed_only``: see :meth:`Admin.group_progress`; only ``topic``'s brokers are asked
        (they hold every offset on it), from the route :meth:`groups` of the topic just fetched:
        the ``lag`` view asks the name servers once, not once per group."""
        asked = None if committed_only else topic  # no topic: the broker answers the queues with progress
        brokers = ({b: (a, False) for b, a in self._route_brokers(topic, refresh=False).items()}
                   if committed_only and topic is not None else self._progress_brokers(group, topic))
        rows = []
        for broker, (addr, optional) in sorted(brokers.items()):
            try:
                table = self._ask(broker, addr, f"progress of group {group!r}",
                                  partial(self._api.get_consume_stats, addr, group, asked), optional=optional)
            except PymqError as err:
                if err.code in (GROUP_NOT_EXIST, "CONSUMER_NOT_ONLINE", "TOPIC_NOT_EXIST"):
                    continue
                raise
            for mq, (broker_offset, consumer_offset, _) in (table or {}).items():
                if (is_retry_topic(mq.topic) and consumer_offset < 0) or topic not in (None, mq.topic):
                    continue
                rows.append({
                    "group": group, "topic": mq.topic, "broker_name": mq.broker_name,
                    "queue_id": mq.queue_id, "broker_offset": broker_offset,
                    "consumer_offset": consumer_offset,
                    "lag": max(0, broker_offset - max(consumer_offset, 0)),
                })
        if not committed_only:  # a misspelt group fails, as on the embedded broker
            self._check_group_known(group, rows)
        rows.sort(key=lambda r: (r["topic"], r["broker_name"], r["queue_id"]))
        return _frame(rows, ["group", "topic", "broker_name", "queue_id", "broker_offset",
                             "consumer_offset", "lag"])

    # -- dead letters --------------------------------------------------------------------------

    def _dead_letter_queues(self, group: str) -> tuple[PullConsumer, list[MessageQueue]]:
        """A consumer for %DLQ%<group> and its queues (none if the topic does not exist). A topic
        whose brokers hold it but none readable (perm 2, write-only, as RocketMQ 4.3-4.7 create
        every %DLQ% topic) fails, saying how to make it readable: its letters would show as none."""
        consumer = PullConsumer(group=TOOLS_CONSUMER_GROUP, backend=self._backend)
        topic = dlq_topic(group)
        try:
            route = self._backend.route(topic, refresh=True)
        except TopicNotExistError:
            return consumer, []
        if route.endpoints and not route.subscribe_queues:
            raise NoPermissionError(
                f"dead-letter topic {topic!r} of group {group!r} is not readable on brokers "
                f"{', '.join(sorted(route.endpoints))} (write-only, as RocketMQ 4.3-4.7 create every %DLQ% "
                f"topic): its dead letters cannot be read until it is, with `mqadmin updateTopicPerm "
                f"-c <cluster> -t {topic} -p 6`")
        return consumer, list(route.subscribe_queues)
