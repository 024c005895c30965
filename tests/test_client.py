"""Client value objects and helpers, called directly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pymq_proto.record import MessageConst, decode_properties, encode_properties
from pyspark_pymq import Message, MessageQueue, Producer
from pyspark_pymq.client.message import encode_message_properties, new_uniq_key
from pyspark_pymq.client.producer import LatencyFaultTolerance


def test_message_validates_its_fields() -> None:
    m = Message("t", "text", tags="A", keys="k1", properties={"p": "v"}, delay_level=3)
    assert m.body == b"text" and m.keys == ("k1",)
    with pytest.raises(ValueError, match="topic"):
        Message("", b"x")
    with pytest.raises(TypeError, match="body must be bytes or str"):
        Message("t", 123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without spaces"):
        Message("t", b"x", keys=["a b"])
    with pytest.raises(ValueError, match="delay_level"):
        Message("t", b"x", delay_level=-1)
    with pytest.raises(TypeError, match="str to str"):
        Message("t", b"x", properties={"n": 1})  # type: ignore[dict-item]
    # tags, keys and the sharding key become properties: a separator would inject one
    # (TRAN_MSG=true: a half message nobody ends, never delivered; DELAY ...)
    for fields in ({"tags": "x\x02TRAN_MSG\x01true"}, {"keys": ["k\x01v"]},
                   {"sharding_key": "s\x02DELAY\x013"}):
        with pytest.raises(ValueError, match=r"reserved \\x01/\\x02"):
            Message("t", b"x", **fields)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sharding_key must be a string"):
        Message("t", b"x", sharding_key=7)  # type: ignore[arg-type]


def test_properties_over_rocketmqs_limit_are_refused_naming_the_message() -> None:
    from pyspark_pymq.client.codec import encode_records
    from pyspark_pymq.errors import MessageIllegalError

    ok = encode_properties({"k": "v" * 32_000})
    encode_records("t", [b"a"], [ok])
    with pytest.raises(MessageIllegalError, match=r"message 1 .* 70\d{3} bytes encoded, over .* 32767"):
        encode_records("t", [b"a", b"b"], [ok, encode_properties({"k": "v" * 70_000})])


def test_system_properties_are_encoded_the_rocketmq_way() -> None:
    m = Message("t", b"x", tags="A", keys=["k1", "k2"], delay_level=2, sharding_key="o-1",
                properties={"user": "1"})
    props = decode_properties(encode_message_properties(m, "UNIQ"))
    assert props == {
        "user": "1", MessageConst.PROPERTY_TAGS: "A", MessageConst.PROPERTY_KEYS: "k1 k2",
        MessageConst.PROPERTY_DELAY_TIME_LEVEL: "2", MessageConst.PROPERTY_SHARDING_KEY: "o-1",
        MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "UNIQ",
    }


def test_uniq_keys_are_unique_and_32_hex_digits() -> None:
    keys = {new_uniq_key() for _ in range(10_000)}
    assert len(keys) == 10_000
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)


# Two processes in PID namespaces of their own (containers, executor pods: both pid 1) that
# make msgIds in the same microsecond, each also forking a worker (as Spark's Python daemon)
_SAME_PID_SAME_MICROSECOND = """
import os, sys, time
os.getpid = lambda: 1
time.time_ns = lambda: 1_700_000_000_000_000_000
from pyspark_pymq.client.message import new_uniq_key, new_uniq_keys
made = [new_uniq_key() for _ in range(100)]
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.close(read)
    os.write(write, " ".join([new_uniq_key(), *new_uniq_keys(100)]).encode())
    os._exit(0)
os.close(write)
made += new_uniq_keys(100)  # the parent goes on from the counter the child inherited
with os.fdopen(read) as pipe:
    forked = pipe.read().split()
