"""A SendMessageRequest with a pre-encoded batch, serialized without protobuf copying the batch.

Setting ``encoded.records`` on a protobuf message and serializing it copies the
records twice into freshly allocated memory: 4 ms for a 3.3 MB batch of 10,000
records here, 0.4 µs per row in the Spark sink's Python workers. The protobuf
wire format of a length-delimited field is its key, a varint length and the bytes,
so the request is the small fields serialized by protobuf, then field
``encoded`` written here around the records: one copy. The bytes are exactly
what ``SerializeToString`` makes of the same request (fields in number order,
``encoded`` last), so the broker parses them as any other request.
"""

from __future__ import annotations

from dataclasses import dataclass

from .v1 import pymq_pb2

__all__ = ["SerializedRequest", "encode_send_request", "serialize_request"]

_LEN = 2  # wire type of length-delimited fields
_ENCODED = pymq_pb2.SendMessageRequest.DESCRIPTOR.fields_by_name["encoded"].number
_RECORDS = pymq_pb2.EncodedBatch.DESCRIPTOR.fields_by_name["records"].number
_SIZES = pymq_pb2.EncodedBatch.DESCRIPTOR.fields_by_name["sizes"].number


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, length: int) -> bytes:
    """The key and length that open a length-delimited field of ``length`` bytes."""
    return _varint(number << 3 | _LEN) + _varint(length)


@dataclass(frozen=True, slots=True)
class SerializedRequest:
    """A request already in wire format (what gRPC sends); see :func:`serialize_request`."""

    wire: bytes


def encode_send_request(
    head: pymq_pb2.SendMessageRequest, records: bytes | memoryview, sizes: bytes
) -> SerializedRequest:
    """``head`` (which must not carry ``encoded``) with ``encoded = EncodedBatch(records, sizes)``."""
    if head.HasField("encoded"):
        raise ValueError("head already carries an encoded batch")
    parts: list[bytes | memoryview] = [head.SerializeToString()]
    inner = 0
    if records:
        records_key = _field(_RECORDS, len(records))
        inner += len(records_key) + len(records)
    if sizes:
        sizes_key = _field(_SIZES, len(sizes))
        inner += len(sizes_key) + len(sizes)
    parts.append(_field(_ENCODED, inner))
    if records:
        parts += (records_key, records)
    if sizes:
        parts += (sizes_key, sizes)
    return SerializedRequest(b"".join(parts))


def serialize_request(request: object) -> bytes:
    """gRPC's request serializer for RPCs that take either a message or a :class:`SerializedRequest`."""
    if isinstance(request, SerializedRequest):
        return request.wire
    return request.SerializeToString()  # type: ignore[attr-defined,no-any-return]
