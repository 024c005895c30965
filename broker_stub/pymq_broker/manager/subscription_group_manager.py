"""SubscriptionGroupManager: per-group consume settings (RocketMQ's SubscriptionGroupConfig)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.config_manager import ConfigManager
from ..common.mix_all import group_name_problem

CONSUME_FROM_WHERE = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP")


@dataclass
class SubscriptionGroupConfig:
    """retryQueueNums 1, retryMaxTimes 16, consume from the last offset: RocketMQ's defaults.

    ``consume_message_orderly`` (RocketMQ's consumeMessageOrderly): a FIFO group for
    RocketMQ 5's clients (the settings say ``fifo``; a queue is held until its messages are acked).
    """

    group_name: str
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False

    def to_proto(self) -> pymq_pb2.SubscriptionGroupConfig:
        return pymq_pb2.SubscriptionGroupConfig(**asdict(self))


class SubscriptionGroupManager(ConfigManager):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.subscription_group_table: dict[str, SubscriptionGroupConfig] = {}

    def encode(self) -> dict[str, Any]:
        return {"subscriptionGroupTable": {k: asdict(v) for k, v in self.subscription_group_table.items()}}

    def decode(self, data: dict[str, Any]) -> None:
        for name, cfg in data.get("subscriptionGroupTable", {}).items():
            self.subscription_group_table[name] = SubscriptionGroupConfig(**cfg)

    def find_subscription_group_config(self, group: str) -> SubscriptionGroupConfig:
        """The group's config, created with defaults on first use.

        A new group is persisted later (:meth:`persist_if_dirty`, the controller's periodic
        task, off the event loop): writing and fsyncing the whole file for each new name made
        every pull of a new group cost O(groups) on the event loop (issue 17). A crash loses
        at most the defaults of groups created since, which are made again on first use.
        """
        cfg = self.subscription_group_table.get(group)
        if cfg is None:
            problem = group_name_problem(group)
            if problem:
                raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
            cfg = SubscriptionGroupConfig(group)
            self.subscription_group_table[group] = cfg
            self.dirty = True
        return cfg

    def update_subscription_group_config(
        self, cfg: SubscriptionGroupConfig, *, persist: bool = True
    ) -> SubscriptionGroupConfig:
        """Create or change a group's settings; ``persist=False``: the caller writes them before it
        answers, off the event loop (:meth:`~..common.config_manager.ConfigManager.persist_async`)."""
        problem = group_name_problem(cfg.group_name)
        if problem:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
        if cfg.retry_queue_nums < 1 or cfg.retry_max_times < 0:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"group {cfg.group_name!r}: retryQueueNums must be >= 1 and retryMaxTimes >= 0, "
                f"got {cfg.retry_queue_nums} and {cfg.retry_max_times}",
            )
        if cfg.consume_from_where not in CONSUME_FROM_WHERE:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"consumeFromWhere {cfg.consume_from_where!r} must be one of {CONSUME_FROM_WHERE}",
            )
        self.subscription_group_table[cfg.group_name] = cfg
        self.changed(persist=persist)
        return cfg
