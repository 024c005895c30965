"""TransactionalMessageService: half messages, their resolution, and check-back.

A half message is stored in RMQ_SYS_TRANS_HALF_TOPIC (queue 0) with its real
topic and queue in REAL_TOPIC / REAL_QID: consumers never see it. The producer
ends the transaction: COMMIT_MESSAGE writes the message to its real topic with
every property of the half message (as RocketMQ 5.3.3 stores it: TRAN_MSG=true,
PGROUP, REAL_TOPIC, REAL_QID... kept), ROLLBACK_MESSAGE
drops it; either way an op record in
RMQ_SYS_TRANS_OP_HALF_TOPIC marks the half message done. Half messages left
unresolved are checked back: after ``transactionTimeout``, then every
``transactionCheckInterval``, the broker asks the producer group (RocketMQ
re-puts the half message with TRANSACTION_CHECK_TIMES + 1, and so does pymq);
after ``transactionCheckMax`` checks it is given up into
TRANS_CHECK_MAX_TIME_TOPIC. Everything lives in the commit log, so it all
survives a restart; the scan position is persisted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    PROPERTY_SEPARATOR,
    MessageConst,
    decode_properties,
    encode_properties,
    entries_named,
    find_property,
    property_key,
    split_tail,
)
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.config_manager import ConfigManager
from ..common.mix_all import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from ..manager.topic_config_manager import TopicConfigManager
from ..store.commit_log import MessageToStore
from ..store.encoded_batch import EncodedRecords
from ..store.message_store import DefaultMessageStore
from ..store.results import PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)
MC = MessageConst
OP_BATCH = 50_000  # half offsets per op message: ~0.5 MB of digits, well under maxMessageSize
_UNIQ = MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_PGROUP = MC.PROPERTY_PRODUCER_GROUP.encode()
_TRAN = MC.PROPERTY_TRANSACTION_PREPARED.encode()
_REAL_TOPIC = MC.PROPERTY_REAL_TOPIC.encode()
_REAL_QID = MC.PROPERTY_REAL_QUEUE_ID.encode()
# Where the message really goes; RocketMQ keeps these (and TRAN_MSG, PGROUP,
# TRANSACTION_CHECK_TIMES) in the committed message's stored properties:
# EndTransactionProcessor.endMessageTransaction clears them after the properties string is made.
# (RocketMQ also adds __transactionId__, a copy of UNIQ_KEY, to every half message; pymq does
# not: its bulk half path re-addresses pre-encoded records with one suffix shared by all.)
_REAL_ENTRIES = entries_named((MC.PROPERTY_REAL_TOPIC, MC.PROPERTY_REAL_QUEUE_ID))


# what a pre-encoded batch of half messages must not (or must) hold, as byte searches
_NOT_IN_HALF_RECORDS = tuple(property_key(name) for name in (
    MC.PROPERTY_DELAY_TIME_LEVEL, MC.PROPERTY_REAL_TOPIC, MC.PROPERTY_REAL_QUEUE_ID))
_TRAN_KEY = property_key(MC.PROPERTY_TRANSACTION_PREPARED)
_TRAN_TRUE = (  # a whole entry, never the first one (UNIQ_KEY is)
    PROPERTY_SEPARATOR.encode() + encode_properties({MC.PROPERTY_TRANSACTION_PREPARED: "true"}))


def _real_properties(topic: str, queue_id: int) -> bytes:
    """What a half message carries of where it really goes."""
    return encode_properties({MC.PROPERTY_REAL_TOPIC: topic, MC.PROPERTY_REAL_QUEUE_ID: str(queue_id)})


_Commit = tuple[str, tuple[int, int], MessageToStore]  # msg id, (half queue offset, phy), real message


@dataclass
class TransactionCheck:
    """One check-back to send to a producer group."""

    producer_group: str
    msg_id: str
    topic: str
    record: bytes
    check_times: int


@dataclass(frozen=True)
class TransactionConfig:
    transaction_timeout: int = 6_000  # ms before the first check
    transaction_check_interval: int = 60_000  # ms between checks
    transaction_check_max: int = 15


class TransactionalMessageService(ConfigManager):
    def __init__(self, store: DefaultMessageStore, topics: TopicConfigManager, path: Path,
                 config: TransactionConfig) -> None:
        super().__init__(path)
        self.store = store
        self.topics = topics
        self.config = config
        self.check_offset = 0  # every half message before it is resolved
        self.pending: dict[str, tuple[int, int]] = {}  # msg id -> (half queue offset, phy)
        self.done: set[int] = set()  # resolved half queue offsets >= check_offset
        # resolved half offsets whose op record the store refused (a full disk): written with the next
        self._ops_to_write: list[int] = []

    def encode(self) -> dict[str, Any]:
        # op records the store refused: without them a restart would take those resolved half
        # messages for pending ones, check them back and commit them a second time
        return {"checkOffset": self.check_offset, "opsToWrite": list(self._ops_to_write)}

    def decode(self, data: dict[str, Any]) -> None:
        self.check_offset = int(data.get("checkOffset", 0))
        self._ops_to_write = [int(q) for q in data.get("opsToWrite", ())]

    def load(self) -> None:
        """Rebuild pending transactions from the half and op queues."""
        super().load()
        op = self.store.consume_queue(TRANS_OP_HALF_TOPIC, 0)
        if op is not None:
            for _phy, rec in self._records(TRANS_OP_HALF_TOPIC, op.min_offset_in_queue):
                body_len = HEADER.unpack_from(rec)[13]
                for part in rec[HEADER_SIZE : HEADER_SIZE + body_len].split(b","):
                    half = int(part or b"-1")
                    if half >= self.check_offset:
                        self.done.add(half)
        self.done.update(q for q in self._ops_to_write if q >= self.check_offset)
        superseded = []
        for qoff, phy, rec in self._half_records(self.check_offset):
            if qoff not in self.done:
                props = self._props(rec)
                key = props.get(MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, str(phy))
                if key in self.pending:  # re-put by a check-back whose op record never came: the last counts
                    superseded.append(self.pending[key][0])
                self.pending[key] = (qoff, phy)
        committed = self._committed_before_a_crash()
        if superseded or committed:
            self._mark_done(superseded + committed)
        self._advance()
        if self.pending:
            log.info("%d unresolved transaction(s) recovered", len(self.pending))

    def _committed_before_a_crash(self) -> list[int]:
        """Pending transactions whose real message is in its topic: a crash between a commit's two
        writes (the real message, then the op record) left them pending, and the commit the
        producer sent again (or a check-back) stored the message a second time. The real message
        keeps the half's UNIQ_KEY and TRAN_MSG (see :meth:`_real_message`) and comes after it.
        Their half queue offsets, taken out of :attr:`pending`."""
        found: list[int] = []
        if not self.pending:
            return found
        by_phy = {phy: key for key, (_q, phy) in self.pending.items()}
        for phy, rec in zip(by_phy, self.store.look_messages_by_offsets(list(by_phy)), strict=True):
            key = by_phy[phy]
            if rec is None:
                continue
            topic = (_REAL_ENTRIES.values(self._raw_props(rec)).get(_REAL_TOPIC) or b"").decode()
            for real in self.store.query_message(topic, key, 4, 0, 2**62):
                props = self._raw_props(real)
                # the index finds KEYS too: another message may name this one's id among its keys
                if (HEADER.unpack_from(real)[6] > phy  # its physical offset: stored after the half
                        and find_property(props, _UNIQ) == key.encode()
                        and find_property(props, _TRAN) == b"true"):
                    found.append(self.pending.pop(key)[0])
                    break
        if found:
            log.warning("%d transaction(s) committed before the broker stopped were still pending (their "
                        "op record was not written): marked done, not committed again", len(found))
        return found

    # -- records ----------------------------------------------------------------

    def _records(self, topic: str, start: int) -> list[tuple[int, bytes]]:
        cq = self.store.consume_queue(topic, 0)
        if cq is None:
            return []
        entries = cq.get_entries(max(start, cq.min_offset_in_queue), cq.max_offset_in_queue)
        out = []
        for e in entries:
            rec = self.store.look_message_by_offset(int(e["phy"]))
            if rec is not None:
                out.append((int(e["phy"]), rec))
        return out

    def _half_records(self, start: int) -> list[tuple[int, int, bytes]]:
        out = []
        for phy, rec in self._records(TRANS_HALF_TOPIC, start):
            out.append((int(HEADER.unpack_from(rec)[5]), phy, rec))
        return out

    @staticmethod
    def _raw_props(rec: bytes) -> bytes:
        h = HEADER.unpack_from(rec)
        _t0, _t1, p0, p1 = split_tail(rec, 0, h[0], h[13])
        return rec[p0:p1]

    @classmethod
    def _props(cls, rec: bytes) -> dict[str, str]:
        return decode_properties(cls._raw_props(rec))

    # -- prepare / end ----------------------------------------------------------

    def prepare_messages(self, topic: str, queue_id: int, msgs: list[MessageToStore]) -> PutMessageResult:
        """Store the half messages of many transactions with one put.

        A msgId already pending is skipped: a retried request must not leave a
        second half message that nobody would end.
        """
        keep, uniqs = self._new_transactions([
            raw.decode() if (raw := find_property(m.properties, _UNIQ)) is not None else None for m in msgs
        ], lambda i: msgs[i].properties)
        if not keep:
            return PutMessageResult(PutMessageStatus.PUT_OK, TRANS_HALF_TOPIC, 0, -1)
        real = _real_properties(topic, queue_id)
        halves = []
        for msg in (msgs[i] for i in keep):
            props = msg.properties
            if find_property(props, _REAL_TOPIC) is None and find_property(props, _REAL_QID) is None:
                # append, no decoding (the exactly-once sink sends thousands at once)
                props = (props if not props or props.endswith(b"\x02") else props + b"\x02") + real
            else:
                props = encode_properties({**decode_properties(props), **decode_properties(real)})
            halves.append(MessageToStore(msg.body, msg.flag, props, msg.born_timestamp,
                                         msg.reconsume_times, msg.sys_flag))
        self.topics.create_system_topic(TRANS_HALF_TOPIC, 1)
        return self._pending_after(self.store.put_messages(TRANS_HALF_TOPIC, 0, halves), uniqs)

    def prepare_records(self, topic: str, queue_id: int, records: EncodedRecords) -> PutMessageResult | None:
        """:meth:`prepare_messages` for a pre-encoded batch: its records stored as they came.

        REAL_TOPIC/REAL_QID are appended to the properties of all records at once.
        None when some record needs the per-message path (which also names what
        is wrong): it may lack TRAN_MSG=true (or give it twice), carry a delay or a REAL_TOPIC
        already, or end its properties mid-entry.
        """
        if (any(records.contains(key) for key in _NOT_IN_HALF_RECORDS) or not records.properties_end_whole()
                or not records.each_properties_hold_once(_TRAN_KEY, _TRAN_TRUE)):
            return None
        keep, uniqs = self._new_transactions(
            [raw.decode() if raw else None for raw in records.uniq_keys()], records.properties)
        if not keep:
            return PutMessageResult(PutMessageStatus.PUT_OK, TRANS_HALF_TOPIC, 0, -1)
        self.topics.create_system_topic(TRANS_HALF_TOPIC, 1)
        halves = records.select(keep, topic=TRANS_HALF_TOPIC, suffix=_real_properties(topic, queue_id))
        return self._pending_after(self.store.put_records(TRANS_HALF_TOPIC, 0, halves), uniqs)

    def _new_transactions(self, uniqs: list[str | None],
                          properties_of: Callable[[int], bytes]) -> tuple[list[int], list[str | None]]:
        """Indexes (and msgIds) of those neither pending nor earlier in the request (None: no msgId).

        A msgId pending already is skipped only when the pending half message is of the same
        producer group (the PGROUP of ``properties_of(i)``, message ``i``'s): a retried send.
        Another group's pending half message of that msgId (a transaction is ended and checked
        back by its msgId: one at a time) refuses the send, MESSAGE_ILLEGAL: skipped, it would be
        answered PUT_OK, its sender would run its local transaction and end the other group's
        message. (The owners of a request's pending msgIds are read at once: a whole retried batch
        is the usual case.)
        """
        retried = [u for u in uniqs if u is not None and u in self.pending]
        owners = self.owners(retried) if retried else {}
        keep: list[int] = []
        kept: list[str | None] = []
        seen: set[str] = set()
        for i, uniq in enumerate(uniqs):
            if uniq is not None:
                if uniq in self.pending:
                    owner = owners.get(uniq)
                    group = (find_property(properties_of(i), _PGROUP) or b"").decode("utf-8", "replace")
                    if owner is not None and owner != group:
                        raise BrokerException(
                            pymq_pb2.MESSAGE_ILLEGAL,
                            f"message {i}'s msgId (UNIQ_KEY) {uniq} is a pending transaction of another "
                            "producer group: send it with a new msgId",
                        )
                    continue
                if uniq in seen:
                    continue
                seen.add(uniq)
            keep.append(i)
            kept.append(uniq)
        return keep, kept

    def _pending_after(self, result: PutMessageResult, uniqs: list[str | None]) -> PutMessageResult:
        """Once stored, each half message waits for its end under its msgId (else its offset)."""
        if result.ok:
            for i, (uniq, phy) in enumerate(zip(uniqs, result.physical_offsets, strict=True)):
                self.pending[uniq or str(phy)] = (result.queue_offset + i, phy)
        return result

    def owners(self, msg_ids: list[str]) -> dict[str, str]:
        """The producer group (PGROUP) of each pending transaction among ``msg_ids``."""
        ids = [m for m in dict.fromkeys(msg_ids) if m in self.pending]
        out = {}
        for m, rec in zip(ids, self.store.look_messages_by_offsets([self.pending[m][1] for m in ids]),
                          strict=True):
            if rec is not None:
                out[m] = self._props(rec).get(MC.PROPERTY_PRODUCER_GROUP, "")
        return out

    def end_transactions(self, msg_ids: list[str], commit: bool) -> tuple[int, list[PutMessageResult]]:
        """End many transactions alike: real messages stored per queue, one op record each.

        Returns how many were pending, and the puts to wait for (SYNC_FLUSH).
        Unknown msgIds (resolved before, given up, never sent) are skipped.
        """
        entries = [(m, e) for m in dict.fromkeys(msg_ids) if (e := self.pending.pop(m, None)) is not None]
        if not entries:
            return 0, []
        results: list[PutMessageResult] = []
        done = [qoff for _m, (qoff, _phy) in entries]
        if commit:
            by_queue: dict[tuple[str, int], list[_Commit]] = {}
            records = self.store.look_messages_by_offsets([phy for _m, (_q, phy) in entries])
            for (msg_id, entry), rec in zip(entries, records, strict=True):
                if rec is None:
                    log.error("half message %s at %d is gone; cannot commit", msg_id, entry[1])
                    continue
                topic, qid, real = self._real_message(rec)
                by_queue.setdefault((topic, qid), []).append((msg_id, entry, real))
            failed: set[int] = set()
            for (topic, qid), items in by_queue.items():
                for chunk in self._store_batches(items):
                    result = self.store.put_messages(topic, qid, [real for _m, _e, real in chunk])
                    results.append(result)
                    if not result.ok:  # still pending: the producer (or a check-back) ends it again
                        for msg_id, entry, _real in chunk:
                            self.pending[msg_id] = entry
                            failed.add(entry[0])
            done = [q for q in done if q not in failed]
        if done and (op := self._mark_done(done)) is not None:
            results.append(op)
        return len(entries) - sum(1 for m, _e in entries if m in self.pending), results

    def _store_batches(self, items: list[_Commit]) -> Iterator[list[_Commit]]:
        """``items`` in store batches of at most maxMessageSize bytes of bodies."""
        limit = self.store.config.max_message_size
        start = size = 0
        for i, item in enumerate(items):
            if size + len(item[2].body) > limit and i > start:
                yield items[start:i]
                start, size = i, 0
            size += len(item[2].body)
        yield items[start:]

    def _real_message(self, rec: bytes) -> tuple[str, int, MessageToStore]:
        """The message a half message stands for, its properties kept whole (no decoding).

        As RocketMQ 5.3.3 stores a committed message: every property of the half message
        stays, TRAN_MSG=true, PGROUP, REAL_TOPIC, REAL_QID and (after a check-back)
        TRANSACTION_CHECK_TIMES included.
        """
        h = HEADER.unpack_from(rec)
        props = self._raw_props(rec)
        real = _REAL_ENTRIES.values(props)
        topic = (real.get(_REAL_TOPIC) or b"").decode()
        qid = int(real.get(_REAL_QID) or 0)
        body = rec[HEADER_SIZE : HEADER_SIZE + h[13]]
        return topic, qid, MessageToStore(body, h[4], props, h[8], h[11], h[7])

    def _mark_done(self, half_offsets: list[int]) -> PutMessageResult | None:
        """Op records marking half messages resolved (RocketMQ's RMQ_SYS_TRANS_OP_HALF_TOPIC).

        As RocketMQ 5 does, one op message carries many half offsets, each followed by a comma.
        Returns the put to wait for. None: nothing to write, or the store refused it (a full
        disk): the offsets are resolved in memory, and their op records are written with the
        next ones (a restart before that checks those transactions back again).
        """
        offsets = self._ops_to_write + half_offsets
        result = None
        if offsets:
            self.topics.create_system_topic(TRANS_OP_HALF_TOPIC, 1)
            now = int(time.time() * 1000)
            # as RocketMQ's getOpMessage: TAGS=d, WAIT=true (a new Message's), "<offset>," per half message
            tags = encode_properties({MC.PROPERTY_WAIT_STORE_MSG_OK: "true", MC.PROPERTY_TAGS: "d"})
            ops = [MessageToStore("".join(f"{q}," for q in offsets[i : i + OP_BATCH]).encode(), 0, tags, now)
                   for i in range(0, len(offsets), OP_BATCH)]
            result = self.store.put_messages(TRANS_OP_HALF_TOPIC, 0, ops)
            if not result.ok:
                if not self._ops_to_write:
                    log.warning("op records of %d resolved transaction(s) wait: %s",
                                len(offsets), result.remark)
                self._ops_to_write, result = offsets, None
                self._persist_quietly()
            elif self._ops_to_write:
                self._ops_to_write = []
                self._persist_quietly()
        self.done.update(half_offsets)
        self._advance()
        return result

    def _persist_quietly(self) -> None:
        try:
            self.persist()
        except OSError as err:  # a full file system: kept in memory, written with the next change
            log.warning("%s not written: %s", self.path, err)

    def _advance(self) -> None:
        moved = False
        while self.check_offset in self.done:
            self.done.discard(self.check_offset)
            self.check_offset += 1
            moved = True
        cq = self.store.consume_queue(TRANS_HALF_TOPIC, 0)
        if not self.pending and cq is not None and self.check_offset < cq.max_offset_in_queue:
            self.check_offset = cq.max_offset_in_queue
            self.done.clear()
            moved = True
        if moved:
            # written by the controller's periodic write, off the event loop (a write and two fsyncs
            # on the loop for every ended transaction held every client ~5 ms each): the check offset
            # is where load() starts reading half messages, and one older than the last only makes
            # it read more (what was resolved is known from the op records, read whole)
            self.dirty = True

    # -- check-back -------------------------------------------------------------

    def check(self, now_ms: int | None = None) -> list[TransactionCheck]:
        """Half messages due for a check-back; gives up those past transactionCheckMax."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if self._ops_to_write:
            self._mark_done([])
        checks: list[TransactionCheck] = []
        # the half messages this round re-put or gave up: marked done at once at the end (one op
        # record, one write of the check offset), not one by one (an op put and a write and fsync
        # of transactionCheck.json per message held the event loop ~5 ms per unresolved transaction)
        finished: list[int] = []
        try:
            self._check_pending(now_ms, checks, finished)
        finally:
            if finished:
                self._mark_done(finished)
        return checks

    def _check_pending(self, now_ms: int, checks: list[TransactionCheck], finished: list[int]) -> None:
        cfg = self.config
        for msg_id, (qoff, phy) in sorted(self.pending.items(), key=lambda kv: kv[1][0]):
            rec = self.store.look_message_by_offset(phy)
            if rec is None:
                self.pending.pop(msg_id, None)
                finished.append(qoff)
                continue
            store_ts = HEADER.unpack_from(rec)[9]
            props = self._props(rec)
            times = int(props.get(MC.PROPERTY_TRANSACTION_CHECK_TIMES, "0") or 0)
            wait = cfg.transaction_timeout if times == 0 else cfg.transaction_check_interval
            if now_ms - store_ts < wait:
                break  # later half messages are newer still
            if times >= cfg.transaction_check_max:
                topic, _qid, real = self._real_message(rec)
                self.topics.create_system_topic(TRANS_CHECK_MAX_TIME_TOPIC, 1)
                if not self.store.put_messages(TRANS_CHECK_MAX_TIME_TOPIC, 0, [real]).ok:
                    continue  # kept (a full disk): given up on the next check
                log.warning("transaction %s (topic %s) given up after %d checks", msg_id, topic, times)
                self.pending.pop(msg_id, None)
                finished.append(qoff)
                continue
            # re-put with one more check, then mark the old one done (RocketMQ's way)
            props[MC.PROPERTY_TRANSACTION_CHECK_TIMES] = str(times + 1)
            h = HEADER.unpack_from(rec)
            again = MessageToStore(rec[HEADER_SIZE : HEADER_SIZE + h[13]], h[4],
                                   encode_properties(props), h[8], h[11], h[7])
            result = self.store.put_messages(TRANS_HALF_TOPIC, 0, [again])
            if not result.ok:
                continue
            self.pending[msg_id] = (result.queue_offset, result.physical_offsets[0])
            finished.append(qoff)
            new_rec = self.store.look_message_by_offset(result.physical_offsets[0]) or rec
            checks.append(TransactionCheck(
                props.get(MC.PROPERTY_PRODUCER_GROUP, ""), msg_id,
                props.get(MC.PROPERTY_REAL_TOPIC, ""), new_rec, times + 1,
            ))
