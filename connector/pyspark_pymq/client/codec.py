"""Decoding the stored records that a pull (or a look-up) answers with."""

from __future__ import annotations

from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    MessageConst,
    decode_properties,
    offset_msg_id,
    split_tail,
)

from .message import MessageExt

__all__ = ["decode_records"]

_KEYS = MessageConst.PROPERTY_KEYS
_TAGS = MessageConst.PROPERTY_TAGS
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX


def decode_records(records: bytes, broker_name: str) -> list[MessageExt]:
    """Every record in ``records`` (back to back, as the broker stored them)."""
    out: list[MessageExt] = []
    pos, end = 0, len(records)
    unpack = HEADER.unpack_from
    while pos < end:
        (total, _magic, _crc, queue_id, flag, queue_offset, phy, _sys, born, stored, host,
         reconsume, _tx, body_len) = unpack(records, pos)
        t0, t1, p0, p1 = split_tail(records, pos, total, body_len)
        props = decode_properties(records[p0:p1])
        keys = props.get(_KEYS)
        offset_id = offset_msg_id(host, phy)
        out.append(
            MessageExt(
                topic=records[t0:t1].decode(),
                queue_id=queue_id,
                broker_name=broker_name,
                queue_offset=queue_offset,
                msg_id=props.get(_UNIQ, offset_id),
                offset_msg_id=offset_id,
                commit_log_offset=phy,
                body=records[pos + HEADER_SIZE : pos + HEADER_SIZE + body_len],
                tags=props.get(_TAGS),
                keys=tuple(keys.split(MessageConst.KEY_SEPARATOR)) if keys else (),
                properties=props,
                born_timestamp=born,
                store_timestamp=stored,
                reconsume_times=reconsume,
                store_size=total,
                flag=flag,
            )
        )
        pos += total
    return out
