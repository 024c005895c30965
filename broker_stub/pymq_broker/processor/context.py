"""What every processor needs: the store and the managers (the controller builds it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from pymq_proto.topics import get_dlq_topic, not_created_yet
from pymq_proto.v1 import pymq_pb2

from ..broker_config import BrokerConfig
from ..common.broker_exception import BrokerException
from ..common.mix_all import is_broker_topic, topic_name_problem
from ..common.perm import is_readable, is_writeable
from ..manager.consumer_offset_manager import ConsumerOffsetManager
from ..manager.subscription_group_manager import SubscriptionGroupManager
from ..manager.topic_config_manager import TopicConfig, TopicConfigManager
from ..store.message_store import DefaultMessageStore


@dataclass
class BrokerContext:
    broker_config: BrokerConfig
    store: DefaultMessageStore
    topic_config_manager: TopicConfigManager
    consumer_offset_manager: ConsumerOffsetManager
    subscription_group_manager: SubscriptionGroupManager
    endpoint: str = ""  # host:port the gRPC server is bound to (set once it is)
    # called with a topic DeleteTopic removes, before it answers (the v2 proxy drops its pop state)
    delete_topic_hooks: list[Callable[[str], None]] = field(default_factory=list)
    # called with (group, topic, {queue id: offset}) of the queues ResetOffset moved, once their
    # offsets are written (the v2 proxy reads them for the group from there)
    reset_offset_hooks: list[Callable[[str, str, dict[int, int]], None]] = field(default_factory=list)
    # DeleteTopics still writing their removal (AdminBrokerProcessor.delete_topic), by topic
    deleting_topics: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # the topics.json write that topic_on_disk's callers wait for, while it runs
    _topics_write: asyncio.Future[None] | None = None

    async def deletion_done(self, topic: str) -> None:
        """Wait for a DeleteTopic of ``topic`` still writing its removal. A topic of the name made
        before that is on disk would, after a crash, carry the old topic's consumer offsets, or be
        taken for it by the start that finishes the deletion. A deletion whose writes failed is
        finished by the next start: until then the name cannot be made again."""
        while (pending := self.deleting_topics.get(topic)) is not None and not pending.done():
            await asyncio.wait([pending])
        if topic in self.topic_config_manager.deleting:
            raise BrokerException(
                pymq_pb2.SYSTEM_ERROR,
                f"topic {topic!r} was deleted but its removal could not be written (see the broker's "
                "log); restart the broker to finish it, then create the topic again",
            )

    async def topic_on_disk(self, topic: str) -> None:
        """Before a message is stored in a topic the broker made on first use (a send's auto-create,
        a group's %DLQ% or %RETRY% topic), wait until topics.json holds it: written on a thread, not
        on the event loop (at 3,000 topics, 200 such sends held every client 2.1-2.6 s in all), and
        before the put, as when it was written on the loop: a kill -9 must not leave a SEND_OK
        message in a topic the next start does not list (with a new topic id, if made again).

        The senders to topics made meanwhile share one write, and a send to a topic another send
        is making waits for it too. A write that fails raises (the send fails, nothing stored);
        the table stays dirty, and the next send or the periodic write tries it again.
        """
        tcm = self.topic_config_manager
        while not tcm.on_disk(topic):
            pending = self._topics_write
            if pending is None or pending.done():
                pending = self._topics_write = asyncio.ensure_future(tcm.persist_async())
            # shielded: a sender that gives up must not cancel the others' write
            await asyncio.shield(pending)

    async def dlq_on_disk(self, group: str) -> str:
        """``%DLQ%<group>``, made if it is not there, once topics.json holds it (:meth:`topic_on_disk`).
        A DeleteTopic (a DLQ purge) that took it out of the table while its write ran (the wait is
        the only await between making it and storing) is waited for and the topic made again, so
        that nothing is stored in a topic that is gone (and that topics.json soon does not list)."""
        topic = get_dlq_topic(group)
        while True:
            self.topic_config_manager.create_topic_of_dlq(group)  # a topic already there is kept
            await self.topic_on_disk(topic)
            if self.topic_config_manager.select_topic_config(topic) is not None:
                return topic
            await self.deletion_done(topic)

    @property
    def broker_name(self) -> str:
        return self.broker_config.broker_name

    def topic_config(self, topic: str) -> TopicConfig:
        """The topic's config, or TOPIC_NOT_EXIST naming it."""
        problem = topic_name_problem(topic)
        if problem:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
        cfg = self.topic_config_manager.select_topic_config(topic)
        if cfg is None:
            why = not_created_yet(topic)
            if why is None and is_broker_topic(topic):
                # neither Admin.create_topic nor --auto-create-topic-enable makes one of these
                why = ("it is a name of the broker's own topics (SCHEDULE_TOPIC_XXXX, RMQ_SYS_*, "
                       "TBW102...), which only the broker creates, when it needs one: a client can "
                       "neither create nor send to it")
            raise BrokerException(
                pymq_pb2.TOPIC_NOT_EXIST,
                f"topic {topic!r} does not exist on broker {self.broker_name}; "
                + (why if why is not None else "create it first (Admin.create_topic / pymq-admin "
                   "create-topic) or start the broker with --auto-create-topic-enable"),
            )
        return cfg

    def check_queue(self, topic: str, queue_id: int, *, write: bool) -> TopicConfig:
        """The topic's config once ``queue_id`` is valid for reading or writing."""
        cfg = self.topic_config(topic)
        if write and not is_writeable(cfg.perm):
            raise BrokerException(pymq_pb2.NO_PERMISSION, f"topic {topic!r} is not writable")
        if not write and not is_readable(cfg.perm):
            raise BrokerException(pymq_pb2.NO_PERMISSION, f"topic {topic!r} is not readable")
        # A send may name any queue the topic has (RocketMQ's msgCheck: below the larger of its
        # read and write queue numbers): a producer's route lags a scale-in of write queues (the
        # safe one, before the read queues) by up to its refresh, and must not fail meanwhile.
        nums = max(cfg.write_queue_nums, cfg.read_queue_nums) if write else cfg.read_queue_nums
        if not 0 <= queue_id < nums:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"queue id {queue_id} is out of range for topic {topic!r}: it has {nums} "
                f"{'' if write else 'read '}queues (0..{nums - 1})",
            )
        return cfg

    def check_mq(self, mq: pymq_pb2.MessageQueue, *, write: bool = False) -> TopicConfig:
        if mq.broker_name and mq.broker_name != self.broker_name:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"message queue {mq.topic}#{mq.queue_id} names broker {mq.broker_name!r}, but "
                f"this is broker {self.broker_name!r}",
            )
        return self.check_queue(mq.topic, mq.queue_id, write=write)
