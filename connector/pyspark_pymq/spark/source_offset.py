"""The offset JSON of the pymq source, as kept in Spark's checkpoint.

An offset says, per MessageQueue, the next queue offset to read::

    {"orders": {"broker-a:0": 120, "broker-a:1": 118},
     "%RETRY%analytics": {"broker-a:0": 3}}

Keys are the topic, then ``"<broker name>:<queue id>"`` (MessageQueue's
identity is all three, so several brokers fit without a format change).

Spark compares offsets **as JSON strings** to decide whether a batch has new
data, so the dict is built in one deterministic order: topics sorted by name,
queues by (broker name, numeric queue id). ``json.dumps`` keeps insertion
order, so equal offsets always serialise to equal text.

A new stream's first offset is the :data:`INITIAL` marker rather than
resolved offsets: Spark calls ``initialOffset()`` twice at first start and
again when batch 0 is replayed after a crash, and "latest" or "the group's
progress" would give a different answer each time. The marker is resolved once,
by the first ``latestOffset``, which returns batch 0's end with its resolved
start under :data:`FROM_KEY`::

    {"$from": {"orders": {"broker-a:0": 100}}, "orders": {"broker-a:0": 250}}

so batch 0 already reads data, and a replay of batch 0 (from the marker to that
end, as the checkpoint's offset log holds it) reads exactly the same messages.
A later end carries ``$from`` for the queues whose checkpointed offsets expired
(``failOnDataLoss=false``): those queues' ranges start at their min offset then, in
the batch and in its replay. :func:`offsets_from_json` skips it.
Checkpoints written before it (batch 0 an empty batch to the resolved start)
replay as they did.

Offsets read from a pymq broker also keep, under :data:`TOPIC_IDS_KEY`, the id
each broker gave each topic when it was created::

    {"$topicIds": {"orders": {"broker-a": 5149...}}, "orders": {"broker-a:0": 250}}

so the next batch sees when a topic was deleted and created again (its offsets
restart at 0 and may well have passed the old ones by then). Backends without
topic ids (RocketMQ) and checkpoints written before them have no such key, and
nothing is checked for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from ..client.message import MessageQueue

__all__ = [
    "EARLIEST",
    "FROM_KEY",
    "INITIAL",
    "LATEST",
    "TOPIC_IDS_KEY",
    "QueueKey",
    "TopicIds",
    "assign_text",
    "batch_start",
    "epoch_ms_problem",
    "is_initial",
    "offsets_from_json",
    "offsets_to_json",
    "parse_assign_json",
    "parse_offsets_json",
    "parse_timestamps_json",
    "queue_key",
    "recreated_topics",
    "topic_ids",
    "topic_ids_from_json",
    "with_start",
    "with_topic_ids",
]

#: (topic, broker name, queue id); broker name "" matches any broker.
QueueKey = tuple[str, str, int]

#: In startingOffsets / endingOffsets JSON, as in Spark's Kafka source.
EARLIEST = -2
LATEST = -1

#: Topic names cannot contain '$', so these keys never clash with a topic; offsets_from_json
#: skips every key that starts with one, so that a key a later version adds does not make its
#: checkpoints unreadable to this one.
INITIAL_KEY = "$initial"
INITIAL: dict[str, Any] = {INITIAL_KEY: "startingOffsets"}
#: In batch 0's end offset: the resolved start of batch 0.
FROM_KEY = "$from"
#: The topics' creation ids, per topic and broker.
TOPIC_IDS_KEY = "$topicIds"

#: (topic, broker name) -> the id the broker gave the topic when it was created.
TopicIds = dict[tuple[str, str], int]


def is_initial(offset: Mapping[str, Any]) -> bool:
    """Whether ``offset`` is the not-yet-resolved start of a new stream."""
    return INITIAL_KEY in offset


def queue_key(mq: MessageQueue) -> str:
    return f"{mq.broker_name}:{mq.queue_id}"


def _sort_key(mq: MessageQueue) -> tuple[str, str, int]:
    return (mq.topic, mq.broker_name, mq.queue_id)


def offsets_to_json(offsets: Mapping[MessageQueue, int]) -> dict[str, dict[str, int]]:
    """The checkpoint form of ``offsets``, in the one deterministic order."""
    out: dict[str, dict[str, int]] = {}
    for mq in sorted(offsets, key=_sort_key):
        out.setdefault(mq.topic, {})[queue_key(mq)] = int(offsets[mq])
    return out


def _split_queue_key(key: str, *, allow_bare: bool) -> tuple[str, int] | None:
    broker, sep, qid = key.rpartition(":")
    if not sep:
        if allow_bare and key.strip().isdecimal():
            return "", int(key)
        return None
    if not broker or not qid.strip().isdecimal():
        return None
    return broker, int(qid)


def with_start(end: dict[str, dict[str, int]], start: Mapping[MessageQueue, int]) -> dict[str, Any]:
    """Batch 0's end offset: ``end`` and, under :data:`FROM_KEY`, where batch 0 starts."""
    return {FROM_KEY: offsets_to_json(start), **end}


