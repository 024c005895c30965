"""Administration: topics, stats, group progress and message look-ups.

Tables come back as pandas DataFrames, ready for a notebook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pymq_proto.record import MessageConst, parse_offset_msg_id
from pymq_proto.topics import TOPIC_MESSAGE_TYPES
from pymq_proto.v1 import pymq_pb2

from ..backend.base import client_tls
from ..errors import (
    GROUP_NOT_EXIST,
    MessageIllegalError,
    NoPermissionError,
    PymqError,
    TopicNotExistError,
)
from ..spark.option_registry import DEFAULT_READER_GROUP
from .codec import decode_messages
from .consumer import PullConsumer, dlq_topic
from .credentials import check_credentials
from .message import MessageExt, MessageQueue, SystemMessage, check_timeout_ms
from .route import PERM_READ, PERM_WRITE
from .transport import BrokerClient, SharedConnections

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..tls import TlsConfig

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["INTERNAL_GROUPS", "Admin", "GroupConfig", "TopicConfig"]

DLQ_BROWSER_GROUP = "PYMQ_DLQ_BROWSER"
DLQ_RESEND_GROUP = "PYMQ_DLQ_RESEND"
ADMIN_TAIL_GROUP = "PYMQ_ADMIN_TAIL"  # what `pymq-admin tail` pulls as
#: pymq's own consumer groups (batch reads, ``pymq-admin tail``, dead-letter browsing and
#: re-sending): the broker meets them at their first pull; :meth:`Admin.groups` leaves them out
INTERNAL_GROUPS = frozenset({DEFAULT_READER_GROUP, ADMIN_TAIL_GROUP, DLQ_BROWSER_GROUP, DLQ_RESEND_GROUP})
# send errors that resend_dead_letters takes as final for one letter (its topic is gone, or the
# letter itself is illegal): the letter stays in the DLQ and the others go on. A permission
# refused (an ACL, a topic not writable for now) is the caller's to mend: it stops the call.
_REFUSED_FOR_GOOD = (TopicNotExistError, MessageIllegalError)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's configuration on the broker (RocketMQ's TopicConfig; ``message_type`` its
    TopicMessageType: NORMAL, FIFO, DELAY, TRANSACTION or MIXED).

    ``topic_id``: the pymq broker's id of this topic, new each time a topic of the name is
    created (0: created before ids, or a RocketMQ cluster, which has none).
    """

    topic_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    dedup_window_ms: int = 0
    message_type: str = "NORMAL"
    topic_id: int = 0

    @staticmethod
    def from_proto(c: pymq_pb2.TopicConfig) -> TopicConfig:
        return TopicConfig(
            c.topic_name, c.read_queue_nums, c.write_queue_nums, c.perm, c.dedup_window_ms,
            c.message_type or "NORMAL", c.topic_id,
        )


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A consumer group's settings on the broker (RocketMQ's SubscriptionGroupConfig).

    ``consume_message_orderly``: a FIFO group for RocketMQ 5's clients (each queue
    delivered in order, held until its messages are acked). ``consume_enable``: False
    stops the group's pulls (NO_PERMISSION), as RocketMQ's consumeEnable.
    """

    group_name: str
    retry_max_times: int
    retry_queue_nums: int
    consume_from_where: str
    consume_message_orderly: bool = False
    consume_enable: bool = True

    @staticmethod
    def from_proto(c: pymq_pb2.SubscriptionGroupConfig) -> GroupConfig:
        return GroupConfig(c.group_name, c.retry_max_times, c.retry_queue_nums, c.consume_from_where,
                           c.consume_message_orderly, c.consume_enable)


GROUP_COLUMNS = ["group", "retry_max_times", "retry_queue_nums", "consume_from_where",
                 "consume_message_orderly", "consume_enable"]
"""The columns of :meth:`Admin.groups` (and of the Spark ``groups`` view), both backends."""


def _origin_msg_id(m: MessageExt) -> str:
    """The offsetMsgId of a dead letter's original (its ORIGIN_MESSAGE_ID), "" if unknown."""
    props = m.properties
    return (props.get(MessageConst.PROPERTY_DLQ_ORIGIN_MESSAGE_ID)
            or props.get(MessageConst.PROPERTY_ORIGIN_MESSAGE_ID, ""))


def pull_messages(consumer: PullConsumer, mq: MessageQueue, offset: int, max_num: int) -> list[MessageExt]:
    """Up to ``max_num`` messages of ``mq`` from ``offset`` on, oldest first, pulled until there are
    that many or the queue has no more: a broker answers a pull with fewer than asked for (an Apache
    RocketMQ broker at most 32, its maxTransferCountOnMessageInMemory)."""
    out: list[MessageExt] = []
    while len(out) < max_num:
        result = consumer.pull(mq, offset, min(1000, max_num - len(out)))
        if not result.messages:
            break
        out.extend(result.messages)
        offset = result.next_begin_offset
    return out


