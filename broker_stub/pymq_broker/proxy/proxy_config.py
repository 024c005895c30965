"""ProxyConfig: the settings of the apache.rocketmq.v2 layer, RocketMQ proxy's names and defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProxyConfig:
    """What RocketMQ's ``ProxyConfig`` sets for the same checks (times in ms).

    ``min_invisible_time_mills_for_recv``: the shortest invisible duration a
    receive or a change of invisible duration may ask for (RocketMQ: 10 s);
    ``default_invisible_time_mills``: a push consumer's (auto renew, 60 s),
    renewed while the client is connected for up to ``renew_max_time_millis`` (3 h);
    ``invisible_time_millis_when_clear``: how soon the messages a push consumer
    received become visible again once it is gone (1 s).
    ``max_invisible_time_mills``: the longest (12 h). ``max_delay_time_mills``:
    how far ahead a delivery timestamp may be (here also bounded by the
    broker's longest delay level). ``max_message_group_size``: bytes of a
    FIFO message group. ``max_user_property_size`` / ``max_user_property_count``:
    bytes of a message's properties (16 KiB) and how many user properties it may
    have. ``min_long_polling_timeout_mills`` / ``max_long_polling_timeout_mills``:
    how long a receive waits for a message at least and at most (5 s, 20 s:
    RocketMQ's grpcClientConsumerMin/MaxLongPollingTimeoutMillis);
    ``long_polling_reserve_time_in_millis``: how much sooner than the call's
    deadline a long-polling receive answers.
    ``receive_batch_size``: the most messages one receive may ask for (32).
    ``enable_topic_message_type_check``: a message must be of its topic's
    TopicMessageType (MIXED takes any), else MESSAGE_PROPERTY_CONFLICT_WITH_TYPE.
    """

    min_invisible_time_mills_for_recv: int = 10_000
    default_invisible_time_mills: int = 60_000
    renew_max_time_millis: int = 3 * 3600 * 1000
    invisible_time_millis_when_clear: int = 1000
    max_invisible_time_mills: int = 12 * 3600 * 1000
    max_delay_time_mills: int = 24 * 3600 * 1000
    max_message_group_size: int = 64
    max_user_property_size: int = 16 * 1024
    max_user_property_count: int = 128
    min_long_polling_timeout_mills: int = 5_000
    max_long_polling_timeout_mills: int = 20_000
    long_polling_reserve_time_in_millis: int = 100
    receive_batch_size: int = 32
    enable_topic_message_type_check: bool = True
