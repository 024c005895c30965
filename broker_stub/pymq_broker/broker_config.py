"""BrokerConfig: the broker's own settings (the store's are in MessageStoreConfig)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BrokerConfig:
    """Broker settings with RocketMQ's names and defaults."""

    broker_name: str = "broker-a"
    host: str = "127.0.0.1"
    port: int = 0
    auto_create_topic_enable: bool = False
    default_topic_queue_nums: int = 4
    long_polling_enable: bool = True
    max_pull_batch_size: int = 100_000  # messages per pull
    flush_consumer_offset_interval: int = 1_000
    enable_property_filter: bool = False
    transaction_timeout: int = 6_000  # ms before a half message is first checked back
    transaction_check_interval: int = 60_000  # ms between check-backs
    transaction_check_max: int = 15

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be 0..65535 (0 picks a free one), got {self.port}")
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise ValueError(
                f"defaultTopicQueueNums must be 1..1024, got {self.default_topic_queue_nums}"
            )
