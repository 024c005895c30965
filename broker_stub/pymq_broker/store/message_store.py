"""DefaultMessageStore: the commit log, consume queues, index and their services.

Single-writer by design: every put and every dispatch happens on the caller's
thread (the broker's event loop); the flush services only fsync. Reads go
through pread, so memory stays flat however much is stored.

A put appends to the commit log and queues the dispatch (consume queue, index,
the long-polling wake-up), as RocketMQ's ReputMessageService does: a sender may
be answered first and the dispatch run right after (:meth:`do_reput`). Every
read of a consume queue or the index runs what is queued first, so nothing
read on the broker's thread ever misses an acknowledged put.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import numpy.typing as npt
from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    MAX_PROPERTIES_SIZE,
    MessageConst,
    decode_properties,
    encode_properties,
    find_property,
    property_key,
    split_tail,
    tag_hash,
)

from ..common.mix_all import SCHEDULE_TOPIC, TIMER_TOPIC
from .allocate_mapped_file_service import AllocateMappedFileService
from .commit_log import AppendMessageResult, CommitLog, MessageToStore
from .config import SYNC_FLUSH, MessageStoreConfig
from .consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue, pack_entries
from .crc32_vector import crc32_slices
from .disk_space import DiskSpaceService, is_disk_full
from .encoded_batch import EncodedRecords, use_scalar
from .flush import FlushRealTimeService, GroupCommitService, ServiceThread, StoreCheckpoint
from .index_service import IndexFile, IndexService, key_seed
from .mapped_file import MappedFile
from .results import GetMessageResult, GetMessageStatus, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)

_KEYS = MessageConst.PROPERTY_KEYS.encode()
_TAGS = MessageConst.PROPERTY_TAGS.encode()
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_DELAY = MessageConst.PROPERTY_DELAY_TIME_LEVEL.encode()
_TIMER_DELIVER_MS = b"TIMER_DELIVER_MS"  # RocketMQ 5 MessageConst.PROPERTY_TIMER_DELIVER_MS
_KEYS_KEY = property_key(MessageConst.PROPERTY_KEYS)
_TAGS_KEY = property_key(MessageConst.PROPERTY_TAGS)

MessageArrivingListener = Callable[[str, int, int], None]

FILTER_BUDGET_S = 0.05  # event-loop time one SQL92-filtered pull may spend evaluating its filter
FILTER_CHECK_EVERY = 64  # records between two looks at the clock


@functools.lru_cache(maxsize=1)
def _physical_memory() -> int:
    """Bytes of physical memory (RocketMQ's StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # not POSIX: RocketMQ's fallback, 24 GiB
        return 24 * 1024**3


def _first_over(values: np.ndarray, limit: int) -> int | None:
    """The index of the first of ``values`` over ``limit``, or None (plain Python for a few)."""
    if use_scalar(len(values), None):
        return next((i for i, v in enumerate(values.tolist()) if v > limit), None)
    big = np.flatnonzero(values > limit)
    return int(big[0]) if len(big) else None


class _FlushConsumeQueueService(ServiceThread):
    def __init__(self, store: DefaultMessageStore, interval_ms: int) -> None:
        super().__init__("FlushConsumeQueueService", interval_ms / 1000)
        self.store = store

    def run_once(self) -> None:
        self.store.checkpoint_now()


def _tag_codes(records: EncodedRecords) -> npt.NDArray[np.int64]:
    """Each record's consume-queue tag code in a business topic (:func:`tag_hash` of its TAGS,
    0 without), for all records at once."""
    codes = np.zeros(len(records), dtype=np.int64)
    rec, starts, ends, blob = records.property_values(_TAGS_KEY)
    if len(rec):  # tag_hash's CRC: the CRC of no bytes is its 0 too
        codes[rec] = crc32_slices(blob, starts, ends)
    return codes


DELETED_QUEUES_PREFIX = ".deleted-"
"""The consume-queue directory of a deleted topic is renamed to ``.deleted-<topic>-<ns>`` (not a
topic name: a topic name has no dot) before its files are removed on another thread. The emptied
directory stays until the deletion's configs are on disk: a start that finds one finishes the
deletion a crash cut short (:attr:`DefaultMessageStore.unfinished_deletions`)."""


def deleted_topic_of(marker: Path) -> str:
    """The topic a :data:`DELETED_QUEUES_PREFIX` directory was the queues of."""
    return marker.name[len(DELETED_QUEUES_PREFIX):].rpartition("-")[0]


def _empty_dir(path: Path) -> None:
    """Remove what ``path`` holds and keep it."""
    try:
        children = list(path.iterdir())
    except FileNotFoundError:
        return
    for child in children:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


class DetachedQueues:
    """A deleted topic's consume queues, out of the store: :meth:`remove` deletes their files, and
    :meth:`release` the emptied directory once the deletion is on disk everywhere else."""

    def __init__(self, queues: list[ConsumeQueue], path: Path | None, lock: threading.Lock) -> None:
        self.queues = queues
        self.path = path  # their directory, renamed aside (None: none to keep as a marker)
        self._lock = lock

    def remove(self) -> None:
        """Close and delete the files (slow for many queues or large ones: call it off the event loop)."""
        with self._lock:  # the flush thread's checkpoint may hold them in its list of queues
            for cq in self.queues:
                cq.queue.close()  # not destroy(): it deletes by the old path, a new topic's now
        if self.path is not None:
            _empty_dir(self.path)

    def release(self) -> None:
        """The deletion is on disk (consumer offsets, then topics.json): the marker goes."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)


class ExpiredFiles:
    """Segments retention took out of the store (:meth:`DefaultMessageStore.take_expired_files`):
    :meth:`remove` closes and deletes them, on any thread. Deleting a written 256 MiB commit-log
    segment took 70-80 ms (1 GiB: 330-360 ms), the event loop's (and every client's) time while it
    ran there.

    Nothing reads them once taken: the store is read on the thread that took them, which moved
    every min offset past them first (a pull below answers OFFSET_TOO_SMALL). A flush thread's
    snapshot of a file list may still hold one, but an expired segment has nothing left to flush.
    """

    def __init__(self, segments: list[MappedFile], others: list[MappedFile | IndexFile]) -> None:
        self.segments = segments  # the commit log's
        self.others = others  # consume queues' and index files
        # Each consume queue's directory, held open from here (on the event loop, before a DeleteTopic
        # can rename it aside): its files are unlinked by name in that directory, not by path. A
        # topic deleted and made again while the removal runs (a DLQ purged, then the next dead
        # letter) has a new directory of the same path, its first file of the same name (offset 0):
        # unlinked by path, the new topic's open queue file went, its entries with it at a restart.
        self._dirs: dict[Path, int] = {}
        try:
            for f in others:
                if isinstance(f, MappedFile) and f.file_name.parent not in self._dirs:
                    self._dirs[f.file_name.parent] = os.open(f.file_name.parent, os.O_RDONLY)
        except BaseException:
            self._close_dirs()
            raise

    def remove(self) -> int:
        """Delete the files; returns how many commit-log segments went."""
        try:
            for mf in self.segments:
                mf.destroy()
                log.info("retention deleted commit log segment %s", mf.file_name.name)
            for f in self.others:
                dir_fd = self._dirs.get(f.file_name.parent) if isinstance(f, MappedFile) else None
                if dir_fd is None or isinstance(f, IndexFile):
                    f.destroy()
                    continue
                f.close()
                with contextlib.suppress(FileNotFoundError):  # its directory removed meanwhile
                    os.unlink(f.file_name.name, dir_fd=dir_fd)
        finally:
            self._close_dirs()
        return len(self.segments)

    def _close_dirs(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()


class DefaultMessageStore:
    """The broker's store. Call :meth:`load` then :meth:`start`; :meth:`shutdown` at the end.

    ``message_arriving_listener(topic, queue_id, max_offset)`` is told of every
    dispatch: the long-polling service wakes held pulls with it.
    """

    def __init__(self, config: MessageStoreConfig, store_host: bytes) -> None:
        self.config = config
        self.commit_log = CommitLog(config, store_host)
        self.consume_queue_table: dict[str, dict[int, ConsumeQueue]] = {}
        self.index_service = IndexService(
            config.store_path_index, config.max_hash_slot_num, config.max_index_num
        )
        self.checkpoint = StoreCheckpoint(config.store_checkpoint)
        self.disk_space = DiskSpaceService(
            [config.store_path_commit_log, config.store_path_consume_queue],
            config.disk_space_warning_level_ratio,
            2 * config.max_message_size,
        )
        self.dispatched_offset = 0  # every record before it is in its consume queue
        # topic -> the emptied queue directories of its DeleteTopic that a crash cut short (found by
        # load): the broker finishes those deletions, then calls release_deletion_markers
        self.unfinished_deletions: dict[str, list[Path]] = {}
        self._reput_queue: deque[tuple[str, int, EncodedRecords, AppendMessageResult]] = deque()
        self.message_arriving_listener: MessageArrivingListener | None = None
        self._group_commit: GroupCommitService | None = None
        self._services: list[ServiceThread] = []
        self._running = False
        self.last_exit_ok = True
        self._indexed_upto = -1  # recovery indexes the records after it again
        self._queued_from = 0  # recovery queues the records from it on again
        self._requeue_from: dict[str, int] = {}  # damaged queues ("topic-queueId"): from there on
        # damaged queues with no good entry in the log: where the walk's last run of rising queue
        # offsets of each began, [first queue offset, its physical offset, last queue offset]
        self._rebuild_runs: dict[str, list[int]] = {}
        self._checkpoint_lock = threading.Lock()

    # -- life cycle -------------------------------------------------------------

    def load(self) -> None:
        """Open the files and recover: cut a torn tail, rebuild missing queue entries."""
        self.config.store_path_root_dir.mkdir(parents=True, exist_ok=True)
        abort_file = self.config.store_path_root_dir / "abort"
        self.last_exit_ok = not abort_file.exists()
        abort_file.touch()  # removed by a clean shutdown: its presence means a crash
        self.commit_log.load()
        root = self.config.store_path_consume_queue
        if root.exists():
            # anything else a person or a tool left there (a note, .DS_Store) is not a queue: as
            # RocketMQ's loadConsumeQueue, skip it rather than refuse to start
            for leftover in root.glob(f"{DELETED_QUEUES_PREFIX}*"):  # a deletion a crash cut short
                _empty_dir(leftover)
                self.unfinished_deletions.setdefault(deleted_topic_of(leftover), []).append(leftover)
            for topic_dir in sorted(p for p in root.iterdir()
                                    if p.is_dir() and not p.name.startswith(DELETED_QUEUES_PREFIX)):
                for qdir in sorted(topic_dir.iterdir()):
                    if qdir.name.isdigit() and qdir.is_dir():
                        cq = self._find_or_create_consume_queue(topic_dir.name, int(qdir.name))
                        cq.load()
                        cq.recover()
        self.index_service.load(crashed=not self.last_exit_ok)
        self._indexed_upto = self.index_service.indexed_upto
        self._recover()

    def close(self) -> None:
        """Close the files of a store that never started (its :meth:`load` raised), writing
        nothing: a failed start must leave the data dir as it found it, and a notebook that
        retries must not run out of descriptors before the garbage collector frees them."""
        queues = [self.commit_log.mapped_file_queue, *(cq.queue for cq in self._all_consume_queues())]
        for q in queues:
            q.close()
        for f in self.index_service.files:
            with contextlib.suppress(OSError):
                f.close()
        with contextlib.suppress(OSError):
            self.checkpoint.close()

    def _recover(self) -> None:
        cl = self.commit_log
        start = self.checkpoint.logics_msg_offset
        if cl.mapped_file_queue.files and start < cl.min_offset:
            start = cl.min_offset
        # the consume queues hold every record before the checkpoint (flushed before it was
        # written): the walk from the segment start below re-checks those and indexes them,
        # but must not queue them again (a topic deleted since would come back)
        self._queued_from = start
        if not self.last_exit_ok:
            # After a crash, verify the whole segment holding the checkpoint too:
            # a segment start is a record boundary, so the walk can begin there.
            mf = cl.mapped_file_queue.find_mapped_file_by_offset(start)
            if mf is not None:
                start = mf.file_from_offset
        end = cl.recover(start)
        min_phy = cl.min_offset
        for cq in self._all_consume_queues():
            cq.truncate_dirty_logic_files(end)
            cq.correct_min_offset(min_phy)
        for topic, queues in self.consume_queue_table.items():
            for qid, cq in queues.items():
                cl.topic_queue_table[f"{topic}-{qid}"] = cq.max_offset_in_queue
        # a queue whose file was damaged lost entries below the checkpoint too: the walk starts
        # at its last good entry's end (for it alone: other queues keep the checkpoint's rule).
        # Without a good entry whose record is still in the log, the walk starts at the log's
        # head and keeps the queue's last run of rising queue offsets: a topic deleted and
        # created again starts at offset 0 again, so the deleted topic's records come before it
        self._requeue_from = {}
        self._rebuild_runs = {}
        for cq in self._all_consume_queues():
            if not cq.damaged:
                continue
            key = f"{cq.topic}-{cq.queue_id}"
            if cq.max_physic_offset > 0 and cq.max_physic_offset >= min_phy:
                self._requeue_from[key] = cq.max_physic_offset
            else:
                self._rebuild_runs[key] = []
        walk_from = min([start, *self._requeue_from.values(), *([min_phy] if self._rebuild_runs else [])])
        redispatched = 0

        def visit(offset: int, chunk: bytes, pos: int) -> None:
            nonlocal redispatched
            redispatched += 1
            self._redispatch(offset, chunk, pos)

        cl.scan(walk_from, visit)
        if self._rebuild_runs:
            self._rebuild_from_runs()
        for cq in self._all_consume_queues():
            cq.finish_recovery()
        self.dispatched_offset = end
        log.info(
            "store recovered: commit log [%d, %d), %d records re-dispatched from offset %d",
            min_phy, end, redispatched, walk_from,
        )

    def _redispatch(self, offset: int, chunk: bytes, pos: int) -> None:
        h = HEADER.unpack_from(chunk, pos)
        total, queue_id, queue_offset, store_ts, body_len = h[0], h[3], h[5], h[9], h[13]
        t0, t1, p0, p1 = split_tail(chunk, pos, total, body_len)
        topic = chunk[t0:t1].decode()
        props = chunk[p0:p1]
        cq = self._find_or_create_consume_queue(topic, queue_id)
        key = f"{topic}-{queue_id}"
        run = self._rebuild_runs.get(key)
        if run is not None:
            if not run or queue_offset <= run[2]:  # the first, or an older incarnation of the topic ended
                run[:] = [queue_offset, offset, queue_offset]
            else:
                run[2] = queue_offset
        # RocketMQ's rule too: a record below the queue's last physical offset is already queued
        if key in self._requeue_from and queue_offset > cq.max_offset_in_queue:
            # a damaged queue's records between its last good entry and this one are not in the log
            log.warning("consume queue %s: rebuilt up to queue offset %d; the next record in the "
                        "commit log is at %d, so the queue ends there", key, cq.max_offset_in_queue,
                        queue_offset)
            del self._requeue_from[key]
        if (run is None and offset >= self._requeue_from.get(key, self._queued_from)
                and queue_offset >= cq.max_offset_in_queue and offset >= cq.max_physic_offset):
            tag = self._tag_code(topic, queue_id, props, store_ts)
            cq.put_entries(queue_offset, pack_entries([offset], [total], [tag]), offset + total)
            self.commit_log.topic_queue_table[key] = queue_offset + 1
        if offset > self._indexed_upto:  # its keys were indexed after the last index flush, or never
            self._index(topic, [props], [offset], store_ts)

    def _rebuild_from_runs(self) -> None:
        """Queue the damaged queues that no good entry anchored: from where each one's last run of
        rising queue offsets began (the offsets before it expired, or were never in the log: the
        queue begins there), by a second walk of the log from there that queues nothing else."""
        runs, self._rebuild_runs = self._rebuild_runs, {}
        starts: dict[str, int] = {}
        for key, run in runs.items():
            topic, _, queue_id = key.rpartition("-")
            cq = self._find_or_create_consume_queue(topic, int(queue_id))
            if not run or run[2] < cq.max_offset_in_queue:
                log.warning("consume queue %s: the commit log holds no record of it from queue offset %d "
                            "on; entries past the damage, if it had any, are lost",
                            key, cq.max_offset_in_queue)
                continue
            if run[0] > cq.max_offset_in_queue:
                cq.begin_at(run[0])
            starts[key] = run[1]
        if not starts:
            return
        queued_from, indexed_upto = self._queued_from, self._indexed_upto
        self._requeue_from = starts
        self._queued_from = self._indexed_upto = 2**63  # the first walk queued and indexed the rest
        try:
            self.commit_log.scan(min(starts.values()), self._redispatch)
        finally:
            self._queued_from, self._indexed_upto = queued_from, indexed_upto
        for key in starts:
            topic, _, queue_id = key.rpartition("-")
            cq = self._find_or_create_consume_queue(topic, int(queue_id))
            log.warning("consume queue %s: rebuilt from the commit log, queue offsets %d..%d",
                        key, cq.min_offset_in_queue, cq.max_offset_in_queue - 1)

    def start(self) -> None:
        cfg = self.config
        if cfg.flush_disk_type == SYNC_FLUSH:
            self._group_commit = GroupCommitService(self.commit_log.flush)
            self._services.append(self._group_commit)
        else:
            self._services.append(
                FlushRealTimeService(self.commit_log.flush, cfg.flush_interval_commit_log)
            )
        self._services.append(_FlushConsumeQueueService(self, cfg.flush_interval_consume_queue))
        if cfg.warm_mapped_file_enable:
            warm = AllocateMappedFileService()
            self.commit_log.allocate_mapped_file_service = warm
            self._services.append(warm)
        for s in self._services:
            s.start()
        self._running = True

    def shutdown(self) -> None:
        """Flush everything and write the checkpoint (a clean stop recovers instantly)."""
        if not self._running:
            return
        dispatched = self._reput_quietly("shutdown")
        self._running = False
        for s in self._services:
            s.shutdown()
        self.checkpoint_now()
        self.commit_log.shutdown()
        for cq in self._all_consume_queues():
            cq.shutdown()
        self.index_service.shutdown()
        self.checkpoint.close()
        if dispatched:  # else the abort file stays: the next start re-dispatches from the checkpoint
            (self.config.store_path_root_dir / "abort").unlink(missing_ok=True)

    def checkpoint_now(self) -> None:
        """Flush queues, index and log, then record how far all of them are durable.

        One at a time (the flush thread, a DeleteTopic's thread, the shutdown): a slower
        round that read an older offset must not write it over a newer checkpoint.
        """
        with self._checkpoint_lock:
            upto = self.dispatched_offset
            for cq in self._all_consume_queues():
                cq.flush()
            self.index_service.flush()
            self.commit_log.flush()
            self.checkpoint.flush(upto, int(time.time() * 1000))

    # -- put --------------------------------------------------------------------

    def put_messages(
        self, topic: str, queue_id: int, messages: Sequence[MessageToStore]
    ) -> PutMessageResult:
        """Store ``messages`` (one or a batch) in queue ``queue_id`` of ``topic``.

        A single message with a DELAY property goes to SCHEDULE_TOPIC_XXXX, queue
        level-1, its real topic and queue kept in REAL_TOPIC / REAL_QID.
        """
        if not messages:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark="no message to store")
        if len(messages) == 1:
            topic, queue_id, messages = self.resolve_delay(topic, queue_id, messages)
        return self.put_records(topic, queue_id, EncodedRecords.from_messages(topic, messages))

    def put_records(
        self, topic: str, queue_id: int, records: EncodedRecords, *, reput_later: bool = False,
    ) -> PutMessageResult:
        """Store records already laid out (a pre-encoded batch, or :meth:`put_messages`).

        No delay handling here: a pre-encoded batch holds no delayed message.
        ``reput_later``: leave the dispatch queued for the caller's next
        :meth:`do_reput` (or the next read), e.g. after answering the sender;
        otherwise it runs before this returns.
        """
        if not self._running and self._services:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="store is shut down")
        n = len(records)
        if not n:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark="no message to store")
        disk = self.disk_space
        if not disk.is_writeable(len(records.buf)):
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark=disk.remark)
        problem = self._check_records(topic, records)
        if problem is not None:
            return problem
        try:
            appended = self.commit_log.put_records(topic, queue_id, records)
        except OSError as err:
            if not is_disk_full(err):
                raise
            disk.mark_full(err)
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark=disk.remark)
        self._reput_queue.append((topic, queue_id, records, appended))
        if not reput_later:
            # Stored is stored: a dispatch that fails (ours, or one queued before it) is
            # retried by the next reader, never answered as a failed put the producer would
            # send again (a duplicate).
            self._reput_quietly("a put to %s/%d", topic, queue_id)
        return PutMessageResult(
            PutMessageStatus.PUT_OK,
            topic=topic,
            queue_id=queue_id,
            queue_offset=appended.queue_offset,
            physical_offsets=appended.physical_offsets.tolist(),
            end_offset=appended.end_offset,
            store_timestamp=appended.store_timestamp,
        )

    def _check_records(self, topic: str, records: EncodedRecords) -> PutMessageResult | None:
        n = len(records)
        max_size = self.config.max_message_size
        body_lens = records.body_lens
        plens = records.props_end - records.props_start
        where = "message {i} of the batch: " if n > 1 else ""
        i = _first_over(body_lens, max_size)
        if i is not None:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=where.format(i=i) + (
                f"message body of {int(body_lens[i])} bytes is over maxMessageSize {max_size} "
                f"(topic {topic!r}; the broker's --max-message-size)"))
        i = _first_over(plens, MAX_PROPERTIES_SIZE)
        if i is not None:
            return PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, remark=where.format(i=i) + (
                f"message properties of {int(plens[i])} bytes are over the limit of "
                f"{MAX_PROPERTIES_SIZE} (topic {topic!r})"))
        if n > 1 and (total := int(body_lens.sum())) > max_size:
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                remark=(
                    f"batch of {n} messages carries {total} bytes, over "
                    f"maxMessageSize {max_size}; split it"
                ),
            )
        return None

    def resolve_delay(
        self, topic: str, queue_id: int, messages: Sequence[MessageToStore]
    ) -> tuple[str, int, Sequence[MessageToStore]]:
        """Where a message is really written: a delayed one to SCHEDULE_TOPIC_XXXX.

        Only a single message can be delayed (batches cannot). Callers that
        group many delayed messages by their schedule queue call this first.
        """
        if len(messages) != 1 or topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            return topic, queue_id, messages
        deliver_ms = find_property(messages[0].properties, _TIMER_DELIVER_MS)
        # an exact delivery time still ahead: the timer (RocketMQ 5); one already past (a delivered
        # timer message sent back, say) is not a timer message any more
        if deliver_ms and deliver_ms.isdigit() and int(deliver_ms) > time.time() * 1000:
            return self._to_timer(topic, queue_id, messages[0])
        level = find_property(messages[0].properties, _DELAY)
        if level and level.isdigit() and int(level) > 0:
            return self._to_schedule(topic, queue_id, messages[0], int(level))
        return topic, queue_id, messages

    def _to_schedule(
        self, topic: str, queue_id: int, msg: MessageToStore, level: int
    ) -> tuple[str, int, list[MessageToStore]]:
        props = decode_properties(msg.properties)
        delayed, schedule_queue = self.schedule_properties(topic, queue_id, level)
        props.update(delayed)
        scheduled = MessageToStore(
            msg.body, msg.flag, encode_properties(props), msg.born_timestamp,
            msg.reconsume_times, msg.sys_flag,
        )
        return SCHEDULE_TOPIC, schedule_queue, [scheduled]

    @staticmethod
    def _to_timer(topic: str, queue_id: int, msg: MessageToStore) -> tuple[str, int, list[MessageToStore]]:
        """To rmq_sys_wheel_timer (one queue) with REAL_TOPIC / REAL_QID, as RocketMQ's timer does."""
        props = decode_properties(msg.properties)
        props[MessageConst.PROPERTY_REAL_TOPIC] = topic
        props[MessageConst.PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        timed = MessageToStore(msg.body, msg.flag, encode_properties(props), msg.born_timestamp,
                               msg.reconsume_times, msg.sys_flag)
        return TIMER_TOPIC, 0, [timed]

    def schedule_properties(self, topic: str, queue_id: int, level: int) -> tuple[dict[str, str], int]:
        """The properties delaying a message for ``topic``/``queue_id`` by ``level``; its schedule queue.

        Queue L-1 of SCHEDULE_TOPIC_XXXX holds level L (capped at the highest level).
        """
        level = min(level, self.config.max_delay_level)
        return {
            MessageConst.PROPERTY_DELAY_TIME_LEVEL: str(level),
            MessageConst.PROPERTY_REAL_TOPIC: topic,
            MessageConst.PROPERTY_REAL_QUEUE_ID: str(queue_id),
        }, level - 1

    def _tag_code(self, topic: str, queue_id: int, props: bytes, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC:  # the delivery time, as RocketMQ: queue L-1 holds level L
            level_index = min(max(queue_id, 0), self.config.max_delay_level - 1)
            return store_ts + self.config.delay_levels_ms[level_index]
        if topic == TIMER_TOPIC:  # the delivery time, so that the timer finds what is due
            deliver_ms = find_property(props, _TIMER_DELIVER_MS)
            return int(deliver_ms) if deliver_ms and deliver_ms.isdigit() else store_ts
        return tag_hash(find_property(props, _TAGS))

    def do_reput(self) -> None:
        """Dispatch every put still queued, in commit-log order (ReputMessageService.doReput).

        A crash before it loses nothing: recovery dispatches again from the
        checkpoint, which never passes :attr:`dispatched_offset`. A dispatch that
        fails (a full disk) stays first in line and raises to whoever reads next,
        until it succeeds: a later put never skips ahead of it (the consume queue
        refuses gaps, and takes the entries it already has again without change).
        """
        queue = self._reput_queue
        while queue:
            self._dispatch(*queue[0])
            queue.popleft()

    def _reput_quietly(self, during: str, *args: object) -> bool:
        """:meth:`do_reput`, logging instead of raising a failure (OSError); whether all ran.

        ``during`` and ``args`` say where, %-formatted only when it fails (puts call this).
        """
        try:
            self.do_reput()
        except OSError as err:
            if is_disk_full(err):  # the consume queues' or index's disk: no more puts until there is room
                self.disk_space.mark_full(err)
            log.error("dispatching stored messages failed during " + during
                      + " (retried by the next read): %s", *args, err)
            return False
        return True

    def _dispatch(
        self, topic: str, queue_id: int, records: EncodedRecords, appended: AppendMessageResult,
    ) -> None:
        cq = self._find_or_create_consume_queue(topic, queue_id)
        ts = appended.store_timestamp
        props: list[bytes] | None = None
        if topic == SCHEDULE_TOPIC:
            tags: list[int] | np.ndarray = np.full(len(records), self._tag_code(topic, queue_id, b"", ts))
        elif topic == TIMER_TOPIC:
            props = records.all_properties()
            tags = [self._tag_code(topic, queue_id, p, ts) for p in props]
        else:
            tags = _tag_codes(records)
        cq.put_entries(
            appended.queue_offset,
            pack_entries(appended.physical_offsets, appended.sizes, tags),
            appended.end_offset,
        )
        cq.last_store_timestamp = ts
        if self.config.message_index_enable:
            if records.uniq_start is not None and not records.contains(_KEYS_KEY):
                # every record has a UNIQ_KEY and (it seems) no KEYS: one key each
                self.index_service.build_index_hashes(
                    records.uniq_hashes(key_seed(topic)), appended.physical_offsets, ts
                )
            else:
                props = records.all_properties() if props is None else props
                self._index(topic, props, appended.physical_offsets.tolist(), ts)
        self.dispatched_offset = appended.end_offset
        listener = self.message_arriving_listener
        if listener is not None:
            listener(topic, queue_id, cq.max_offset_in_queue)

    def _index(self, topic: str, props_list: Iterable[bytes], phys: Sequence[int], ts: int) -> None:
        if not self.config.message_index_enable:
            return
        keys: list[str] = []
        key_phys: list[int] = []
        for props, phy in zip(props_list, phys, strict=True):
            uniq = find_property(props, _UNIQ)
            if uniq:
                keys.append(uniq.decode("utf-8", "replace"))  # recovery may meet records stored before
                key_phys.append(phy)
            k = find_property(props, _KEYS)
            if k:
                more = k.decode("utf-8", "replace").split(MessageConst.KEY_SEPARATOR)
                keys.extend(more)
                key_phys.extend([phy] * len(more))
        if keys:
            self.index_service.build_index(topic, keys, key_phys, ts)

    def wait_flush(self, result: PutMessageResult) -> Future[bool] | None:
        """Under SYNC_FLUSH: a future done once the put is on disk; None under ASYNC_FLUSH."""
        if self._group_commit is None:
            return None
        return self._group_commit.put_request(result.end_offset)

    # -- queues -----------------------------------------------------------------

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's ConsumeQueue if it exists, with every queued put dispatched."""
        self.do_reput()
        return self.consume_queue_table.get(topic, {}).get(queue_id)

    def _find_or_create_consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        queues = self.consume_queue_table.setdefault(topic, {})
        cq = queues.get(queue_id)
        if cq is None:
            cq = ConsumeQueue(
                topic, queue_id, self.config.store_path_consume_queue,
                self.config.mapped_file_size_consume_queue,
            )
            queues[queue_id] = cq
        return cq


    def _all_consume_queues(self) -> list[ConsumeQueue]:
        return [cq for queues in list(self.consume_queue_table.values()) for cq in list(queues.values())]

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue(topic, queue_id)
        return cq.min_offset_in_queue if cq else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue(topic, queue_id)
        return cq.max_offset_in_queue if cq else 0

    def check_in_mem_by_consume_offset(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the message at ``offset`` of the queue is still in the store's memory.

        RocketMQ 5 asks the OS whether the record's pages are resident; pymq uses
        RocketMQ's own estimate (``estimateInMemByCommitOffset``): the record is among the
        newest ``accessMessageInMemoryMaxRatio`` percent of physical memory of the commit
        log. False when the queue has no message at ``offset`` (never written, or expired).
        """
        cq = self.consume_queue(topic, queue_id)
        if cq is None or not cq.min_offset_in_queue <= offset < cq.max_offset_in_queue:
            return False
        entry = cq.get_entries(offset, 1)
        if not len(entry):
            return False
        phy = int(entry[0]["phy"])
        if phy < self.commit_log.min_offset:
            return False
        memory = _physical_memory() * self.config.access_message_in_memory_max_ratio // 100
        return self.commit_log.max_offset - phy <= memory

    def get_last_store_timestamp(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue(topic, queue_id)
        if cq is None or cq.max_offset_in_queue <= cq.min_offset_in_queue:
            return 0
        if not cq.last_store_timestamp:
            cq.last_store_timestamp = self._store_timestamp_at(cq, cq.max_offset_in_queue - 1)
        return cq.last_store_timestamp

    def _store_timestamp_at(self, cq: ConsumeQueue, offset: int) -> int:
        e = cq.get_entries(offset, 1)
        if not len(e):
            return 0
        head = self.commit_log.get_data(int(e[0]["phy"]), HEADER_SIZE)
        return int(HEADER.unpack(head)[9]) if len(head) == HEADER_SIZE else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first offset stored at or after ``timestamp`` (max offset if none)."""
        cq = self.consume_queue(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            if self._store_timestamp_at(cq, mid) < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def delete_topic(self, topic: str) -> None:
        """Drop the topic's consume queues (its records expire with the commit log), here and now:
        no config of the broker's to write in between, so no marker is kept."""
        detached = self.detach_topic(topic)
        detached.remove()
        detached.release()

    def release_deletion_markers(self) -> None:
        """The deletions :attr:`unfinished_deletions` named are finished (their configs written)."""
        for markers in self.unfinished_deletions.values():
            for marker in markers:
                shutil.rmtree(marker, ignore_errors=True)
        self.unfinished_deletions = {}

    def detach_topic(self, topic: str, *, checkpoint: bool = True) -> DetachedQueues:
        """Take the topic's consume queues out of the store, cheaply: call it on the thread that
        writes the store, then :meth:`DetachedQueues.remove` (any thread) deletes their files.
        ``checkpoint=False``: the caller moved the checkpoint past the topic's records already
        (:meth:`checkpoint_now` on another thread: it flushes every queue), the topic taking no
        records since.

        Their directory is renamed aside first (:data:`DELETED_QUEUES_PREFIX`; a start removes
        what a crash left of it): a topic of the same name created right after gets queues of its
        own, which the removal cannot touch. Removing the files of a 1,024-queue topic took
        0.2 s, the event loop's (and every client's) time while it ran there.
        """
        self.do_reput()
        # a crash recovery re-queues the records after the checkpoint: move it past the topic's
        # records before its queue files go, or a kill -9 in between would build its queues again
        # from the older checkpoint, beginning mid-queue
        if self._running and checkpoint:
            self.checkpoint_now()
        queues = self.consume_queue_table.pop(topic, {})
        for qid in queues:
            self.commit_log.topic_queue_table.pop(f"{topic}-{qid}", None)
        root = self.config.store_path_consume_queue
        aside = root / f"{DELETED_QUEUES_PREFIX}{topic}-{time.time_ns()}"
        detached = DetachedQueues(list(queues.values()), aside, self._checkpoint_lock)
        try:
            os.rename(root / topic, aside)
        except FileNotFoundError:  # no queue file was ever made: the marker alone
            try:
                aside.mkdir(parents=True)
            except OSError as err:
                log.warning("deleting topic %s: no marker of the deletion could be made (%s)", topic, err)
                detached.path = None
        except OSError as err:  # cannot be renamed: removed here, before a topic of the name is made
            log.warning("consume queues of deleted topic %s not moved aside (%s): removed in place",
                        topic, err)
            detached.path = None
            detached.remove()
            shutil.rmtree(root / topic, ignore_errors=True)
        return detached

    # -- get --------------------------------------------------------------------

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        max_bytes: int = 0,
        tag_hashes: frozenset[int] | None = None,
        property_filter: Callable[[bytes], bool] | None = None,
    ) -> GetMessageResult:
        """Up to ``max_msg_nums`` records from ``offset``, as stored, back to back.

        ``tag_hashes`` filters by the consume queue's tag hash (None: all);
        ``property_filter(properties)`` by each record's encoded properties
        (SQL92), which means reading the candidates first.
        """
        cq = self.consume_queue(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_off, max_off = cq.min_offset_in_queue, cq.max_offset_in_queue
        if max_off == 0 or max_off == min_off:
            status = GetMessageStatus.NO_MESSAGE_IN_QUEUE
            nxt = min_off if offset != min_off else offset
            return GetMessageResult(status, nxt, min_off, max_off)
        if offset < min_off:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, max_off, min_off, max_off)
        cfg = self.config
        max_bytes = min(max_bytes or cfg.max_transfer_bytes_on_message_in_disk,
                        cfg.max_transfer_bytes_on_message_in_disk)
        want = min(max_msg_nums, cfg.max_transfer_count_on_message_in_disk)
        filtered = tag_hashes is not None or property_filter is not None
        scan = want if not filtered else min(max(want * 4, 1024), 64_000)
        entries = cq.get_entries(offset, scan)
        # pre-blank entries (PRE_BLANK_SIZE) lie below min_off, so a pull never reaches them
        mask = entries["phy"] >= self.commit_log.min_offset
        if tag_hashes is not None:
            mask &= np.isin(entries["tag"], np.fromiter(tag_hashes, dtype=np.int64))
        if property_filter is not None:
            return self._get_filtered(entries, mask, offset, want, max_bytes, property_filter,
                                      min_off, max_off)
        matched = np.flatnonzero(mask)[:want]
        if len(matched):
            sizes = entries["size"][matched].astype(np.int64)
            fits = int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right"))
            matched = matched[: max(fits, 1)]
            cut = len(matched) == want or fits < len(sizes)
            scanned = int(matched[-1]) + 1 if cut else len(entries)
        else:
            scanned = len(entries)
        nxt = offset + scanned
        if not len(matched):
            return GetMessageResult(GetMessageStatus.NO_MATCHED_MESSAGE, nxt, min_off, max_off)
        sizes = entries["size"][matched]
        records = self.read_records(entries["phy"][matched], sizes)
        return GetMessageResult(GetMessageStatus.FOUND, nxt, min_off, max_off, records, len(matched),
                                sizes.tobytes())  # CQ_ENTRY's size is already <i4

    def _get_filtered(
        self, entries: np.ndarray, mask: np.ndarray, offset: int, want: int, max_bytes: int,
        keep: Callable[[bytes], bool], min_off: int, max_off: int,
    ) -> GetMessageResult:
        """get_message's path for filters that need each record's properties.

        The filter runs in Python on the event loop: a pull stops evaluating after
        :data:`FILTER_BUDGET_S` (checked every :data:`FILTER_CHECK_EVERY` records) and answers
        with what it found, its next offset after the last record evaluated, so one costly
        filter over a long queue cannot stall every other client (issue 17).
        """
        cand = np.flatnonzero(mask)
        sizes = entries["size"][cand].astype(np.int64)
        fits = max(int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right")), 1)
        cand = cand[:fits]
        scanned = len(entries) if fits >= len(mask.nonzero()[0]) else int(cand[-1]) + 1
        out: list[bytes] = []
        kept: list[int] = []
        if len(cand):
            raw = self.read_records(entries["phy"][cand], entries["size"][cand])
            pos = 0
            deadline = time.monotonic() + FILTER_BUDGET_S
            for j in range(len(cand)):
                if j and not j % FILTER_CHECK_EVERY and time.monotonic() > deadline:
                    scanned = int(cand[j - 1]) + 1  # the rest waits for the next pull
                    break
                h = HEADER.unpack_from(raw, pos)
                total = h[0]
                _t0, _t1, p0, p1 = split_tail(raw, pos, total, h[13])
                if keep(raw[p0:p1]):
                    out.append(raw[pos : pos + total])
                    kept.append(total)
                    if len(out) == want:
                        scanned = int(cand[j]) + 1
                        break
                pos += total
        nxt = offset + scanned
        if not out:
            return GetMessageResult(GetMessageStatus.NO_MATCHED_MESSAGE, nxt, min_off, max_off)
        return GetMessageResult(GetMessageStatus.FOUND, nxt, min_off, max_off, b"".join(out), len(out),
                                np.array(kept, dtype="<i4").tobytes())

    def read_records(self, phys: np.ndarray, sizes: np.ndarray) -> bytes:
        """The records at ``phys``: one pread per contiguous run in one segment."""
        file_size = self.config.mapped_file_size_commit_log
        ends = phys + sizes
        breaks = np.flatnonzero(
            (phys[1:] != ends[:-1]) | (phys[1:] // file_size != phys[:-1] // file_size)
        ) + 1
        starts = np.concatenate(([0], breaks))
        stops = np.concatenate((breaks, [len(phys)]))
        get = self.commit_log.get_data
        if len(starts) == 1:
            return get(int(phys[0]), int(ends[-1] - phys[0]))
        return b"".join(
            get(int(phys[a]), int(ends[b - 1] - phys[a])) for a, b in zip(starts, stops, strict=True)
        )

    def look_message_by_offset(self, phy: int) -> bytes | None:
        """The whole record at physical offset ``phy``."""
        if phy < self.commit_log.min_offset or phy >= self.commit_log.max_offset:
            return None
        return self.commit_log.get_message(phy)

    def look_messages_by_offsets(self, phys: Sequence[int]) -> list[bytes | None]:
        """:meth:`look_message_by_offset` for many offsets, with few reads."""
        lo, hi = self.commit_log.min_offset, self.commit_log.max_offset
        return self.commit_log.get_messages([p if lo <= p < hi else -1 for p in phys])

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> list[bytes]:
        """Records of ``topic`` whose UNIQ_KEY or KEYS holds ``key`` (newest first)."""
        self.do_reput()
        out: list[bytes] = []
        seen: set[int] = set()
        for phy in self.index_service.query_offsets(topic, key, max_num * 4, begin_ms, end_ms):
            if phy in seen:
                continue
            seen.add(phy)
            rec = self.look_message_by_offset(phy)
            if rec is None:
                continue
            h = HEADER.unpack_from(rec)
            t0, t1, p0, p1 = split_tail(rec, 0, h[0], h[13])
            if rec[t0:t1].decode() != topic:
                continue
            props = rec[p0:p1]
            keys = (find_property(props, _KEYS) or b"").decode("utf-8", "replace").split(
                MessageConst.KEY_SEPARATOR)
            uniq = (find_property(props, _UNIQ) or b"").decode("utf-8", "replace")
            if key == uniq or key in keys:
                out.append(rec)
                if len(out) >= max_num:
                    break
        return out

    # -- retention --------------------------------------------------------------

    def take_expired_files(self, now: float | None = None) -> ExpiredFiles:
        """Take commit-log segments older than fileReservedTime out of the store, then the consume
        queue segments and index files that pointed at them, moving every min offset past them:
        call it on the thread that writes the store, then :meth:`ExpiredFiles.remove` (any thread)
        deletes their files.

        Runs even when a queued dispatch fails (a full disk): those records sit in the newest
        segment, which is never expired, and freeing old ones may be what lets it succeed.
        """
        self._reput_quietly("retention")
        segments = self.commit_log.take_expired_files(self.config.file_reserved_time * 3600, now)
        others: list[MappedFile | IndexFile] = []
        if segments:
            phy_min = self.commit_log.min_offset
            for cq in self._all_consume_queues():
                others += cq.take_expired_files(phy_min)
            others += self.index_service.take_expired_files(phy_min)
        return ExpiredFiles(segments, others)

    def clean_expired_files(self, now: float | None = None) -> int:
        """:meth:`take_expired_files` and their removal at once, on this thread; returns how many
        commit-log segments went."""
        return self.take_expired_files(now).remove()

    # -- stats ------------------------------------------------------------------

    def runtime_info(self) -> dict[str, str]:
        cl = self.commit_log
        return {
            "commitLogMinOffset": str(cl.min_offset),
            "commitLogMaxOffset": str(cl.max_offset),
            "dispatchedOffset": str(self.dispatched_offset),
            "flushDiskType": self.config.flush_disk_type,
            "consumeQueues": str(len(self._all_consume_queues())),
            "storePath": str(self.config.store_path_root_dir),
            **self.disk_space.runtime_info(),
        }




__all__ = ["CQ_STORE_UNIT_SIZE", "DefaultMessageStore", "MessageToStore"]