os.waitpid(child, 0)
print(" ".join(made), "|", " ".join(forked))
"""


def test_msg_ids_of_processes_with_the_same_pid_and_time_differ() -> None:
    # the msgId was pid + 0000 + time + a counter from 1: equal in such processes, and a
    # topic's dedup window then dropped the second message as a duplicate
    runs = [subprocess.run([sys.executable, "-c", _SAME_PID_SAME_MICROSECOND], capture_output=True,
                           text=True, check=True, env=os.environ).stdout.split("|") for _ in range(2)]
    made = [set(part.split()) for run in runs for part in run]  # two processes, two forked children
    assert [len(ids) for ids in made] == [200, 101, 200, 101]
    assert all(len(k) == 32 and int(k, 16) >= 0 and k.startswith("00000001") for k in set().union(*made))
    assert len(set().union(*made)) == 602  # no msgId twice (random bits and counter start)


def test_producer_rejects_bad_settings_by_name() -> None:
    with pytest.raises(ValueError, match="send_mode"):
        Producer("127.0.0.1:1", send_mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_times_when_send_failed"):
        Producer("127.0.0.1:1", retry_times_when_send_failed=-1)
    with pytest.raises(ValueError, match="endpoint"):
        Producer("nohost")


def test_bad_arguments_are_refused_naming_them_and_the_range() -> None:
    """Each was taken and failed later without its name: a negative timeout as "did not answer in
    time", a flag or an offset past the wire's int as struct's or protobuf's own error, a group of
    the wrong type as "bad argument type for built-in operation" (probe helper-92)."""
    from pyspark_pymq import Admin, PullConsumer

    with pytest.raises(ValueError, match=r"timeout_ms must be a number of milliseconds in 1\.\.2147483647, "
                                         r"got -5"):
        PullConsumer("127.0.0.1:1", "g", timeout_ms=-5)
    with pytest.raises(ValueError, match=r"timeout_ms must be a number .*, got '5'"):
        Admin("127.0.0.1:1", timeout_ms="5")  # type: ignore[arg-type]
    import numpy as np

    PullConsumer("127.0.0.1:1", "g", timeout_ms=2500.0)  # type: ignore[arg-type]  # as before the check
    Admin("127.0.0.1:1", timeout_ms=np.int64(2500))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Message flag must be an int in -2147483648\.\.2147483647, "
                                         r"got 'x'"):
        Message("t", b"x", flag="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Message flag must be an int in .*, got 1099511627776"):
        Message("t", b"x", flag=2**40)
    for group in (5, ""):
        with pytest.raises(ValueError, match=rf"producer_group must be a non-empty string, got {group!r}"):
            Producer("127.0.0.1:1", producer_group=group)  # type: ignore[arg-type]
    consumer = PullConsumer("127.0.0.1:1", "g")
    mq = MessageQueue("t", "broker-a", 0)
    with pytest.raises(ValueError, match=r"max_nums must be an int in 1\.\.2147483647, got 1099511627776"):
        consumer.pull(mq, 0, 2**40)
    with pytest.raises(ValueError, match=r"offset for .* must be an int in 0\.\.9223372036854775807, "
                                         r"got 9223372036854775808"):
        consumer.commit(mq, 2**63)
    with Admin("127.0.0.1:1") as admin, PullConsumer("127.0.0.1:1", "g") as used:  # as Producer's
        assert admin.endpoint == "127.0.0.1:1" and used.group == "g"


def test_fault_tolerance_avoids_a_failed_broker_for_a_while() -> None:
    ft = LatencyFaultTolerance(not_available_s=60)
    assert ft.is_available("b")
    ft.update("b", True)
    assert not ft.is_available("b")
    ft.update("b", False)
    assert ft.is_available("b")


def test_message_queue_identity_includes_the_broker() -> None:
    assert MessageQueue("t", "a", 0) != MessageQueue("t", "b", 0)
    assert str(MessageQueue("t", "a", 1)) == "t@a#1"


def test_package_import_is_lazy_and_never_raises() -> None:
    import importlib

    import pyspark_pymq

    importlib.reload(pyspark_pymq)
    assert "Producer" in dir(pyspark_pymq)
    with pytest.raises(AttributeError):
        _ = pyspark_pymq.NoSuchThing  # type: ignore[attr-defined]


ROOT = Path(__file__).resolve().parent.parent
_HEAP_PROBE = r"""
import ctypes, os, sys
from pyspark_pymq import Producer
Producer("127.0.0.1:1")  # opening its backend tunes malloc, once per process
buf = bytearray(4 << 20)
addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        print("heap" if lo <= addr < hi else "mapped")
        break
else:
    print("mapped")
"""


@pytest.mark.parametrize("setting,where", [("1", "heap"), ("0", "mapped")])
def test_clients_keep_multi_megabyte_buffers_in_the_heap(setting: str, where: str) -> None:
    """glibc maps a 4 MiB buffer anew each time by default (page faults per request); a pymq client
    process raises the threshold, unless PYMQ_TUNE_MALLOC=0."""
    env = {**os.environ, "PYMQ_TUNE_MALLOC": setting}
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / d) for d in ("proto", "connector"))
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[-1] == where


@pytest.mark.parametrize("char", ["e", "é", "错"])
def test_a_copy_to_retry_cuts_a_reason_by_bytes_not_characters(char: str) -> None:
    """Next to large properties, a reason is cut to the room left; a multi-byte one as much as
    an ASCII one (cutting characters for bytes dropped it whole)."""
    from pyspark_pymq.client.consumer import _MAX_COPY_PROPERTIES, _copy_properties
    from pyspark_pymq.client.message import MessageExt

    message = MessageExt(topic="t", queue_id=0, broker_name="broker-a", queue_offset=0, msg_id="AB" * 16,
                         offset_msg_id="CD" * 16, commit_log_offset=1, body=b"x", tags=None, keys=(),
                         properties={"blob": "p" * 31_000}, born_timestamp=0, store_timestamp=0,
                         reconsume_times=0)
    system = {"RETRY_TOPIC": "t", "RECONSUME_TIME": "1", "MAX_RECONSUME_TIMES": "16", "DELAY": "3"}
    encoded = _copy_properties(message, {"CONSUME_FAILURE_REASON": char * 10_000}, system, "AB" * 16)
    reason = decode_properties(encoded)["CONSUME_FAILURE_REASON"]
    assert set(reason) == {char}
    # the room is used, all but part of one character
    assert _MAX_COPY_PROPERTIES - len(char.encode()) < len(encoded) <= _MAX_COPY_PROPERTIES


def test_user_properties_leave_out_rocketmqs_system_properties() -> None:
    """RocketMQ's STRING_HASH_SET (a delayed message's TIMER_DELIVER_MS, __BORNHOST...) and the v2
    trace context are no user's; a dead letter resent with them kept its stale delivery time."""
    from pyspark_pymq.client.message import MessageExt

    system = {"TIMER_DELIVER_MS": "1", "TRACE_CONTEXT": "00-abc-def-01", "__BORNHOST": "1.2.3.4:5",
              "TIMER_DELAY_MS": "5", "DLQ_ORIGIN_TOPIC": "t", "TAGS": "a", "UNIQ_KEY": "AB" * 16}
    message = MessageExt(topic="t", queue_id=0, broker_name="broker-a", queue_offset=0, msg_id="AB" * 16,
                         offset_msg_id="CD" * 16, commit_log_offset=1, body=b"x", tags="a", keys=(),
                         properties={**system, "p": "v"}, born_timestamp=0, store_timestamp=0,
                         reconsume_times=0)
    assert message.user_properties == {"p": "v"}
