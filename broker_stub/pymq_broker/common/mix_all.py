"""RocketMQ's reserved topic names and prefixes (MixAll / TopicValidator).

The retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>) are named by
``pymq_proto.topics``: the clients need them too.
"""

from __future__ import annotations

import re

from pymq_proto.topics import TRANS_CHECK_MAX_TIME_TOPIC as TRANS_CHECK_MAX_TIME_TOPIC
from pymq_proto.topics import is_dlq_topic, is_retry_topic

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
TIMER_TOPIC = "rmq_sys_wheel_timer"  # RocketMQ 5's TimerMessageStore.TIMER_TOPIC

TOPIC_MAX_LENGTH = 127
_TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_SYSTEM_TOPICS = frozenset(
    {SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC,
     AUTO_CREATE_TOPIC_KEY_TOPIC, TIMER_TOPIC}
)


def is_system_topic(topic: str) -> bool:
    """Topics the broker owns: schedule, transaction, retry, dead-letter, RMQ_SYS_*."""
    return (
        topic in _SYSTEM_TOPICS
        or topic.startswith(SYSTEM_TOPIC_PREFIX)
        or is_retry_topic(topic)
        or is_dlq_topic(topic)
    )


def is_broker_topic(topic: str) -> bool:
    """The topics only the broker writes and no client may delete (system topics but %RETRY%, %DLQ%)."""
    return is_system_topic(topic) and not is_retry_topic(topic) and not is_dlq_topic(topic)


def topic_name_problem(topic: object) -> str | None:
    """Why ``topic`` is not a valid topic name, or None (TopicValidator.validateTopic)."""
    if not isinstance(topic, str) or not topic:
        return f"topic name must be a non-empty string, got {topic!r}"
    if len(topic) > TOPIC_MAX_LENGTH:
        return (
            f"topic name {topic[:20]!r}... is {len(topic)} characters; the limit is "
            f"{TOPIC_MAX_LENGTH}"
        )
    if not _TOPIC_PATTERN.match(topic):
        return (
            f"topic name {topic!r} has characters outside letters, digits, '%', '|', '_', '-'"
        )
    return None


def group_name_problem(group: object) -> str | None:
    """Why ``group`` is not a valid consumer group name, or None."""
    if not isinstance(group, str) or not group:
        return f"consumer group must be a non-empty string, got {group!r}"
    if len(group) > 255 or not _TOPIC_PATTERN.match(group) or "%" in group:
        return (
            f"consumer group {group!r} must be at most 255 letters, digits, '|', '_', '-'"
        )
    return None