def topic_ids(bounds: Mapping[MessageQueue, Any]) -> TopicIds:
    """The topic ids of ``bounds`` (:class:`QueueBounds` by queue); topics without one left out."""
    return {(mq.topic, mq.broker_name): b.topic_id for mq, b in bounds.items() if b.topic_id}


def recreated_topics(read_with: TopicIds, now: TopicIds) -> set[tuple[str, str]]:
    """The (topic, broker)s of ``read_with`` whose id is another one ``now``: deleted and
    created again. Missing from ``now`` (gone, broker down) is not a new id."""
    return {key for key, old in read_with.items() if now.get(key, old) != old}


def with_topic_ids(end: dict[str, Any], ids: TopicIds) -> dict[str, Any]:
    """``end`` with ``ids`` under :data:`TOPIC_IDS_KEY` (first, in the one order); as it is
    when there are none, so offsets of backends without ids keep their form."""
    if not ids:
        return end
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, broker), topic_id in sorted(ids.items()):
        by_topic.setdefault(topic, {})[broker] = topic_id
    return {TOPIC_IDS_KEY: by_topic, **end}


def topic_ids_from_json(offset: Mapping[str, Any]) -> TopicIds:
    """The topic ids a checkpointed offset was read with (none for older checkpoints)."""
    found = offset.get(TOPIC_IDS_KEY)
    if found is None:
        return {}
    if not isinstance(found, Mapping):
        raise ValueError(f"checkpointed pymq offset {offset!r} is malformed at {TOPIC_IDS_KEY!r}")
    out: TopicIds = {}
    for topic, brokers in found.items():
        if not isinstance(brokers, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in brokers.values()
        ):
            raise ValueError(
                f"checkpointed pymq offset {offset!r} is malformed at {TOPIC_IDS_KEY!r}/{topic!r}"
            )
        out.update({(str(topic), str(broker)): v for broker, v in brokers.items()})
    return out


def batch_start(start: Mapping[str, Any], end: Mapping[str, Any]) -> dict[MessageQueue, int] | None:
    """Where the batch from ``start`` to ``end`` begins; None: it reads nothing.

    From the :data:`INITIAL` marker that is batch 0's resolved start, which its end
    carries (a checkpoint of an older version has none: its batch 0 read nothing).
    """
    if is_initial(end):
        return None
    if is_initial(start):
        first = end.get(FROM_KEY)
        return None if first is None else offsets_from_json(first)
    begin = offsets_from_json(start)
    if FROM_KEY in end:  # queues whose expired offsets the batch skips: from their min offset
        begin.update(offsets_from_json(end[FROM_KEY]))
    return begin


def offsets_from_json(offset: Mapping[str, Any]) -> dict[MessageQueue, int]:
    """The offsets of a checkpointed offset (the inverse of :func:`offsets_to_json`)."""
    if is_initial(offset):
        raise ValueError("the initial marker has no offsets; resolve it first")
    out: dict[MessageQueue, int] = {}
    for topic, queues in offset.items():
        if str(topic).startswith("$"):  # FROM_KEY, TOPIC_IDS_KEY and any later one: not a topic
            continue
        if not isinstance(queues, Mapping):
            raise ValueError(f"checkpointed pymq offset {offset!r} is malformed at {topic!r}")
        for key, value in queues.items():
            parsed = _split_queue_key(str(key), allow_bare=False)
            if parsed is None or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"checkpointed pymq offset {offset!r} is malformed at {topic!r}/{key!r}"
                )
            out[MessageQueue(str(topic), parsed[0], parsed[1])] = value
    return out


def parse_offsets_json(text: str, option: str, *, allow_earliest: bool) -> dict[QueueKey, int]:
    """User-given offsets per queue (``startingOffsets`` / ``endingOffsets``).

    ``{"topic": {"broker-a:0": 42, "1": -2}}``: a key may omit the broker name
    when the topic lives on one broker. ``-1`` is latest, ``-2`` earliest
    (starting offsets only).
    """
    allowed = "an offset >= 0 or -1 (latest)" + (" or -2 (earliest)" if allow_earliest else "")
    return _parse_queue_json(
        text, option, example='{"orders": {"broker-a:0": 42, "broker-a:1": -2}}', what="offset",
        allowed=allowed, valid=lambda value: value >= LATEST or (allow_earliest and value == EARLIEST),
    )


# A 10-digit time is a Unix time in seconds (2001 to 2286): read as milliseconds it lands in January
# 1970, and reads a topic from its start. No message is stored at such a time.
SECONDS_LIKE = range(1_000_000_000, 10_000_000_000)


def epoch_ms_problem(value: int) -> str | None:
    """Why ``value`` is no time in milliseconds since the epoch a user means, or None."""
    if value in SECONDS_LIKE:
        return (f"that is {datetime.fromtimestamp(value / 1000, timezone.utc):%Y-%m-%d %H:%M:%S} UTC in "
                f"milliseconds since the epoch, as pymq reads it; if it is seconds give {value * 1000}")
    return None