def _epoch_ms(timestamp: int | datetime | None) -> int:
    """``timestamp`` as ms since the epoch: an int as it is (>= -1), a datetime by its own time zone
    (a naive one is local time, as ``datetime.timestamp`` reads it)."""
    if isinstance(timestamp, datetime):
        return int(timestamp.timestamp() * 1000)
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"timestamp must be ms since the epoch (an int) or a datetime, got {timestamp!r}")
    if timestamp < -1:
        raise ValueError(f"timestamp {timestamp} must be ms since the epoch (>= 0), or -1 for each "
                         "queue's end")
    return timestamp


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    """``rows`` as a DataFrame; the broker's times (``*_timestamp``, ms since the epoch) as UTC
    times, as the CLI and the Spark views show them (0, nothing stored: NaT)."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=columns)
    for column in columns:
        if column.endswith("timestamp"):
            ms = pd.to_numeric(frame[column])
            times = pd.to_datetime(ms.where(ms > 0), unit="ms", utc=True)
            frame[column] = times.astype("datetime64[ms, UTC]")
    return frame


class Admin(SharedConnections):
    """Topic and group administration for one broker.

    ``Admin(namesrv_addr="host:9876")`` gives the same tables for an Apache RocketMQ
    cluster (:class:`~pyspark_pymq.rocketmq.admin.RocketMQAdmin`; it only reads).

    Example::

        admin = Admin("127.0.0.1:8081")
        admin.create_topic("orders", queues=4)
        admin.topic_stats("orders")        # DataFrame: one row per queue
        admin.group_progress("analytics")  # DataFrame: offsets and lag per queue
    """

    def __new__(cls, endpoint: str | None = None, *, namesrv_addr: str | None = None,
                **_: Any) -> Admin:
        if namesrv_addr is not None and cls is Admin:
            from ..rocketmq.admin import RocketMQAdmin

            return super().__new__(RocketMQAdmin)
        return super().__new__(cls)

    def __init__(
        self, endpoint: str | None = None, *, namesrv_addr: str | None = None,
        access_key: str | None = None, secret_key: str | None = None, timeout_ms: int = 10_000,
        tls: bool | TlsConfig | None = None, tls_ca_file: str | None = None,
        tls_cert_file: str | None = None, tls_key_file: str | None = None,
    ) -> None:
        if endpoint is None:
            raise ValueError("Admin needs an endpoint ('host:port' of a pymq broker) or namesrv_addr")
        check_timeout_ms(timeout_ms)
        check_credentials(access_key, secret_key)
        tls_config = client_tls(tls, tls_ca_file, tls_cert_file, tls_key_file)
        self._client = BrokerClient(endpoint, timeout_ms / 1000.0, access_key=access_key,
                                    secret_key=secret_key, tls=tls_config)
        # what the Admin's own consumers and producers connect with (dead letters)
        self._security: dict[str, Any] = {"access_key": access_key, "secret_key": secret_key,
                                          "tls": tls_config}
        self._name: str | None = None

    def __repr__(self) -> str:
        return f"Admin({self._client!r})"

    @property
    def endpoint(self) -> str:
        return self._client.endpoint

    def create_topic(
        self,
        name: str,
        queues: int | None = None,
        *,
        read_queues: int | None = None,
        write_queues: int | None = None,
        perm: int | None = None,
        dedup_window_ms: int | None = None,
        update_if_exists: bool = True,
        message_type: str | None = None,
        allow_shrink: bool = False,
    ) -> TopicConfig:
        """Create ``name`` (or update it) with ``queues`` read and write queues.

        A setting not given keeps an existing topic's value, and takes the default for a new
        one: ``queues`` 4, ``perm`` read and write, ``dedup_window_ms`` 0, ``message_type``
        NORMAL. ``dedup_window_ms`` > 0 makes the broker drop a message whose UNIQ_KEY it
        stored on this topic within that window (idempotent retries). ``message_type``
        (RocketMQ 5's TopicMessageType): NORMAL, FIFO, DELAY, TRANSACTION or MIXED, what
        RocketMQ 5's official clients may send to the topic (as ``mqadmin updateTopic -a
        +message.type=FIFO``).

        Fewer read queues than an existing topic has, where a queue to go holds messages a
        consumer group has not read yet (or that no group has read), is refused with
        IllegalArgumentError unless ``allow_shrink=True``: those messages could no longer be
        read (RocketMQ's scale-in cuts write queues first, read queues once the consumers
        have read them).
        """
        counts = (("queues", queues), ("read_queues", read_queues), ("write_queues", write_queues))
        for label, value in counts:
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{label} must be an int >= 1, got {value!r}")
        if message_type is not None and message_type.upper() not in TOPIC_MESSAGE_TYPES:
            raise ValueError(
                f"message_type must be one of {', '.join(TOPIC_MESSAGE_TYPES)} (or None), "
                f"got {message_type!r}"
            )
        default = 4 if queues is None else queues
        # the broker keeps an existing topic's value of each setting not given
        keep = ["order"]
        if read_queues is None and queues is None:
            keep.append("read_queue_nums")
        if write_queues is None and queues is None:
            keep.append("write_queue_nums")
        if perm is None:
            keep.append("perm")
        if dedup_window_ms is None:
            keep.append("dedup_window_ms")
        config = pymq_pb2.TopicConfig(
            topic_name=name,
            read_queue_nums=read_queues if read_queues is not None else default,
            write_queue_nums=write_queues if write_queues is not None else default,
            perm=perm if perm is not None else PERM_READ | PERM_WRITE,
            dedup_window_ms=dedup_window_ms or 0,
            message_type=(message_type or "").upper(),
        )
        resp = self._client.create_topic(pymq_pb2.CreateTopicRequest(
            config=config, update_if_exists=update_if_exists, keep=keep, allow_shrink=allow_shrink,
        ))
        return TopicConfig.from_proto(resp.config)

    def delete_topic(self, name: str) -> None:
        self._client.delete_topic(pymq_pb2.DeleteTopicRequest(topic=name))

    def topic_config(self, name: str) -> TopicConfig:
        for t in self._client.list_topics(pymq_pb2.ListTopicsRequest(include_system=True)).topics:
            if t.topic_name == name:
                return TopicConfig.from_proto(t)
        raise TopicNotExistError(f"topic {name!r} does not exist on {self.endpoint}")

    def topic_names(self, include_system: bool = False) -> list[str]:
        resp = self._client.list_topics(pymq_pb2.ListTopicsRequest(include_system=include_system))
        return [t.topic_name for t in resp.topics]

    def topics(self, include_system: bool = False, topic: str | None = None) -> pd.DataFrame:
        """One row per topic: queues, permissions, messages (in all its queues), the lowest
        ``min_offset`` and highest ``max_offset`` of its queues (each queue's: :meth:`queues`), the
        last store time.

        ``topic``: that topic's row only, a system topic too (none if it does not exist)."""
        request = pymq_pb2.ListTopicsRequest(include_system=include_system or topic is not None)
        rows = []
        for t in self._client.list_topics(request).topics:
            if topic is not None and t.topic_name != topic:
                continue  # not asked for: no stats request
            stats = self._client.topic_stats(pymq_pb2.TopicStatsRequest(topic=t.topic_name))
            rows.append(
                {
                    "topic": t.topic_name,
                    "read_queues": t.read_queue_nums,
                    "write_queues": t.write_queue_nums,
                    "perm": t.perm,
                    "messages": sum(q.max_offset - q.min_offset for q in stats.queues),
                    "min_offset": min((q.min_offset for q in stats.queues), default=0),
                    "max_offset": max((q.max_offset for q in stats.queues), default=0),
                    "last_store_timestamp": max(
                        (q.last_store_timestamp for q in stats.queues), default=0
                    ),
                }
            )
        return _frame(
            rows,
            ["topic", "read_queues", "write_queues", "perm", "messages", "min_offset",
             "max_offset", "last_store_timestamp"],
        )

    def groups(self, include_internal: bool = False, topic: str | None = None) -> pd.DataFrame:
        """One row per consumer group the broker knows: its settings (:data:`GROUP_COLUMNS`;
        ``consume_enable`` False: a paused group, see :meth:`update_group`).

        ``topic``: the groups known to the brokers of its route, those that may have progress on
        it (a cluster's other brokers are not asked); the one broker here knows them all.

        pymq's own groups (:data:`INTERNAL_GROUPS`: ``PYMQ_SPARK_READER`` of batch reads,
        ``PYMQ_ADMIN_TAIL`` of ``pymq-admin tail``, ...) are left out unless
        ``include_internal``, as :meth:`topics` leaves out system topics; :meth:`group_progress`
        still reads them.
        """
        resp = self._client.list_groups(pymq_pb2.ListGroupsRequest())
        rows = [
            {
                "group": g.group_name,
                "retry_max_times": g.retry_max_times,
                "retry_queue_nums": g.retry_queue_nums,
                "consume_from_where": g.consume_from_where,
                "consume_message_orderly": g.consume_message_orderly,
                "consume_enable": g.consume_enable,
            }
            for g in resp.groups
            if include_internal or g.group_name not in INTERNAL_GROUPS
        ]
        return _frame(rows, GROUP_COLUMNS)

    def group_config(self, group: str) -> GroupConfig:
        """The settings of ``group`` (RocketMQ's defaults for a group the broker has not met)."""
        resp = self._client.get_subscription_group(pymq_pb2.GetSubscriptionGroupRequest(group_name=group))
        return GroupConfig.from_proto(resp.config)

    def update_group(
        self, group: str, *, retry_max_times: int | None = None, retry_queue_nums: int | None = None,
        consume_message_orderly: bool | None = None, consume_enable: bool | None = None,
    ) -> GroupConfig:
        """Change the settings given (None: unchanged) of ``group``, as ``mqadmin updateSubGroup``.

        ``retry_max_times``: sends back before %DLQ% (v2 clients: delivery attempts - 1);
        ``consume_message_orderly``: a FIFO group for RocketMQ 5's clients;
        ``consume_enable``: False pauses the group (its pulls answer NO_PERMISSION).
        """
        for name, value, least in (("retry_max_times", retry_max_times, 0),
                                   ("retry_queue_nums", retry_queue_nums, 1)):
            if value is not None and (not isinstance(value, int) or value < least):
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        current = self._client.get_subscription_group(
            pymq_pb2.GetSubscriptionGroupRequest(group_name=group)).config
        if retry_max_times is not None:
            current.retry_max_times = retry_max_times
        if retry_queue_nums is not None:
            current.retry_queue_nums = retry_queue_nums
        if consume_message_orderly is not None:
            current.consume_message_orderly = bool(consume_message_orderly)
        if consume_enable is not None:
            current.consume_enable = bool(consume_enable)
        resp = self._client.update_subscription_group(pymq_pb2.UpdateSubscriptionGroupRequest(config=current))
        return GroupConfig.from_proto(resp.config)

    def topic_stats(self, name: str) -> pd.DataFrame:
        """One row per queue of ``name``: min/max offset, message count, last store time."""
        resp = self._client.topic_stats(pymq_pb2.TopicStatsRequest(topic=name))
        rows = [
            {
                "topic": q.message_queue.topic,
                "broker_name": q.message_queue.broker_name,
                "queue_id": q.message_queue.queue_id,
                "min_offset": q.min_offset,
                "max_offset": q.max_offset,
                "messages": q.max_offset - q.min_offset,
                "last_store_timestamp": q.last_store_timestamp,
            }
            for q in resp.queues
        ]
        return _frame(
            rows,
            ["topic", "broker_name", "queue_id", "min_offset", "max_offset", "messages",
             "last_store_timestamp"],
        )

    def group_progress(
        self, group: str, topic: str | None = None, *, committed_only: bool = False,
    ) -> pd.DataFrame:
        """Broker and consumer offset and lag per queue, as ``mqadmin consumerProgress``:
        every read queue of ``topic``, or of each topic the group has progress on; a
        queue the group never committed on shows consumer offset 0.

        ``committed_only``: ``topic``'s rows only if the group has progress on it (none, rather
        than every queue at full lag, for a group that never read it).

        A group the broker does not know (no settings, no progress: a misspelt name) fails with
        a PymqError of code ``SUBSCRIPTION_GROUP_NOT_EXIST`` naming it, rather than an empty table
        that reads as "no lag", with or without ``topic`` (whose queues the broker answers at
        consumer offset 0 for any group); not checked with ``committed_only``, whose groups come
        from :meth:`groups`."""
        asked = "" if committed_only else topic or ""  # no topic: the broker answers the queues with progress
        resp = self._client.consumer_progress(
            pymq_pb2.ConsumerProgressRequest(consumer_group=group, topic=asked)
        )
        rows = [
            {
                "group": group,
                "topic": q.message_queue.topic,
                "broker_name": q.message_queue.broker_name,
                "queue_id": q.message_queue.queue_id,
                "broker_offset": q.broker_offset,
                "consumer_offset": q.consumer_offset,
                "lag": max(0, q.broker_offset - max(q.consumer_offset, 0)),
            }
            for q in resp.queues
            if topic in (None, q.message_queue.topic)
        ]
        if not committed_only:
            self._check_group_known(group, rows)
        return _frame(
            rows,
            ["group", "topic", "broker_name", "queue_id", "broker_offset", "consumer_offset",
             "lag"],
        )

    def reset_offset(
        self, group: str, topic: str, timestamp: int | datetime | None = None, *,
        offset: int | None = None, queue_id: int | None = None,
    ) -> pd.DataFrame:
        """Move ``group``'s offsets on ``topic``, lower or higher, as ``mqadmin resetOffsetByTime``
        (RocketMQ 5 resets on the broker): to the first message stored at or after ``timestamp``
        (ms since the epoch, or a datetime; 0: each queue's first message, -1: its end) on every
        queue of the topic, or on ``queue_id`` only; or to ``offset`` on ``queue_id``.

        What starts from the group's offsets reads from there: a PullConsumer, a new Spark query
        with ``startingOffsets=group``, and RocketMQ 5 clients, running ones too (their messages in
        flight on the queues are forgotten: their acks are refused). A running consumer that keeps
        its own offsets (a PullConsumer, a Spark query with its checkpoint) writes them over the
        reset at its next commit: stop it first, as Kafka's ``kafka-consumer-groups
        --reset-offsets`` wants a group without active members (a Spark query then starts
        with a new checkpoint).

        Returns one row per queue moved: group, topic, broker_name, queue_id, offset. An unknown
        group or topic fails (SUBSCRIPTION_GROUP_NOT_EXIST, TOPIC_NOT_EXIST), as an offset outside
        the queue's first message .. end does. Needs Update on the group and the topic when the
        broker has authorization on.

        Example::

            admin.reset_offset("billing", "orders", datetime(2026, 11, 28, 9, tzinfo=timezone.utc))
            admin.reset_offset("billing", "orders", offset=1200, queue_id=3)
        """
        if (timestamp is None) == (offset is None):
            raise ValueError("give timestamp= (ms since the epoch or a datetime; 0: the first message, "
                             "-1: the end) or offset= with queue_id=, "
                             f"not {'both' if offset is not None else 'neither'}")
        if queue_id is not None and (isinstance(queue_id, bool) or not isinstance(queue_id, int)
                                     or queue_id < 0):
            raise ValueError(f"queue_id must be an int >= 0 (a queue of {topic!r}), got {queue_id!r}")
        request = pymq_pb2.ResetOffsetRequest(consumer_group=group, topic=topic,
                                              queue_id=-1 if queue_id is None else queue_id)
        if offset is not None:
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset must be an int >= 0 (a queue offset), got {offset!r}")
            if queue_id is None:
                raise ValueError(f"offset={offset} needs queue_id= (the queue it is for); to move every "
                                 "queue, give timestamp=")
            request.offset = offset
        else:
            request.timestamp = _epoch_ms(timestamp)
        resp = self._client.reset_offset(request)
        rows = [{"group": group, "topic": q.message_queue.topic, "broker_name": q.message_queue.broker_name,
                 "queue_id": q.message_queue.queue_id, "offset": q.offset} for q in resp.offsets]
        return _frame(rows, ["group", "topic", "broker_name", "queue_id", "offset"])

    def _check_group_known(self, group: str, progress: list[dict[str, Any]]) -> None:
        """A PymqError (GROUP_NOT_EXIST) naming ``group`` unless its ``progress`` rows show a commit,
        the brokers know it (its settings or its offsets) or it is pymq's own; nothing when that
        cannot be told (a user who may not list the groups). Rows at consumer offset 0 prove
        nothing: brokers answer a topic's every queue so for any group name."""
        if group in INTERNAL_GROUPS or any(r["consumer_offset"] > 0 for r in progress):
            return
        try:
            known = set(self.groups(include_internal=True)["group"])
        except NoPermissionError:
            return
        if group not in known:
            raise PymqError(f"consumer group {group!r} is unknown to {self._brokers_here()} (no settings, "
                            "no progress): check its name; Admin.groups() (`pymq-admin groups`) lists the "
                            "groups they know",
                            code=GROUP_NOT_EXIST)

    def _brokers_here(self) -> str:
        """The brokers this Admin reads, as an error names them."""
        return f"the broker at {self.endpoint}"

    def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """A message by its msgId (UNIQ_KEY) within ``topic``, or by its offsetMsgId.

        Both ids are 32 hex digits, so ``topic`` says which one is meant: with a
        topic the id is a msgId, without one an offsetMsgId (store host and commit log
        offset). A msgId given without its topic is read as an offset that holds no
        message: the QUERY_NOT_FOUND error then says to give ``topic=``.
        """
        hint = (f"if {msg_id} is a msgId (UNIQ_KEY, as query_message and the source's msg_id column show), "
                f"give its topic: view_message({msg_id!r}, topic=...)")
        if topic is not None:
            req = pymq_pb2.ViewMessageRequest(commit_log_offset=-1, topic=topic, msg_id=msg_id)
        else:
            _ip, _port, phy = parse_offset_msg_id(msg_id)
            if phy < 0:  # no offsetMsgId has one: a msgId's bits
                raise PymqError(f"no message at commit log offset {phy}; {hint}", code="QUERY_NOT_FOUND")
            req = pymq_pb2.ViewMessageRequest(commit_log_offset=phy)
        try:
            resp = self._client.view_message(req)
        except PymqError as err:
            if topic is not None or err.code != "QUERY_NOT_FOUND":
                raise
            raise type(err)(f"{err.remark}; {hint}", code=err.code) from None
        return decode_messages(resp.records, self._broker_name(topic))[0]

    def _broker_name(self, topic: str | None = None) -> str:
        """The broker's name: from ``topic``'s route when given (with authorization on, a user who
        may read the topic may ask for its route), else from the broker's runtime info (which
        needs Get on the cluster)."""
        if self._name is None and topic:
            route = self._client.query_route(pymq_pb2.QueryRouteRequest(topic=topic))
            if route.brokers:
                self._name = str(route.brokers[0].broker_name)
        if self._name is None:
            info = self._client.broker_runtime_info(pymq_pb2.BrokerRuntimeInfoRequest())
            self._name = str(info.broker_name)
        return self._name

    def query_message(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = 0
    ) -> list[MessageExt]:
        """Messages of ``topic`` whose KEYS (or UNIQ_KEY) include ``key``."""
        resp = self._client.query_message(
            pymq_pb2.QueryMessageRequest(
                topic=topic, key=key, max_num=max_num, begin_timestamp=begin_ms,
                end_timestamp=end_ms,
            )
        )
        return decode_messages(resp.records, self._broker_name(topic))

    # -- dead letters ------------------------------------------------------------

    def dead_letter_messages(self, group: str, max_num: int = 1000) -> list[MessageExt]:
        """The messages in %DLQ%<group>, oldest first (at most ``max_num``); a group the brokers
        do not know fails naming it (GROUP_NOT_EXIST), rather than "no dead letters"."""
        consumer, queues = self._dead_letter_queues(group)
        if not queues:
            self._check_group_known(group, [])
        out: list[MessageExt] = []
        for mq in queues:
            out.extend(pull_messages(consumer, mq, consumer.min_offset(mq), max_num - len(out)))
        return out

    def _dead_letter_queues(self, group: str) -> tuple[PullConsumer, list[MessageQueue]]:
        """A consumer for %DLQ%<group> and its queues (none, without creating it, if it does not exist)."""
        consumer = PullConsumer(self.endpoint, DLQ_BROWSER_GROUP, **self._security)
        topic = dlq_topic(group)
        if topic not in self.topic_names(include_system=True):
            return consumer, []
        return consumer, consumer.queues(topic)

    def dead_letters(self, group: str, max_num: int = 1000) -> pd.DataFrame:
        """One row per dead letter of ``group``: where it came from, why, how often retried.

        ``msg_id`` is the message's msgId (UNIQ_KEY, kept across retries);
        ``origin_msg_id`` the offsetMsgId of the message as first stored in its topic
        (RocketMQ's ORIGIN_MESSAGE_ID): ``view_message(origin_msg_id)`` shows it.
        """
        rows = [
            {
                "msg_id": m.msg_id,
                # RocketMQ's dead letters keep RETRY_TOPIC / ORIGIN_MESSAGE_ID instead
                "origin_topic": m.properties.get(MessageConst.PROPERTY_DLQ_ORIGIN_TOPIC)
                or m.properties.get(MessageConst.PROPERTY_RETRY_TOPIC, ""),
                "origin_msg_id": _origin_msg_id(m),
                "reconsume_times": m.reconsume_times,
                "reason": m.properties.get(MessageConst.PROPERTY_CONSUME_FAILURE_REASON, ""),
                "tags": m.tags,
                "keys": " ".join(m.keys),
                "store_timestamp": m.store_timestamp,
                "queue_offset": m.queue_offset,
                "body": m.body,
            }
            for m in self.dead_letter_messages(group, max_num)
        ]
        return _frame(rows, ["msg_id", "origin_topic", "origin_msg_id", "reconsume_times", "reason",
                             "tags", "keys", "store_timestamp", "queue_offset", "body"])

    def resend_dead_letters(
        self, group: str, msg_ids: Iterable[str] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Send dead letters of ``group`` again to their original topic, retry count reset.

        Without ``msg_ids`` every dead letter not re-sent yet is re-sent (progress
        is kept as the offset of an internal group, on the broker's disk when the call returns, so
        running it again after it finished does not send twice, a broker crash in between too;
        two runs at once, from any process, both send what neither has recorded yet: run one
        at a time). ``msg_ids`` picks dead letters by their msgId, their own
        offsetMsgId or their ``origin_msg_id`` (the original's offsetMsgId: the
        columns of :meth:`dead_letters`). A re-sent message carries the original's
        offsetMsgId in ORIGIN_MESSAGE_ID. Returns how many were sent.
        ``progress(done, total)`` is called as it goes. A letter that cannot be sent as it
        is (a foreign producer's ``\\x01`` inside a tag) or that its topic refuses for good (the
        topic was deleted, an illegal message) is logged and left in the DLQ; it is not sent
        again by later calls without ``msg_ids``. Progress is committed letter by letter, so an
        error that stops the call (no permission to send to the topic, a timeout, a busy broker:
        a later call may succeed) is raised with every letter sent before it recorded as sent.
        With users and ACLs on, the internal group is ``PYMQ_DLQ_RESEND``: the call pulls as it
        (``Sub``) and writes its progress to disk as an offset reset of it (``Update`` on
        ``Group:PYMQ_DLQ_RESEND`` and on ``group``); without ``Update`` the progress stays committed
        in the broker's memory (on disk within 5 s) and a warning says so.
        """
        wanted = None if msg_ids is None else set(msg_ids) - {""}
        letters = self.dead_letter_messages(group, max_num=10**9)
        consumer = PullConsumer(self.endpoint, DLQ_RESEND_GROUP, **self._security)
        if wanted is None:
            done_upto: dict[MessageQueue, int] = {}
            for mq in {MessageQueue(m.topic, m.broker_name, m.queue_id) for m in letters}:
                done_upto[mq] = consumer.committed(mq)
            letters = [m for m in letters
                       if m.queue_offset >= done_upto[MessageQueue(m.topic, m.broker_name, m.queue_id)]]
        else:
            letters = [m for m in letters if not wanted.isdisjoint(
                (m.msg_id, m.offset_msg_id, _origin_msg_id(m)))]
        from .producer import Producer

        recorded: dict[MessageQueue, int] = {}

        def handled(m: MessageExt) -> None:
            """Record ``m`` as done (sent or left in the DLQ for good): later calls start after it."""
            if wanted is None:
                mq = MessageQueue(m.topic, m.broker_name, m.queue_id)
                consumer.commit(mq, m.queue_offset + 1)
                recorded[mq] = m.queue_offset + 1

        sent = skipped = 0
        with Producer(self.endpoint, **self._security) as producer, _on_disk(self, recorded):
            for m in letters:
                origin = m.properties.get(MessageConst.PROPERTY_DLQ_ORIGIN_TOPIC) or m.retry_topic
                if not origin:
                    handled(m)
                    continue
                origin_id = _origin_msg_id(m) or m.offset_msg_id
                try:  # ORIGIN_MESSAGE_ID is a system property: a SystemMessage
                    again = SystemMessage(origin, m.body, tags=m.tags, keys=m.keys, properties={
                        **m.user_properties, MessageConst.PROPERTY_ORIGIN_MESSAGE_ID: origin_id})
                    producer.send_sync(again)
                except (TypeError, ValueError, *_REFUSED_FOR_GOOD) as err:
                    # a foreign producer's letter whose tags, keys or properties cannot be sent as
                    # they are (a \x01 inside a value), or one its topic refuses for good (deleted,
                    # illegal): it stays in the DLQ; the others go on. Other errors (no permission,
                    # timeouts, a busy broker) stop the call, with what was sent committed
                    log.warning("dead letter %s of %s is not sent again (nor by later calls without "
                                "msg_ids): %s", m.msg_id, group, err)
                    skipped += 1
                else:
                    sent += 1
                # committed after each send, so that an error or a crash later on does not
                # send this one again (with a new msgId) at the next call
                handled(m)
                if progress is not None:
                    progress(sent + skipped, len(letters))
        return sent

    def purge_dead_letters(self, group: str) -> None:
        """Drop every dead letter of ``group`` (%DLQ%<group> starts empty again); a group the
        broker does not know fails naming it (GROUP_NOT_EXIST), rather than purging nothing."""
        topic = dlq_topic(group)
        if topic in self.topic_names(include_system=True):
            self._client.delete_topic(pymq_pb2.DeleteTopicRequest(topic=topic))
        else:
            self._check_group_known(group, [])

    def broker_names(self) -> list[str]:
        """The brokers this Admin reads (one for a pymq broker)."""
        return [self._broker_name()]

    def broker_info(self, broker_name: str | None = None) -> dict[str, str]:
        """The broker's runtime info (what ``mqadmin brokerStatus`` shows, RocketMQ's keys):
        ``commitLogMinOffset``, ``commitLogMaxOffset``, ``commitLogDiskRatio``, ``diskFull``, ...

        ``broker_name``: which broker (None: this one; a cluster of several needs it).
        """
        resp = self._client.broker_runtime_info(pymq_pb2.BrokerRuntimeInfoRequest())
        if broker_name is not None and broker_name != resp.broker_name:
            raise ValueError(f"broker_name {broker_name!r}: this Admin talks to broker {resp.broker_name!r} "
                             f"at {self.endpoint}")
        return {"broker_name": resp.broker_name, "endpoint": resp.endpoint, **dict(resp.info)}

    # -- users and ACLs (ACL 2.0; a Super user's business) ------------------------------------

    def create_user(self, username: str, password: str, user_type: str = "Normal") -> None:
        """Create a user (``user_type`` "Super" or "Normal"); its username and password are a
        client's ``access_key`` and ``secret_key``."""
        self._client.create_user(pymq_pb2.CreateUserRequest(
            user=pymq_pb2.UserInfo(username=username, password=password, user_type=user_type)))

    def update_user(self, username: str, password: str | None = None, user_type: str | None = None,
                    user_status: str | None = None) -> None:
        """Change a user's password, type ("Super"/"Normal") or status ("enable"/"disable");
        what is None stays."""
        self._client.update_user(pymq_pb2.UpdateUserRequest(user=pymq_pb2.UserInfo(
            username=username, password=password or "", user_type=user_type or "",
            user_status=user_status or "")))

    def delete_user(self, username: str) -> None:
        """Delete a user and its ACL."""
        self._client.delete_user(pymq_pb2.DeleteUserRequest(username=username))

    def list_users(self, filter: str = "") -> pd.DataFrame:
        """Users whose name contains ``filter``: username, user_type, user_status (never a password)."""
        resp = self._client.list_users(pymq_pb2.ListUsersRequest(filter=filter))
        return _frame([{"username": u.username, "user_type": u.user_type, "user_status": u.user_status}
                       for u in resp.users], ["username", "user_type", "user_status"])

    def create_acl(self, subject: str, resources: Iterable[str], actions: Iterable[str],
                   decision: str = "Allow", source_ips: Iterable[str] = ()) -> None:
        """Grant (or deny) ``subject`` ("User:<name>") ``actions`` on each of ``resources``.

        Resources: "Topic:orders", "Group:billing", "Topic:orders-*" (prefix), "Topic:*" (any;
        patterns never cover system topics); actions: Pub, Sub, Create, Update, Delete, Get,
        List, All; ``decision``: Allow or Deny (a Deny wins); ``source_ips``: CIDR ranges the
        entry holds for (none: any). An entry for a resource the ACL has already is replaced.

        Example::

            admin.create_acl("User:alice", ["Topic:orders"], ["Pub"])
            admin.create_acl("User:bob", ["Topic:orders", "Group:billing"], ["Sub"])
        """
        actions, source_ips = list(actions), list(source_ips)
        entries = [pymq_pb2.PolicyEntry(resource=r, actions=actions, source_ips=source_ips, decision=decision)
                   for r in ([resources] if isinstance(resources, str) else resources)]
        acl = pymq_pb2.AclInfo(subject=subject, entries=entries)
        self._client.create_acl(pymq_pb2.CreateAclRequest(acl=acl))

    def delete_acl(self, subject: str, resources: Iterable[str] = ()) -> None:
        """Remove the entries of ``resources`` from ``subject``'s ACL (none given: the whole ACL)."""
        self._client.delete_acl(pymq_pb2.DeleteAclRequest(
            subject=subject, resources=[resources] if isinstance(resources, str) else list(resources)))

    def list_acls(self, subject: str | None = None, resources: Iterable[str] = (),
                  actions: Iterable[str] = (), decision: str | None = None) -> pd.DataFrame:
        """ACL entries, one row each (subject, resource, actions, source_ips, decision), filtered
        by subject, resources, any of ``actions`` and decision."""
        resp = self._client.list_acls(pymq_pb2.ListAclsRequest(
            subject=subject or "", resources=[resources] if isinstance(resources, str) else list(resources),
            actions=[actions] if isinstance(actions, str) else list(actions), decision=decision or ""))
        return _frame(
            [{"subject": a.subject, "resource": e.resource, "actions": ",".join(e.actions),
              "source_ips": ",".join(e.source_ips), "decision": e.decision}
             for a in resp.acls for e in a.entries],
            ["subject", "resource", "actions", "source_ips", "decision"],
        )


@contextmanager
def _on_disk(admin: Admin, recorded: dict[MessageQueue, int]) -> Iterator[None]:
    """On leaving (done, or stopped by an error), the resend's progress in ``recorded`` written to the
    broker's disk. A commit (UpdateOffset) is kept in memory until the broker's next periodic write
    (flushConsumerOffsetInterval, 5 s, as RocketMQ's): a broker crashed within it forgot the progress,
    and the next call sent every letter again, with new msgIds. A reset (ResetOffset) to the same
    offsets answers once they are on disk."""
    try:
        yield
    finally:
        for mq, offset in recorded.items():
            try:
                admin.reset_offset(DLQ_RESEND_GROUP, mq.topic, offset=offset, queue_id=mq.queue_id)
            except PymqError as err:  # e.g. no Update on the group: the commits stand, in memory
                log.warning("the progress of the dead letters re-sent from %s is committed but not yet "
                            "on the broker's disk (%s): a broker crash within 5 s would send them "
                            "again at the next call", mq.topic, err)
