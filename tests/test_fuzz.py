"""A bounded, seeded fuzz run of malformed requests against every RPC of a real broker.

Each unary RPC of ``pymq_proto.v1.Broker`` gets requests whose fields hold random and
hostile values (empty, huge and control-character strings, extreme integers, unknown enum
numbers, junk record images, nested messages), plus bytes that are not protobuf at all.
The broker must answer every one of them (any status but UNAVAILABLE: it stays up), must
not turn one into an unhandled error (gRPC's UNKNOWN), and after a restart every message
stored before the run must read back unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as ProtoMessage
from pymq_proto.v1 import pymq_pb2
from pyspark_pymq import Admin, Message, Producer, PullConsumer

SERVICE = pymq_pb2.DESCRIPTOR.services_by_name["Broker"]
KEEP_TOPIC = "fuzz-keep"
SEED = 20261123
REQUESTS_PER_RPC = 40

_STRINGS = [
    "", " ", "x" * 70_000, "\x00", "a\x01b\x02c", "%RETRY%", "%DLQ%", "%RETRY%g", "%DLQ%g",
    "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TBW102",
    "fuzz-other", "g", "../../etc/passwd", "a" * 256, "(((((((", "a > 1 AND", "TAGS IN ('a'",
    "é漢字", "*", "||", "-1", "9" * 30,
]
_INTS = [0, 1, -1, -2, -3, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 1024, 1025, 65_536]
_UINTS = [0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]


def _value(field: FieldDescriptor, rnd: random.Random, depth: int) -> Any:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return rnd.choice(_STRINGS)
    if t == FieldDescriptor.TYPE_BYTES:
        size = rnd.choice([0, 1, 7, 20, 64, 300, 5000])
        return rnd.randbytes(size)
    if t in (FieldDescriptor.TYPE_BOOL,):
        return rnd.random() < 0.5
    if t == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values] + [99, -5]
        return rnd.choice(numbers)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return rnd.choice([u for u in _UINTS if u < 2**32])
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return rnd.choice(_UINTS)
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return rnd.choice([i for i in _INTS if -(2**31) <= i < 2**31])
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return rnd.choice(_INTS)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rnd.choice([0.0, -1.0, 1e308, float("nan")])
    raise AssertionError(f"unhandled field type {t} of {field.full_name}")


def _fill(msg: ProtoMessage, rnd: random.Random, depth: int = 0) -> ProtoMessage:
    desc: Descriptor = msg.DESCRIPTOR
    for field in desc.fields:
        if rnd.random() < 0.25:
            continue  # left unset
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        repeated = field.is_repeated
        if is_map:
            target = getattr(msg, field.name)
            value_field = field.message_type.fields_by_name["value"]
            for _ in range(rnd.choice([0, 1, 3])):
                key = rnd.choice(_STRINGS[:20]) if field.message_type.fields_by_name["key"].type == \
                    FieldDescriptor.TYPE_STRING else rnd.choice([0, 1, -1])
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    if depth < 3:
                        _fill(target[key], rnd, depth + 1)
                else:
                    target[key] = _value(value_field, rnd, depth)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if repeated:
                for _ in range(rnd.choice([0, 1, 3])):
                    _fill(getattr(msg, field.name).add(), rnd, depth + 1)
            else:
                _fill(getattr(msg, field.name), rnd, depth + 1)
        elif repeated:
            getattr(msg, field.name).extend(_value(field, rnd, depth) for _ in range(rnd.choice([0, 1, 5])))
        else:
            setattr(msg, field.name, _value(field, rnd, depth))
    return msg


def _requests(rnd: random.Random, input_type: Descriptor) -> Iterator[tuple[bool, bytes]]:
    """(well-formed protobuf?, request bytes)."""
    cls = pymq_pb2.__dict__.get(input_type.name)
    assert cls is not None, input_type.full_name
    for i in range(REQUESTS_PER_RPC):
        if i % 10 == 9:  # not protobuf at all, or a truncated one
            yield False, rnd.randbytes(rnd.choice([1, 5, 50]))
        else:
            yield True, _fill(cls(), rnd).SerializeToString()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data").start()
    try:
        yield b
    finally:
        b.stop()


def _stored(endpoint: str) -> dict[int, list[tuple[int, bytes, str]]]:
    consumer = PullConsumer(endpoint, "fuzz-reader")
    out: dict[int, list[tuple[int, bytes, str]]] = {}
    for mq in consumer.queues(KEEP_TOPIC):
        offset, got = 0, []
        while True:
            r = consumer.pull(mq, offset, max_nums=64)
            if not r.messages:
                break
            got += [(m.queue_offset, m.body, m.msg_id) for m in r.messages]
            offset = r.next_begin_offset
        out[mq.queue_id] = got
    return out


def test_malformed_requests_to_every_rpc_leave_the_broker_serving_and_the_store_intact(
    broker: BrokerProcess,
) -> None:
    Admin(broker.endpoint).create_topic(KEEP_TOPIC, queues=4)
    producer = Producer(broker.endpoint)
    for i in range(200):
        producer.send(Message(KEEP_TOPIC, f"keep-{i}".encode() * (1 + i % 7), tags="T", keys=[f"k{i}"]))
    before = _stored(broker.endpoint)
    assert sum(len(v) for v in before.values()) == 200

    rnd = random.Random(SEED)
    unhandled: list[str] = []
    answered = 0
    with grpc.insecure_channel(broker.endpoint) as channel:
        for method in SERVICE.methods:
            if method.server_streaming or method.client_streaming:
                continue
            call = channel.unary_unary(f"/{SERVICE.full_name}/{method.name}",
                                       request_serializer=None, response_deserializer=None)
            for well_formed, request in _requests(rnd, method.input_type):
                try:
                    call(request, timeout=10)
                except grpc.RpcError as err:
                    code = err.code()
                    assert code is not grpc.StatusCode.UNAVAILABLE, (
                        f"the broker stopped answering at {method.name}: {err.details()}")
                    # Bytes that are not protobuf never reach a handler: gRPC's own
                    # deserializer refuses them (UNKNOWN). A well-formed request answered
                    # UNKNOWN is a handler's unhandled exception.
                    if code is grpc.StatusCode.DEADLINE_EXCEEDED or (
                            well_formed and code is grpc.StatusCode.UNKNOWN):
                        unhandled.append(f"{method.name}: {code.name} {str(err.details())[:200]}")
                answered += 1
    assert answered >= 20 * REQUESTS_PER_RPC
    assert not unhandled, "requests the broker did not handle:\n" + "\n".join(unhandled[:20])

    assert _stored(broker.endpoint) == before  # still serving, nothing changed
    broker.restart()
    assert _stored(broker.endpoint) == before  # and after a restart