def parse_timestamps_json(text: str, option: str) -> dict[QueueKey, int]:
    """User-given times per queue, in ms since the epoch (``startingOffsetsByTimestamp`` /
    ``endingOffsetsByTimestamp``), in the form of :func:`parse_offsets_json`: Spark's Kafka
    source keys them as its offsets, so pymq keys them as its own."""
    return _parse_queue_json(
        text, option, example='{"orders": {"broker-a:0": 1700000000000, "broker-a:1": 1700000000000}}',
        what="timestamp", allowed="milliseconds since the epoch, >= 0 (a 10-digit time is seconds: "
        "multiply it by 1000)",
        valid=lambda value: value >= 0 and epoch_ms_problem(value) is None,
    )


def _json_object(text: str, option: str, example: str, shape: str) -> dict[str, Any]:
    """The non-empty JSON object of option ``option`` (of ``shape``), no key given twice."""

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json.loads keeps the last of two equal keys: one of the user's values would be lost
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise ValueError(f"pymq option {option} names {key!r} twice: give each topic and "
                                 f"each queue once (example: {example})")
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"pymq option {option}={text!r} is not valid JSON ({err.msg} at char {err.pos}): "
            f"use an object such as {example}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"pymq option {option}={text!r} is not valid: use a non-empty JSON object of "
            f"{shape}, such as {example}"
        )
    return data


def _parse_queue_json(
    text: str, option: str, *, example: str, what: str, allowed: str, valid: Callable[[int], bool],
) -> dict[QueueKey, int]:
    """``{"topic": {"brokerName:queueId": number}}``, each number ``valid``."""
    data = _json_object(text, option, example, f"topic -> {{'brokerName:queueId': {what}}}")
    out: dict[QueueKey, int] = {}
    for topic, queues in data.items():
        if not isinstance(queues, dict):
            raise ValueError(
                f"pymq option {option}: the value for topic {topic!r} must be an object of "
                f"'brokerName:queueId' -> {what}, got {queues!r} (example: {example})"
            )
        for key, value in queues.items():
            parsed = _split_queue_key(str(key), allow_bare=True)
            if parsed is None:
                raise ValueError(
                    f"pymq option {option}: queue key {key!r} of topic {topic!r} must be "
                    f"'brokerName:queueId' such as 'broker-a:0' (example: {example})"
                )
            if not (isinstance(value, int) and not isinstance(value, bool) and valid(value)):
                raise ValueError(
                    f"pymq option {option}: {what} {value!r} for {topic!r}/{key!r} is not "
                    f"valid: use {allowed}"
                )
            queue = (str(topic), parsed[0], parsed[1])
            if queue in out:  # "b:1" and "b:01", "0" and " 0": one queue
                raise ValueError(f"pymq option {option} names queue {key!r} of {topic!r} twice: give "
                                 f"each queue once (example: {example})")
            out[queue] = int(value)
    return out


ASSIGN_EXAMPLE = '{"orders": ["broker-a:0", "broker-a:1"], "payments": [2]}'


def parse_assign_json(text: str, option: str = "assign") -> frozenset[QueueKey]:
    """The queues an ``assign`` option names: ``{"topic": ["brokerName:queueId", queueId, ...]}``
    (a bare queue id: that queue on any broker, as in :func:`parse_offsets_json`)."""
    data = _json_object(text, option, ASSIGN_EXAMPLE, "topic -> [queues]")
    out: set[QueueKey] = set()
    for topic, queues in data.items():
        if not isinstance(queues, list) or not queues:
            raise ValueError(f"pymq option {option}: the value for topic {topic!r} must be a non-empty "
                             f"list of queues ('broker-a:0', or a queue id), got {queues!r} (example: "
                             f"{ASSIGN_EXAMPLE})")
        for queue in queues:
            parsed = None if isinstance(queue, bool) else (
                ("", queue) if isinstance(queue, int) and queue >= 0
                else _split_queue_key(queue, allow_bare=True) if isinstance(queue, str) else None)
            if parsed is None:
                raise ValueError(f"pymq option {option}: queue {queue!r} of topic {topic!r} must be "
                                 f"'brokerName:queueId' such as 'broker-a:0', or a queue id (example: "
                                 f"{ASSIGN_EXAMPLE})")
            key = (str(topic), parsed[0], parsed[1])
            if key in out:
                raise ValueError(f"pymq option {option} names queue {queue!r} of {topic!r} twice: give "
                                 f"each queue once (example: {ASSIGN_EXAMPLE})")
            out.add(key)
    return frozenset(out)


def assign_text(assigned: frozenset[QueueKey]) -> str:
    """``assigned`` as ``assign`` JSON, in one order (for messages)."""
    out: dict[str, list[str | int]] = {}
    for topic, broker, qid in sorted(assigned):
        out.setdefault(topic, []).append(f"{broker}:{qid}" if broker else qid)
    return json.dumps(out, separators=(",", ":"))


def lookup(offsets: Mapping[QueueKey, int], mq: MessageQueue) -> int | None:
    """The user's offset for ``mq`` (exact broker, or a broker-less key), else None."""
    value = offsets.get((mq.topic, mq.broker_name, mq.queue_id))
    if value is None:
        value = offsets.get((mq.topic, "", mq.queue_id))
    return value
