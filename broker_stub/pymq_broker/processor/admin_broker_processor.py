"""AdminBrokerProcessor: topics, routes, stats, groups, message look-ups."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import group_name_problem, is_system_topic, topic_name_problem
from ..manager.subscription_group_manager import SubscriptionGroupConfig
from ..manager.topic_config_manager import TopicConfig
from ..transaction.transactional_message_service import TransactionalMessageService
from .context import BrokerContext
from .dedup import DedupWindow

log = logging.getLogger(__name__)

# the TopicConfig fields a CreateTopic may keep from an existing topic (CreateTopicRequest.keep)
_KEEPABLE = ("read_queue_nums", "write_queue_nums", "perm", "dedup_window_ms", "order")


def is_view_by_msg_id(req: pymq_pb2.ViewMessageRequest) -> bool:
    """Whether a ViewMessage is a look-up by msgId within ``req.topic`` (else: by commit-log offset).

    The one predicate of both the processor and the authorization rule (Sub and Get on the
    topic for a look-up, Get on the cluster by offset): when they disagreed, offset 0 plus a
    topic the caller may read returned the commit log's first record, whatever its topic.
    A look-up is what the clients send: commit_log_offset -1, a topic and a msg_id.
    """
    return req.commit_log_offset < 0 and bool(req.topic) and bool(req.msg_id)


class AdminBrokerProcessor:
    def __init__(self, ctx: BrokerContext, dedup: DedupWindow,
                 transactions: TransactionalMessageService) -> None:
        self.ctx = ctx
        self.dedup = dedup
        self.transactions = transactions

    def query_route(self, req: pymq_pb2.QueryRouteRequest) -> pymq_pb2.TopicRouteData:
        """GET_ROUTEINFO_BY_TOPIC: the topic's queues and the endpoint of each broker.

        As RocketMQ, asking does not create a topic: %RETRY%<group> has no route until a
        consumer of the group registers (HEART_BEAT) or sends a message back.
        """
        tcm = self.ctx.topic_config_manager
        cfg = tcm.select_topic_config(req.topic)
        if (
            cfg is None
            and tcm.auto_create_topic_enable
            and topic_name_problem(req.topic) is None
            and not is_system_topic(req.topic)
        ):
            # RocketMQ's TBW102 route: where an unknown topic may be sent to be created
            n = tcm.default_topic_queue_nums
            cfg = TopicConfig(req.topic, n, n)
        if cfg is None:
            cfg = self.ctx.topic_config(req.topic)  # raises the error that fits
        return pymq_pb2.TopicRouteData(
            topic=req.topic,
            brokers=[pymq_pb2.BrokerData(broker_name=self.ctx.broker_name, endpoint=self.ctx.endpoint)],
            queues=[
                pymq_pb2.QueueData(
                    broker_name=self.ctx.broker_name,
                    read_queue_nums=cfg.read_queue_nums,
                    write_queue_nums=cfg.write_queue_nums,
                    perm=cfg.perm,
                )
            ],
        )

    async def create_topic(self, req: pymq_pb2.CreateTopicRequest) -> pymq_pb2.CreateTopicResponse:
        """UPDATE_AND_CREATE_TOPIC. An existing topic keeps the fields named in ``keep`` (a
        provisioning script run twice must not reset what it does not name), and a cut of read
        queues that would hide unread messages is refused unless ``allow_shrink``.

        As RocketMQ's, it answers once topics.json holds the topic (a crash right after must not
        lose a topic whose messages may be in the commit log), but the write runs on a thread:
        at 3,000 topics it took 50-160 ms, every other client's time while it ran on the event loop.
        """
        c = req.config
        await self.ctx.deletion_done(c.topic_name)  # a DeleteTopic of the name still writing goes first
        manager = self.ctx.topic_config_manager
        old = manager.select_topic_config(c.topic_name)
        unknown = sorted(set(req.keep) - set(_KEEPABLE))
        if unknown:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT, f"keep names {unknown}: only {', '.join(_KEEPABLE)} can be kept"
            )
        values = {f: getattr(c, f) for f in _KEEPABLE}
        if old is not None:
            values.update({f: getattr(old, f) for f in req.keep})
        # no type named: a new topic is NORMAL (RocketMQ's default), an existing one keeps its type
        message_type = c.message_type.upper() or (old.message_type if old is not None else "NORMAL")
        if (old is not None and req.update_if_exists and not req.allow_shrink
                and values["read_queue_nums"] < old.read_queue_nums):
            self._refuse_shrink(old, values["read_queue_nums"])
        cfg, created = manager.create_topic(
            TopicConfig(c.topic_name, message_type=message_type, **values),
            update_if_exists=req.update_if_exists, persist=False,
        )
        await manager.persist_async()
        return pymq_pb2.CreateTopicResponse(config=cfg.to_proto(), created=created)

    def _refuse_shrink(self, old: TopicConfig, reads: int) -> None:
        """Refuse ``reads`` read queues if a queue to go holds messages some consumer group
        has not read, or that no group has read (a group's progress past the queue's end:
        read)."""
        topic = old.topic_name
        store = self.ctx.store
        offsets = self.ctx.consumer_offset_manager
        groups = sorted(offsets.groups_of_topic(topic))
        unread: dict[int, list[str]] = {}
        for qid in range(reads, old.read_queue_nums):
            end = store.get_max_offset_in_queue(topic, qid)
            if end <= store.get_min_offset_in_queue(topic, qid):
                continue  # empty: nothing to hide
            behind = [g for g in groups if offsets.query_offset(g, topic, qid) < end]
            if behind or not groups:
                unread[qid] = behind
        if not unread:
            return
        behind = sorted({g for gs in unread.values() for g in gs})
        who = (f"consumer group(s) {behind} have not read" if behind
               else "no consumer group has read")
        raise BrokerException(
            pymq_pb2.ILLEGAL_ARGUMENT,
            f"topic {topic!r} has {old.read_queue_nums} read queues and queue(s) {sorted(unread)} "
            f"hold messages {who}: {reads} read queues would leave them unread. Cut the write "
            f"queues to {reads} first (pymq-admin create-topic --write-queues {reads}, or "
            "Admin.create_topic's write_queues) and let the consumers reach the end of those queues "
            "(RocketMQ's scale-in), or pass allow_shrink=True (pymq-admin create-topic --allow-shrink)",
        )

    async def delete_topic(self, req: pymq_pb2.DeleteTopicRequest) -> pymq_pb2.DeleteTopicResponse:
        """RocketMQ's deleteTopicInBroker. The topic leaves the topic table at once, on the event
        loop (no request after this one sees it, none writes to it); the rest runs in a task, its
        slow parts on threads, and the answer comes once all of it is on disk: the store's
        checkpoint moved past the topic's records, its queues taken out and their files removed, its
        consumer offsets written, then topics.json without it. On the event loop, removing a
        1,024-queue topic's files held every client up for 0.2-0.6 s, and the checkpoint's flush of
        2,560 queues up to 2.7 s.

        The topic's config leaves topics.json last (every write of the file keeps it until then,
        whoever makes it), and the emptied queue directory stays as a marker until it has: a kill -9
        in between leaves the marker, and the next start finishes the deletion (the controller's
        ``_finish_deletions``); a kill before the marker leaves the topic whole. A topic of the name
        is not made again (CreateTopic, a send's auto-create) before all of it is on disk."""
        topic = req.topic
        tcm = self.ctx.topic_config_manager
        tcm.delete_topic(topic, persist=False)  # checks it may be deleted
        # a task of its own: a client that gives up waiting must not cut the writes short
        task = asyncio.ensure_future(self._delete(topic))
        self.ctx.deleting_topics[topic] = task
        task.add_done_callback(partial(self._deleted, topic))
        await asyncio.shield(task)
        return pymq_pb2.DeleteTopicResponse()

    async def _delete(self, topic: str) -> None:
        ctx, store = self.ctx, self.ctx.store
        # a crash recovery queues again the records after the checkpoint: it must be past the
        # topic's records before its queue files go (see DefaultMessageStore.detach_topic); none
        # come after them, the topic being out of the table
        store.do_reput()
        await asyncio.to_thread(store.checkpoint_now)
        queues = store.detach_topic(topic, checkpoint=False)  # renamed aside: the marker
        ctx.consumer_offset_manager.remove_topic(topic)  # cleanOffsetByTopic
        for hook in ctx.delete_topic_hooks:  # the v2 proxy's pop state, the held pulls
            hook(topic)
        self.dedup.forget_topic(topic)
        await asyncio.to_thread(queues.remove)
        # not left to the periodic flush: DeleteTopic answers once they are on disk
        await ctx.consumer_offset_manager.persist_async()
        tcm = ctx.topic_config_manager
        tcm.deletion_written(topic)
        await tcm.persist_async()
        await asyncio.to_thread(queues.release)

    def _deleted(self, topic: str, task: asyncio.Task[None]) -> None:
        deleting = self.ctx.deleting_topics
        if deleting.get(topic) is task:
            del deleting[topic]
        if not task.cancelled() and task.exception() is not None:  # its DeleteTopic reports it, if waiting
            log.warning("deleting topic %s: %s", topic, task.exception())

    def list_topics(self, req: pymq_pb2.ListTopicsRequest) -> pymq_pb2.ListTopicsResponse:
        table = self.ctx.topic_config_manager.topic_config_table
        return pymq_pb2.ListTopicsResponse(
            topics=[
                cfg.to_proto()
                for name, cfg in sorted(table.items())
                if req.include_system or not is_system_topic(name)
            ]
        )

    def topic_stats(self, req: pymq_pb2.TopicStatsRequest) -> pymq_pb2.TopicStatsResponse:
        cfg = self.ctx.topic_config(req.topic)
        store = self.ctx.store
        queues = []
        for qid in range(max(cfg.read_queue_nums, cfg.write_queue_nums)):
            queues.append(
                pymq_pb2.QueueStats(
                    message_queue=pymq_pb2.MessageQueue(
                        topic=req.topic, broker_name=self.ctx.broker_name, queue_id=qid
                    ),
                    min_offset=store.get_min_offset_in_queue(req.topic, qid),
                    max_offset=store.get_max_offset_in_queue(req.topic, qid),
                    last_store_timestamp=store.get_last_store_timestamp(req.topic, qid),
                )
            )
        return pymq_pb2.TopicStatsResponse(queues=queues, topic_id=cfg.topic_id)

    def consumer_progress(
        self, req: pymq_pb2.ConsumerProgressRequest
    ) -> pymq_pb2.ConsumerProgressResponse:
        """GET_CONSUME_STATS, as RocketMQ answers it: every read queue of ``topic`` (or of
        each topic the group has progress on), with the broker's max offset and the group's
        offset, 0 where the group never committed."""
        store = self.ctx.store
        progress = self.ctx.consumer_offset_manager.query_group(req.consumer_group)
        if req.topic:
            self.ctx.topic_config(req.topic)  # TOPIC_NOT_EXIST names it
            progress = {req.topic: progress.get(req.topic, {})}
        tcm = self.ctx.topic_config_manager
        out = []
        for topic in sorted(progress):
            cfg = tcm.select_topic_config(topic)
            if cfg is None:  # deleted since: RocketMQ leaves it out
                continue
            for qid in range(cfg.read_queue_nums):
                out.append(
                    pymq_pb2.QueueProgress(
                        message_queue=pymq_pb2.MessageQueue(
                            topic=topic, broker_name=self.ctx.broker_name, queue_id=qid
                        ),
                        broker_offset=store.get_max_offset_in_queue(topic, qid),
                        consumer_offset=max(progress[topic].get(qid, 0), 0),
                        last_store_timestamp=store.get_last_store_timestamp(topic, qid),
                    )
                )
        return pymq_pb2.ConsumerProgressResponse(queues=out)

    def list_groups(self, req: pymq_pb2.ListGroupsRequest) -> pymq_pb2.ListGroupsResponse:
        mgr = self.ctx.subscription_group_manager
        names = set(mgr.subscription_group_table) | self.ctx.consumer_offset_manager.groups()
        return pymq_pb2.ListGroupsResponse(
            groups=[
                mgr.subscription_group_table.get(n, SubscriptionGroupConfig(n)).to_proto()
                for n in sorted(names)
            ]
        )

    async def reset_offset(self, req: pymq_pb2.ResetOffsetRequest) -> pymq_pb2.ResetOffsetResponse:
        """INVOKE_BROKER_TO_RESET_OFFSET as RocketMQ 5 runs it by default (``useServerSideResetOffset``,
        ``resetOffsetInner``): the group's offset on each queue of ``topic`` (or on ``queue_id``) moves
        to the first message stored at or after ``timestamp`` (-1: the queue's end), or to ``offset``
        on one queue, lower or higher than before. The group's v2 (pop) consumers read from there
        too: their messages in flight are forgotten (RocketMQ clears the queue's in-flight count
        and pop offset). A running PullConsumer or Spark query commits its own offsets over it
        (RocketMQ's reset table, which ignores their commits until their next pull, is not
        modelled): this moves where a new query (startingOffsets=group), a PullConsumer and a
        RocketMQ 5 client start.
        """
        group = req.consumer_group
        problem = group_name_problem(group)
        if problem:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
        cfg = self.ctx.topic_config(req.topic)
        offsets = self.ctx.consumer_offset_manager
        if (group not in self.ctx.subscription_group_manager.subscription_group_table
                and group not in offsets.groups()):
            raise BrokerException(
                pymq_pb2.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"consumer group {group!r} does not exist on broker {self.ctx.broker_name} (no "
                "settings, no progress): check its name (Admin.groups() lists the groups), or "
                "create it first (Admin.update_group / pymq-admin update-group)",
            )
        store, topic = self.ctx.store, req.topic
        by_offset = req.HasField("offset")
        if by_offset == req.HasField("timestamp"):
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT,
                                  "a reset needs a timestamp (every queue, or queue_id's) or an offset "
                                  "(with queue_id), not " + ("both" if by_offset else "neither"))
        if not by_offset and req.timestamp < -1:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"timestamp {req.timestamp} must be ms since "
                                  "the epoch (>= 0), or -1 for each queue's end")
        if req.queue_id < -1:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT,
                                  f"queue id {req.queue_id} must be -1 (every queue) or a queue of {topic!r}")
        if by_offset and req.queue_id < 0:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT,
                                  f"offset {req.offset} needs the queue id it is for (queue id -1: by time)")
        if req.queue_id >= 0:
            self.ctx.check_queue(topic, req.queue_id, write=False)
        queue_ids = [req.queue_id] if req.queue_id >= 0 else list(range(cfg.read_queue_nums))
        if not queue_ids:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"topic {topic!r} has no read queues to reset")
        moved: dict[int, int] = {}
        for qid in queue_ids:
            if by_offset:
                low = store.get_min_offset_in_queue(topic, qid)
                high = store.get_max_offset_in_queue(topic, qid)
                if not low <= req.offset <= high:
                    raise BrokerException(
                        pymq_pb2.ILLEGAL_ARGUMENT,
                        f"offset {req.offset} is outside {topic}#{qid}'s offsets {low}..{high} "
                        "(its first message .. its end)",
                    )
                moved[qid] = req.offset
            elif req.timestamp == -1:
                moved[qid] = store.get_max_offset_in_queue(topic, qid)
            else:
                moved[qid] = store.get_offset_in_queue_by_time(topic, qid, req.timestamp)
        for qid, offset in moved.items():
            offsets.commit_offset(group, topic, qid, offset)
        # on disk before the v2 proxy drops its state (a kill -9 between the two then leaves the
        # old state above a backward reset: nothing delivered twice, the reset to run again) and
        # before the answer (written on a thread: consumerOffset.json holds every group's offsets)
        await offsets.persist_async()
        for hook in self.ctx.reset_offset_hooks:
            hook(group, topic, moved)
        queue = partial(pymq_pb2.MessageQueue, topic=topic, broker_name=self.ctx.broker_name)
        return pymq_pb2.ResetOffsetResponse(offsets=[
            pymq_pb2.QueueOffset(message_queue=queue(queue_id=qid), offset=offset)
            for qid, offset in moved.items()
        ])

    async def update_subscription_group(
        self, req: pymq_pb2.UpdateSubscriptionGroupRequest
    ) -> pymq_pb2.SubscriptionGroupResponse:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: answered once on disk, written on a thread."""
        c = req.config
        manager = self.ctx.subscription_group_manager
        cfg = manager.update_subscription_group_config(
            SubscriptionGroupConfig(
                c.group_name, c.retry_queue_nums or 1, c.retry_max_times,
                c.consume_from_where or "CONSUME_FROM_LAST_OFFSET", c.consume_enable,
                c.consume_broadcast_enable, c.consume_message_orderly,
            ),
            persist=False,
        )
        await manager.persist_async()
        return pymq_pb2.SubscriptionGroupResponse(config=cfg.to_proto())

    def get_subscription_group(
        self, req: pymq_pb2.GetSubscriptionGroupRequest
    ) -> pymq_pb2.SubscriptionGroupResponse:
        cfg = self.ctx.subscription_group_manager.find_subscription_group_config(req.group_name)
        return pymq_pb2.SubscriptionGroupResponse(config=cfg.to_proto())

    def view_message(self, req: pymq_pb2.ViewMessageRequest) -> pymq_pb2.RecordsResponse:
        """VIEW_MESSAGE_BY_ID: by physical offset, or by msgId (UNIQ_KEY) within a topic
        (:func:`is_view_by_msg_id` tells which, here and in its authorization rule)."""
        if not is_view_by_msg_id(req):
            if req.commit_log_offset < 0:
                raise BrokerException(
                    pymq_pb2.ILLEGAL_ARGUMENT,
                    "view a message by commit_log_offset >= 0, or by topic and msg_id with "
                    "commit_log_offset -1",
                )
            record = self.ctx.store.look_message_by_offset(req.commit_log_offset)
            if record is None:
                raise BrokerException(
                    pymq_pb2.QUERY_NOT_FOUND,
                    f"no message at commit log offset {req.commit_log_offset}",
                )
            return pymq_pb2.RecordsResponse(records=record, message_count=1, store_host=self.ctx.endpoint)
        self.ctx.topic_config(req.topic)
        found = self.ctx.store.query_message(req.topic, req.msg_id, 1, 0, int(time.time() * 1000))
        if not found:
            raise BrokerException(
                pymq_pb2.QUERY_NOT_FOUND, f"no message with msg id {req.msg_id!r} in {req.topic!r}"
            )
        return pymq_pb2.RecordsResponse(records=found[0], message_count=1, store_host=self.ctx.endpoint)

    def query_message(self, req: pymq_pb2.QueryMessageRequest) -> pymq_pb2.RecordsResponse:
        """QUERY_MESSAGE: by KEYS (or UNIQ_KEY) within a time range."""
        self.ctx.topic_config(req.topic)
        if not req.key:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, "query key must not be empty")
        max_num = req.max_num or self.ctx.store.config.default_query_max_num
        if not 1 <= max_num <= 10_000:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT, f"max_num {req.max_num} is out of range 1..10000"
            )
        end = req.end_timestamp or int(time.time() * 1000) + 1000
        found = self.ctx.store.query_message(req.topic, req.key, max_num, req.begin_timestamp, end)
        return pymq_pb2.RecordsResponse(
            records=b"".join(found), message_count=len(found), store_host=self.ctx.endpoint
        )

    def runtime_info(self, req: pymq_pb2.BrokerRuntimeInfoRequest) -> pymq_pb2.BrokerRuntimeInfoResponse:
        tx = self.transactions.config
        return pymq_pb2.BrokerRuntimeInfoResponse(
            broker_name=self.ctx.broker_name,
            endpoint=self.ctx.endpoint,
            info={**self.ctx.store.runtime_info(),
                  "transactionsPending": str(len(self.transactions.pending)),
                  # RocketMQ's BrokerConfig names: how long a half message may stay undecided
                  "transactionTimeOut": str(tx.transaction_timeout),
                  "transactionCheckInterval": str(tx.transaction_check_interval),
                  "transactionCheckMax": str(tx.transaction_check_max)},
        )

