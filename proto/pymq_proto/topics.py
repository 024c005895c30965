"""The topic names broker and clients agree on: a consumer group's retry and dead-letter topics;
and the message types a topic may be (RocketMQ 5's TopicMessageType).

RocketMQ's (MixAll): a message a consumer of group G sends back is stored in
``%RETRY%G``; past its maximum reconsume times it goes to ``%DLQ%G`` instead.
The broker's other reserved topics are its own business (``pymq_broker.common.mix_all``).
"""

from __future__ import annotations

__all__ = [
    "DLQ_GROUP_TOPIC_PREFIX",
    "RETRY_GROUP_TOPIC_PREFIX",
    "TOPIC_MESSAGE_TYPES",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "get_dlq_topic",
    "get_retry_topic",
    "is_dlq_topic",
    "is_retry_topic",
    "is_system_topic",
    "not_created_yet",
]

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
# where a broker puts a half message it gave up after transactionCheckMax check-backs
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
# RocketMQ's own topics (TopicValidator's system topics, MixAll's prefixes): no user's data, never
# listed as a user's topic nor matched by the source's subscribePattern
SYSTEM_TOPIC_PREFIXES = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX, "RMQ_SYS_", "rmq_sys_", "%SYS%")
SYSTEM_TOPICS = frozenset({
    "SCHEDULE_TOPIC_XXXX", "TBW102", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC",
    TRANS_CHECK_MAX_TIME_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "CHECKPOINT_TOPIC",  # RMQ_SYS_ROCKSDB_OFFSET_TOPIC
    "DefaultHeartBeatSyncerTopic",  # a RocketMQ 5 proxy's in cluster mode (heartbeatSyncerTopicName)
})
# RocketMQ 5's TopicMessageType (the topic attribute +message.type); a topic without one is NORMAL
TOPIC_MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def get_retry_topic(group: str) -> str:
    """``%RETRY%<group>``."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def get_dlq_topic(group: str) -> str:
    """``%DLQ%<group>``."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def is_system_topic(topic: str, cluster_topics: frozenset[str] = frozenset()) -> bool:
    """RocketMQ's own topics (and ``cluster_topics``: the topics a RocketMQ cluster names after its
    clusters and brokers, ``<cluster>_REPLY_TOPIC`` too)."""
    return topic in SYSTEM_TOPICS or topic in cluster_topics or topic.startswith(SYSTEM_TOPIC_PREFIXES)


def not_created_yet(topic: str) -> str | None:
    """Why a group's missing ``%DLQ%`` / ``%RETRY%`` topic is nothing to create (None for another topic).

    The broker creates it at the group's first dead letter or send back, as RocketMQ's does:
    until then there is nothing to read, and creating it by hand is not the answer.
    """
    if is_dlq_topic(topic):
        group, what, first = topic[len(DLQ_GROUP_TOPIC_PREFIX):], "dead letters", "dead letter"
    elif is_retry_topic(topic):
        group, what, first = topic[len(RETRY_GROUP_TOPIC_PREFIX):], "retries", "message sent back"
    else:
        return None
    return (f"group {group!r} has no {what} yet (the broker creates {topic} at the group's first "
            f"{first}, as RocketMQ), so there is nothing to read")
