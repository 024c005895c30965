"""The consumer group's progress on the broker, brought level with a stopped query.

The source commits a micro-batch's offsets to the broker when Spark plans the
next batch (Spark calls ``commit`` late), so after a query stops, the broker's
lag still counts its last batch until the query runs again. The checkpoint is
the source of truth; :func:`commit_group_progress` makes the broker agree.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import Any

from pymq_proto.topics import RETRY_GROUP_TOPIC_PREFIX, is_retry_topic

from ..backend.base import QueueBounds
from ..client.consumer import PullConsumer, retry_topic
from ..client.message import MessageQueue
from ..errors import TopicNotExistError
from .offset_reader import committable
from .source_offset import is_initial, offsets_from_json, topic_ids, topic_ids_from_json

__all__ = ["commit_group_progress"]


def commit_group_progress(
    query: Any, endpoint: str | None, group: str, *, namesrv_addr: str | None = None,
    access_key: str | None = None, secret_key: str | None = None, tls: bool | None = None,
    tls_ca_file: str | None = None, tls_cert_file: str | None = None, tls_key_file: str | None = None,
    topics: Collection[str] | None = None,
) -> int:
    """Write a stopped query's last end offsets as ``group``'s progress; returns the queues written.

    Queues of a deleted topic are left out, and so are queues cut by a scale-in of read queues
    where the broker refuses a whole update that names one (a pymq broker; Apache RocketMQ keeps
    their progress: :func:`~pyspark_pymq.spark.offset_reader.committable`).

    ``endpoint`` names a pymq broker; for Apache RocketMQ pass ``None`` and ``namesrv_addr``.
    ``access_key`` / ``secret_key`` sign the commits; ``tls`` (the system's CAs, or
    ``tls_ca_file``'s) encrypts them, ``tls_cert_file`` / ``tls_key_file`` for mutual TLS (as
    the query's options did). ``topics``: only these topics' queues and ``%RETRY%<group>``'s (a
    query whose pymq sources read with different consumer groups: one call per group, with its
    sources' topics); None: every pymq source's.

    Example::

        query.stop()
        commit_group_progress(query, "127.0.0.1:8081", "billing")  # lag 0 on the broker
    """
    wanted: set[str] = set()
    if topics is not None:  # a string is one topic, not its letters; %RETRY%<group> goes along
        wanted = {topics} if isinstance(topics, str) else set(topics)
        wanted.add(retry_topic(group))
    last = query.lastProgress
    if not last:
        return 0
    sources = last["sources"] if isinstance(last, dict) else last.sources
    mine = retry_topic(group)
    found: list[tuple[dict[MessageQueue, int], dict[str, Any]]] = []
    for source in sources:  # all checked before any commit: a refusal writes nothing
        end = source["endOffset"] if isinstance(source, dict) else source.endOffset
        offset = json.loads(end) if isinstance(end, str) else end
        if not isinstance(offset, dict) or is_initial(offset):
            continue
        try:
            queues = offsets_from_json(offset)
        except ValueError:
            continue  # another source's offsets (a join with a non-pymq stream)
        others = sorted({mq.topic for mq in queues if is_retry_topic(mq.topic) and mq.topic != mine})
        if others and topics is None:
            # the source read another group's retries: its progress is that group's, and a misspelt
            # group would be made with the query's offsets while the real one keeps its lag
            raise ValueError(
                f"commit_group_progress: the query's pymq source read {', '.join(others)}, so its consumer "
                f"group is {', '.join(repr(t[len(RETRY_GROUP_TOPIC_PREFIX):]) for t in others)}, not "
                f"{group!r}: pass that group (or, for several sources, topics= with each group's topics)"
            )
        if topics is not None:
            queues = {mq: o for mq, o in queues.items() if mq.topic in wanted}
        if queues:
            found.append((queues, offset))
    written = 0
    for queues, offset in found:
        consumer = PullConsumer(endpoint, group, namesrv_addr=namesrv_addr, access_key=access_key,
                                secret_key=secret_key, tls=tls, tls_ca_file=tls_ca_file,
                                tls_cert_file=tls_cert_file, tls_key_file=tls_key_file)
        # as the stream's commits (OffsetReader.commit)
        now = _queue_bounds(consumer, {mq.topic for mq in queues})
        queues = committable(consumer.backend, queues, now, topic_ids_from_json(offset), topic_ids(now))
        if queues:
            consumer.commit_offsets(queues)
            written += len(queues)
    return written


def _queue_bounds(consumer: PullConsumer, topics: Iterable[str]) -> dict[MessageQueue, QueueBounds]:
    """The queues ``topics`` read now, with their topic ids; a deleted topic (or a %RETRY% topic not
    made yet) has none, nor has a broker that does not answer."""
    out: dict[MessageQueue, QueueBounds] = {}
    for topic in sorted(topics):
        try:
            out.update(consumer.backend.queue_bounds(topic, unreachable=set()) or {})
        except TopicNotExistError:
            continue
    return out
