"""TopicConfigManager: which topics exist, their queues, permissions and options."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pymq_proto.topics import TOPIC_MESSAGE_TYPES, get_dlq_topic, get_retry_topic
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.config_manager import ConfigManager
from ..common.mix_all import SCHEDULE_TOPIC, is_broker_topic, is_system_topic, topic_name_problem
from ..common.perm import PERM_READ, PERM_WRITE

MAX_QUEUE_NUMS = 1024


@dataclass
class TopicConfig:
    """RocketMQ's TopicConfig, plus pymq's UNIQ_KEY de-duplication window.

    ``message_type`` is RocketMQ 5's TopicMessageType (one of :data:`TOPIC_MESSAGE_TYPES`):
    the messages apache.rocketmq.v2 may send to the topic (MIXED: any).

    ``topic_id`` is pymq's own (RocketMQ has none; Kafka's topic IDs are the model): a new
    random id each time a topic of this name is created, kept by updates, 0 for topics
    stored before ids and for the topics the broker makes itself (%RETRY%, %DLQ%...). A
    stream's checkpoint keeps it, so a topic deleted and created again is told apart from
    the one the stream read, whatever its offsets.
    """

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    dedup_window_ms: int = 0
    order: bool = False
    message_type: str = "NORMAL"
    topic_id: int = 0

    def to_proto(self) -> pymq_pb2.TopicConfig:
        return pymq_pb2.TopicConfig(
            topic_name=self.topic_name,
            read_queue_nums=self.read_queue_nums,
            write_queue_nums=self.write_queue_nums,
            perm=self.perm,
            dedup_window_ms=self.dedup_window_ms,
            order=self.order,
            message_type=self.message_type,
            topic_id=self.topic_id,
        )


def new_topic_id() -> int:
    """A creation id: random, positive, and fits a Java long (as the proto's int64)."""
    return secrets.randbits(63) or 1


class TopicConfigManager(ConfigManager):
    """Topics of this broker; system topics are created by the broker as needed."""

    def __init__(self, path: Path, *, auto_create_topic_enable: bool = False,
                 default_topic_queue_nums: int = 4, max_delay_level: int = 18) -> None:
        super().__init__(path)
        self.auto_create_topic_enable = auto_create_topic_enable
        self.default_topic_queue_nums = default_topic_queue_nums
        self.topic_config_table: dict[str, TopicConfig] = {}
        # topics a DeleteTopic took out whose consumer offsets are not yet off the disk: still
        # written to topics.json until then (deletion_written), so that a crash in between leaves the
        # topic listed, never its offsets without it (a topic of the name made later would take them)
        self.deleting: dict[str, TopicConfig] = {}
        self._lines: dict[str, tuple[TopicConfig, str]] = {}  # render's encoded topics
        # topics created with their write left to the caller or the periodic write: the number of
        # the first snapshot that holds each (it is on disk once a snapshot that new is written).
        # A message is stored in one only once it is (BrokerContext.topic_on_disk): a kill -9 must
        # not leave a SEND_OK message in a topic the next start does not list
        self.unwritten: dict[str, int] = {}
        self.topic_config_table[SCHEDULE_TOPIC] = TopicConfig(
            SCHEDULE_TOPIC, max_delay_level, max_delay_level, PERM_READ | PERM_WRITE
        )

    def encode(self) -> dict[str, Any]:
        # vars(), not asdict(): every field is a plain value, and asdict's deep copies took 23 ms at
        # 3,000 topics
        return {"topicConfigTable": {k: dict(vars(v)) for k, v in self.capture().items()}}

    def capture(self) -> dict[str, TopicConfig]:
        """The table (a TopicConfig is replaced, never changed in place): encoding it, indented by
        Python's pure-Python encoder, took 43 ms of the event loop at 3,000 topics."""
        if self.deleting:
            return {**self.deleting, **self.topic_config_table}
        return dict(self.topic_config_table)

    def render(self, state: dict[str, TopicConfig]) -> bytes:
        """One topic a line, each by the C encoder (indent=1 takes the pure-Python one, 5x slower),
        and kept for the next write while its TopicConfig is the same object: a write of 3,000
        topics encodes the one that changed. (Run on a thread, encoding all of them each time
        still held the GIL, and the event loop, 10 ms of each write.)"""
        entry = json.JSONEncoder(sort_keys=True).encode
        known, lines = self._lines, {}
        for name in sorted(state):
            cfg = state[name]
            line = known.get(name)
            if line is None or line[0] is not cfg:
                line = (cfg, f"  {json.dumps(name)}: {entry(vars(cfg))}")
            lines[name] = line
        self._lines = lines  # (two writes at once: either one's lines will do)
        return ('{\n "topicConfigTable": {\n' + ",\n".join(line for _, line in lines.values())
                + "\n }\n}").encode()

    def decode(self, data: dict[str, Any]) -> None:
        known = set(TopicConfig.__dataclass_fields__)
        for name, cfg in data.get("topicConfigTable", {}).items():
            # fields a later version wrote are left out: going back a version must not stop the broker
            self.topic_config_table[name] = TopicConfig(**{k: v for k, v in cfg.items() if k in known})

    def select_topic_config(self, topic: str) -> TopicConfig | None:
        return self.topic_config_table.get(topic)

    def create_topic(self, config: TopicConfig, *, update_if_exists: bool,
                     allow_system: bool = False, persist: bool = True) -> tuple[TopicConfig, bool]:
        """Create or update a topic after validating it; returns (config, created).

        ``persist=False``: the caller writes the table before it answers, off the event loop
        (:meth:`~..common.config_manager.ConfigManager.persist_async`).
        """
        problem = topic_name_problem(config.topic_name)
        if problem:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
        if not allow_system and is_system_topic(config.topic_name):
            raise BrokerException(
                pymq_pb2.NO_PERMISSION,
                f"topic {config.topic_name!r} is reserved for the broker (%RETRY%, %DLQ%, "
                "SCHEDULE_TOPIC_XXXX, RMQ_SYS_*, TBW102); choose another name",
            )
        for label, n in (("read", config.read_queue_nums), ("write", config.write_queue_nums)):
            if not 1 <= n <= MAX_QUEUE_NUMS:
                raise BrokerException(
                    pymq_pb2.ILLEGAL_ARGUMENT,
                    f"{label} queue count {n} for topic {config.topic_name!r} is out of "
                    f"range 1..{MAX_QUEUE_NUMS}",
                )
        if config.perm & ~0xF or not config.perm & (PERM_READ | PERM_WRITE):
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"perm {config.perm} for topic {config.topic_name!r} must include read (4) "
                "and/or write (2)",
            )
        if config.message_type not in TOPIC_MESSAGE_TYPES:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"message type {config.message_type!r} for topic {config.topic_name!r} is not one of "
                f"{', '.join(TOPIC_MESSAGE_TYPES)}",
            )
        if config.dedup_window_ms < 0:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"dedup window {config.dedup_window_ms} ms must be >= 0",
            )
        old = self.topic_config_table.get(config.topic_name)
        if old is not None and not update_if_exists:
            raise BrokerException(
                pymq_pb2.TOPIC_EXIST_ALREADY, f"topic {config.topic_name!r} already exists"
            )
        # an update keeps the topic's id; only a new topic (or one deleted before) gets a new one
        config = replace(config, topic_id=old.topic_id if old is not None else new_topic_id())
        self.topic_config_table[config.topic_name] = config
        if old is None:
            self._changed(config.topic_name, persist=persist)
        else:  # on disk already: its sends need not wait for this write (nor fail with it)
            self.changed(persist=persist)
        return config, old is None

    def _changed(self, topic: str, *, persist: bool) -> None:
        if not persist:
            self.unwritten[topic] = self._snapshots + 1
            self.changed(persist=False)
            return
        try:
            self.persist()
        except BaseException:
            # as persist() marks the document dirty: the topic stays in the table, but no file lists
            # it, so what waits for it on disk (on_disk) waits for a later write that holds it
            self.unwritten[topic] = self._snapshots + 1
            raise

    def on_disk(self, topic: str) -> bool:
        """Whether a write since ``topic`` was created without one holds it (a topic loaded, or
        written when made, is; an update of one is not waited for)."""
        needed = self.unwritten.get(topic)
        if needed is None:
            return True
        if self._written < needed:
            return False
        del self.unwritten[topic]
        return True

    def create_topic_in_send_message_method(self, topic: str) -> TopicConfig | None:
        """autoCreateTopicEnable: a send to an unknown topic creates it (4 queues). Not written here:
        the send waits for the write, off the event loop, before it stores its messages
        (BrokerContext.topic_on_disk)."""
        if not self.auto_create_topic_enable:
            return None
        cfg = TopicConfig(topic, self.default_topic_queue_nums, self.default_topic_queue_nums)
        return self.create_topic(cfg, update_if_exists=False, persist=False)[0]

    def create_topic_of_retry(self, group: str, retry_queue_nums: int) -> TopicConfig:
        """%RETRY%<group>: created on first use, readable and writable.

        Not written here: a consumer registering (nothing is stored in it yet) leaves the write to
        the controller's periodic task, off the event loop (one whole-file write and fsync per new
        group name made registrations cost O(topics) each, issue 17); a send or send back waits
        for it, off the event loop too, before it stores (BrokerContext.topic_on_disk).
        """
        return self._system_topic(get_retry_topic(group), retry_queue_nums, persist=False)

    def create_topic_of_dlq(self, group: str) -> TopicConfig:
        """%DLQ%<group>: one queue, readable (people inspect and re-send from it). Not written here:
        the dead letters wait for the write, off the event loop (BrokerContext.dlq_on_disk)."""
        return self._system_topic(get_dlq_topic(group), 1, persist=False)

    def create_system_topic(self, topic: str, queues: int) -> TopicConfig:
        """A broker-owned topic (transactions...), created on first use, readable for admins."""
        return self._system_topic(topic, queues)

    def _system_topic(self, topic: str, queues: int, *, persist: bool = True) -> TopicConfig:
        cfg = self.topic_config_table.get(topic)
        if cfg is None:
            # no topic id (0): the broker makes these again by itself, e.g. %RETRY%<group> at a
            # registration after a crash that came before its config was written,
            # while its stored messages are all there: a new id would read as a new topic
            cfg = TopicConfig(topic, queues, queues, PERM_READ | PERM_WRITE)
            self.topic_config_table[topic] = cfg
            self._changed(topic, persist=persist)
        elif persist and not self.on_disk(topic):
            # its write when made failed: written now, as then, before the caller stores in it
            # (the transaction topics' puts do not go through BrokerContext.topic_on_disk)
            self._changed(topic, persist=True)
        return cfg

    def delete_topic(self, topic: str, *, persist: bool = True) -> None:
        """A client's DeleteTopic (see :meth:`check_deletable`). ``persist=False``: the topic is gone
        from the table at once but stays in what is written (:attr:`deleting`) until the caller, its
        consumer offsets written, calls :meth:`deletion_written` and writes the table."""
        self.check_deletable(topic)
        cfg = self.topic_config_table.pop(topic)
        if persist:
            self.persist()
        else:
            self.deleting[topic] = cfg

    def deletion_written(self, topic: str) -> None:
        """The deleted topic's consumer offsets are off the disk: the next write drops its config."""
        if self.deleting.pop(topic, None) is not None:
            self.dirty = True

    def check_deletable(self, topic: str) -> None:
        """The broker's own topics (schedule, transaction halves and op records, TBW102,
        RMQ_SYS_*) are refused: deleting the half topic would lose every pending transaction
        at the next restart. %RETRY% and %DLQ% topics may go (a DLQ purge)."""
        if is_broker_topic(topic):
            raise BrokerException(
                pymq_pb2.NO_PERMISSION,
                f"topic {topic!r} belongs to the broker (its delayed messages or transactions live "
                "there) and cannot be deleted",
            )
        if topic not in self.topic_config_table:
            raise BrokerException(pymq_pb2.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
