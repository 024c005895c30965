"""RocketMQ's remoting protocol in pure Python: framing, connections, and the client calls.

Two parts:

* framing and connection handling against a tiny fake server on loopback (no JVM):
  round trips of both header forms, frames split across TCP reads, answers out of order,
  time-outs, closed and refused connections, broker-initiated requests, fork safety, and
  request signing checked against values RocketMQ's Java ``AclClientRPCHook`` computed;
* every ``MQClientAPI`` / name server call against a real RocketMQ 5.3.3 cluster (the
  session fixture ``rocketmq_cluster``: one name server, brokers ``broker-a`` and
  ``broker-b``, short delay levels).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import random
import select
import socket
import ssl
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from pyspark_pymq.client.message import MessageQueue, PullStatus, SendStatus
from pyspark_pymq.errors import (
    BrokerUnavailableError,
    NoPermissionError,
    PymqError,
    RequestTimeoutError,
    TopicNotExistError,
)
from pyspark_pymq.rocketmq.api import ConsumerData, MQClientAPI, java_string_hash
from pyspark_pymq.rocketmq.protocol import (
    FLAG_ONEWAY,
    SERIALIZE_ROCKETMQ,
    FrameTemplate,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    loads_fastjson,
)
from pyspark_pymq.rocketmq.remoting import (
    DIRECT_BODY,
    AclClientRPCHook,
    RemotingClient,
    SessionCredentials,
    _Connection,
    parse_address,
    sign_request,
)
from pyspark_pymq.rocketmq.route import NameServerClient, RouteCache, TopicRouteData, parse_namesrv_addr
from pyspark_pymq.tls import TlsConfig
from tls_certs import Certificates, make_certificates

# ---------------------------------------------------------------------------------------------
# a fake server on loopback, driven step by step by the test


class FakeServer:
    """Accepts connections on 127.0.0.1; the test reads requests and writes answers itself."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._accepted: queue.Queue[socket.socket] = queue.Queue()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            self._accepted.put(conn)

    def accept(self, timeout: float = 5.0) -> socket.socket:
        return self._accepted.get(timeout=timeout)

    def no_new_connection(self, wait: float = 0.2) -> bool:
        try:
            self._accepted.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    @staticmethod
    def read_frame(conn: socket.socket) -> RemotingCommand:
        conn.settimeout(5.0)
        head = _recv(conn, 4)
        (length,) = struct.unpack(">i", head)
        return RemotingCommand.decode(head + _recv(conn, length))

    def close(self) -> None:
        self.listener.close()
        for c in self._conns:
            c.close()


def _recv(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise EOFError("the client closed the connection")
        out += chunk
    return bytes(out)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture
def client() -> Iterator[RemotingClient]:
    c = RemotingClient()
    yield c
    c.close()


def _answer(request: RemotingCommand, code: int = 0, **ext: str) -> bytes:
    return RemotingCommand.response(code, request.opaque, ext_fields=ext).encode()


# ---------------------------------------------------------------------------------------------
# framing


def test_json_frame_round_trip_and_header_content() -> None:
    cmd = RemotingCommand.request(
        RequestCode.PULL_MESSAGE, {"topic": "T", "queueId": "3", "ünï": "cødé"}, b"\x00\x01body"
    )
    cmd.opaque = 42
    frame = cmd.encode()
    length, type_len = struct.unpack_from(">ii", frame)
    assert length == len(frame) - 4
    assert type_len >> 24 == 0  # JSON
    header = json.loads(frame[8 : 8 + (type_len & 0xFFFFFF)])
    assert header["code"] == 11 and header["opaque"] == 42 and header["flag"] == 0
    assert header["language"] == "PYTHON" and header["version"] == 479
    assert header["extFields"] == {"topic": "T", "queueId": "3", "ünï": "cødé"}
    assert frame.endswith(b"\x00\x01body")

    back = RemotingCommand.decode(frame)
    assert (back.code, back.opaque, back.flag, back.language) == (11, 42, 0, "PYTHON")
    assert back.ext_fields == cmd.ext_fields and back.body == b"\x00\x01body" and back.remark is None


def test_frame_template_builds_the_frames_of_the_encoded_command() -> None:
    # the template's frame is the command's own encoding, byte for byte, whatever the values
    ext = {
        "consumerGroup": 'g-%d-"q"-é', "topic": "T%", "queueId": "3", "queueOffset": "0",
        "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0", "subscription": "*",
    }
    pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)
    template = FrameTemplate(pull, ["maxMsgNums", "queueOffset"])  # not in the header's order
    for opaque, nums, offset in ((1, 32, 0), (2**31 - 1, 7, 123_456_789_012), (42, 1, -1)):
        cmd = RemotingCommand.request(
            RequestCode.PULL_MESSAGE, {**ext, "queueOffset": str(offset), "maxMsgNums": str(nums)}
        )
        cmd.opaque = opaque
        assert template.frame(opaque, nums, offset) == cmd.encode()
    back = RemotingCommand.decode(template.frame(9, 5, 77))
    assert back.opaque == 9 and back.ext_fields == {**ext, "queueOffset": "77", "maxMsgNums": "5"}
    with pytest.raises(ValueError, match="not ext fields"):
        FrameTemplate(RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), ["queueOfset"])
    binary = RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)
    binary.serialize_type = SERIALIZE_ROCKETMQ
    with pytest.raises(ValueError, match="JSON"):
        FrameTemplate(binary, ["queueOffset"])


def test_binary_header_round_trip_and_java_layout() -> None:
    resp = RemotingCommand.response(ResponseCode.PULL_NOT_FOUND, 7, "no msg", {"nextBeginOffset": "12"})
    resp.serialize_type = SERIALIZE_ROCKETMQ
    back = RemotingCommand.decode(resp.encode())
    assert back.serialize_type == SERIALIZE_ROCKETMQ
    assert (back.code, back.opaque, back.flag, back.remark) == (19, 7, 1, "no msg")
    assert back.ext_fields == {"nextBeginOffset": "12"} and back.body == b""

    # RocketMQSerializable.rocketMQProtocolEncode, written out by hand: code short, language
    # byte (JAVA 0), version short, opaque int, flag int, remark (int length, 0 = null),
    # extFields (int length; per entry short key length + key, int value length + value)
    fields = struct.pack(">h", 6) + b"offset" + struct.pack(">i", 2) + b"17"
    header = struct.pack(">hbhiii", 0, 0, 479, 9, 1, 0) + struct.pack(">i", len(fields)) + fields
    frame = struct.pack(">ii", 4 + len(header) + 3, (1 << 24) | len(header)) + header + b"abc"
    java = RemotingCommand.decode(frame)
    assert (java.code, java.language, java.version, java.opaque, java.flag) == (0, "JAVA", 479, 9, 1)
    assert java.remark is None and java.ext_fields == {"offset": "17"} and java.body == b"abc"


# The header of a PULL_MESSAGE answer from a RocketMQ 5.3.3 broker started with
# ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ (it answers in the form its JVM is set to, whatever the
# request's form): PULL_OFFSET_MOVED, remark OFFSET_OVERFLOW_BADLY, the pull response header.
REAL_BINARY_HEADER = bytes.fromhex(
    "00150001df0000000400000001000000154f46465345545f4f564552464c4f575f4241444c5900000077"
    "001473756767657374576869636842726f6b657249640000000130000f6e657874426567696e4f666673"
    "6574000000013200096d696e4f6666736574000000013000096d61784f66667365740000000132000c74"
    "6f706963537973466c61670000000130000c67726f7570537973466c61670000000130"
)


def test_binary_header_from_a_real_broker() -> None:
    frame = struct.pack(">ii", 4 + len(REAL_BINARY_HEADER), (1 << 24) | len(REAL_BINARY_HEADER))
    cmd = RemotingCommand.decode(frame + REAL_BINARY_HEADER)
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (21, "JAVA", 479, 4, 1)
    assert cmd.remark == "OFFSET_OVERFLOW_BADLY"
    assert cmd.ext_fields == {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": "2",
        "minOffset": "0",
        "maxOffset": "2",
        "topicSysFlag": "0",
        "groupSysFlag": "0",
    }


def test_decode_refuses_a_bad_frame() -> None:
    frame = RemotingCommand.request(30, {"topic": "T"}).encode()
    with pytest.raises(ValueError, match="length"):
        RemotingCommand.decode(frame[:-1])
    with pytest.raises(ValueError, match="serialize type"):
        RemotingCommand.decode(frame[:4] + bytes([7]) + frame[5:])


def test_fastjson_maps_with_number_and_object_keys() -> None:
    # a name server's route for clients older than 4.9.4: HashMap<Long,String> keys unquoted
    route = TopicRouteData.from_json(
        "T",
        b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
        b'"brokerName":"b","cluster":"c"}],"queueDatas":[{"brokerName":"b","perm":6,'
        b'"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":3}]}',
    )
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.1:10921"}
    assert route.master_addrs() == {"b": "127.0.0.1:10911"}
    assert [q.queue_id for q in route.publish_queues()] == [0, 1, 2]
    assert [q.queue_id for q in route.subscribe_queues()] == [0, 1]
    # GET_TOPIC_STATS_INFO: a Map<MessageQueue, TopicOffset>, object keys
    doc = loads_fastjson(
        '{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:{"maxOffset":5,"minOffset":2}},'
        '"topicPutTps":0.0}'
    )
    [(key, value)] = doc["offsetTable"].items()
    assert dict(key) == {"brokerName": "b", "queueId": 1, "topic": "T"} and value["maxOffset"] == 5
    assert loads_fastjson(b'{"s":"a\\"b\\u00e9","n":[-1.5e2,true,null]}') == {
        "s": 'a"bé',
        "n": [-150.0, True, None],
    }
    with pytest.raises(ValueError, match="fastjson"):
        loads_fastjson(b"{0:")


def test_addresses_are_checked() -> None:
    assert parse_address("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert parse_address("[::1]:9876") == ("::1", 9876)
    assert parse_namesrv_addr("127.0.0.1:9876; 127.0.0.1:9877;") == ("127.0.0.1:9876", "127.0.0.1:9877")
    for bad in ("", "127.0.0.1", "127.0.0.1:0", "host:port", "127.0.0.1:9876,127.0.0.1:9877", None):
        with pytest.raises(ValueError, match="namesrvAddr") as err:
            parse_namesrv_addr(bad)
        assert repr(bad) in str(err.value)


def test_request_signature_matches_rocketmq_java() -> None:
    # Signatures printed by RocketMQ 5.3.3's AclClientRPCHook for the same requests.
    pull = RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "group",
            "topic": "topic",
            "queueId": "1",
            "queueOffset": "2",
            "maxMsgNums": "32",
            "sysFlag": "0",
            "commitOffset": "0",
            "suspendTimeoutMillis": "15000",
            "subVersion": "0",
        },
        "body-é".encode(),
    )
    AclClientRPCHook(SessionCredentials("ak", "sk", "tok")).do_before_request("127.0.0.1:1", pull)
    assert pull.ext_fields["AccessKey"] == "ak" and pull.ext_fields["SecurityToken"] == "tok"
    assert pull.ext_fields["Signature"] == "bILaAvFp5V6CuUPAWzWwKdcSLRY="
    bare = RemotingCommand.request(RequestCode.GET_MAX_OFFSET)
    AclClientRPCHook(SessionCredentials("rocketmq2", "12345678")).do_before_request("127.0.0.1:1", bare)
    assert bare.ext_fields == {"AccessKey": "rocketmq2", "Signature": "Ou1T58RIcyZWaTIwzkhJZWn/Zvs="}
    assert "12345678" not in repr(SessionCredentials("rocketmq2", "12345678"))


def test_tag_codes_are_java_hash_codes() -> None:
    # String.hashCode values: int32 overflow and UTF-16 surrogate pairs as in Java
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00


# ---------------------------------------------------------------------------------------------
# connections against the fake server


def test_frame_split_across_reads(server: FakeServer, client: RemotingClient) -> None:
    small = client.invoke_async(server.addr, RemotingCommand.request(30, {"topic": "T"}), 5)
    conn = server.accept()
    req = server.read_frame(conn)
    frame = RemotingCommand.response(0, req.opaque, ext_fields={"offset": "99"}, body=b"xyz").encode()
    for i in range(len(frame)):  # one byte per TCP write
        conn.sendall(frame[i : i + 1])
        time.sleep(0.001)
    answer = small.result(5)
    assert answer.ext_fields == {"offset": "99"} and answer.body == b"xyz"

    # a large body (read straight into its own buffer) arriving in uneven pieces
    body = os.urandom(3 * DIRECT_BODY + 17)
    big = client.invoke_async(server.addr, RemotingCommand.request(11), 5)
    req = server.read_frame(conn)
    frame = RemotingCommand.response(0, req.opaque, body=body).encode()
    for start, stop in ((0, 5), (5, 300), (300, 70_000), (70_000, len(frame))):
        conn.sendall(frame[start:stop])
        time.sleep(0.01)
    assert big.result(5).body == body


def test_frames_of_every_size_in_random_pieces(server: FakeServer, client: RemotingClient) -> None:
    # Small frames copied out of the read buffer, large ones read into their own, partial
    # frames moved to the buffer's start: every body must come out intact and in order.
    rng = random.Random(7)
    sizes = [rng.choice((0, 1, 100, 5_000, DIRECT_BODY - 1, DIRECT_BODY, 300_000)) for _ in range(60)]
    futures = [client.invoke_async(server.addr, RemotingCommand.request(11), 10) for _ in sizes]
    conn = server.accept()
    requests = [server.read_frame(conn) for _ in sizes]
    bodies = [rng.randbytes(n) for n in sizes]
    stream = b"".join(
        RemotingCommand.response(0, r.opaque, body=b).encode() for r, b in zip(requests, bodies, strict=True)
    )
    pos = 0
    while pos < len(stream):
        step = rng.choice((1, 7, 4096, 65_536, 700_000))
        conn.sendall(stream[pos : pos + step])
        pos += step
    assert [bytes(f.result(10).body) for f in futures] == bodies


def test_answers_out_of_order_are_matched_by_opaque(server: FakeServer, client: RemotingClient) -> None:
    futures = [
        client.invoke_async(server.addr, RemotingCommand.request(30, {"queueId": str(i)}), 5)
        for i in range(5)
    ]
    conn = server.accept()
    requests = [server.read_frame(conn) for _ in futures]
    assert len({r.opaque for r in requests}) == 5
    # all answers in one write, last request first
    conn.sendall(b"".join(_answer(r, offset=r.ext_fields["queueId"]) for r in reversed(requests)))
    assert [f.result(5).ext_fields["offset"] for f in futures] == ["0", "1", "2", "3", "4"]
    assert server.no_new_connection()  # all five went over one connection


def test_timeout_names_the_address_and_the_request(server: FakeServer, client: RemotingClient) -> None:
    start = time.monotonic()
    with pytest.raises(RequestTimeoutError, match=rf"{server.addr} did not answer GET_MAX_OFFSET.*0.3 s"):
        client.invoke_sync(server.addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET), 0.3)
    assert time.monotonic() - start < 1.0
    late = client.invoke_async(server.addr, RemotingCommand.request(RequestCode.PULL_MESSAGE), 0.3)
    with pytest.raises(RequestTimeoutError, match="PULL_MESSAGE"):
        late.result(2)
    # the connection stays usable; late answers to timed-out requests are dropped
    conn = server.accept()
    late_requests = [server.read_frame(conn), server.read_frame(conn)]
    conn.sendall(b"".join(_answer(r) for r in late_requests))
    ok = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    conn.sendall(_answer(server.read_frame(conn), offset="1"))
    assert ok.result(5).ext_fields == {"offset": "1"}


def test_closed_connection_fails_pending_requests_and_reconnects(
    server: FakeServer, client: RemotingClient
) -> None:
    futures = [client.invoke_async(server.addr, RemotingCommand.request(11), 5) for _ in range(3)]
    conn = server.accept()
    server.read_frame(conn)
    conn.close()
    for f in futures:
        with pytest.raises(
            BrokerUnavailableError, match=rf"connection to {server.addr} closed.*PULL_MESSAGE"
        ):
            f.result(5)
    # the next request opens a new connection
    again = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    conn2 = server.accept()
    conn2.sendall(_answer(server.read_frame(conn2), offset="5"))
    assert again.result(5).ext_fields == {"offset": "5"}


def _stalled_request(server: FakeServer) -> RemotingCommand:
    """A request larger than loopback's socket buffers, to a server that reads nothing of it."""
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"})
    request.body = bytes(48 * 1024 * 1024)
    return request


@pytest.mark.timeout(30)  # a write that waits for the stalled peer hangs: fail, not hang
def test_a_broker_that_stops_reading_fails_the_write_within_the_time_out(
    server: FakeServer, client: RemotingClient
) -> None:
    t0 = time.monotonic()
    stalled = client.invoke_async(server.addr, _stalled_request(server), 0.5)
    conn = server.accept()  # accepted, never read
    # whichever comes first: the time-out of the answer, or the write's own; either names both
    with pytest.raises((RequestTimeoutError, BrokerUnavailableError)) as info:
        stalled.result(5)
    assert server.addr in str(info.value) and "SEND_MESSAGE" in str(info.value), info.value
    assert time.monotonic() - t0 < 3
    # the half-written connection was closed; the next request gets a new one
    again = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    conn2 = server.accept()
    conn2.sendall(_answer(server.read_frame(conn2), offset="7"))
    assert again.result(5).ext_fields == {"offset": "7"}
    conn.close()


@pytest.mark.timeout(30)  # a write that waits for the stalled peer hangs: fail, not hang
def test_requests_behind_a_stalled_write_time_out_and_close_does_not_wait_for_it(
    server: FakeServer, client: RemotingClient
) -> None:
    writer = threading.Thread(
        target=lambda: client.invoke_async(server.addr, _stalled_request(server), 60), daemon=True
    )
    writer.start()
    server.accept()
    time.sleep(0.3)  # the writer is inside its write, holding the connection
    t0 = time.monotonic()
    # "could not send ... within" (or the sweeper's "did not answer ... within", whichever is first)
    with pytest.raises(RequestTimeoutError, match=r"GET_MAX_OFFSET .*within 0\.3 s"):
        client.invoke_sync(server.addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET), 0.3)
    with pytest.raises(RequestTimeoutError, match="PULL_MESSAGE"):
        client.invoke_oneway(server.addr, RemotingCommand.request(RequestCode.PULL_MESSAGE), 0.3)
    assert time.monotonic() - t0 < 2
    t1 = time.monotonic()
    client.close()  # fails the stuck write instead of waiting a minute for it
    writer.join(5)
    assert not writer.is_alive()
    assert time.monotonic() - t1 < 2


@pytest.mark.timeout(30)
def test_a_peer_reading_a_little_at_a_time_cannot_stretch_a_write_past_its_time_out(
    server: FakeServer, client: RemotingClient
) -> None:
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:  # 64 KiB every 50 ms: ~1.3 MB/s
        with contextlib.suppress(OSError):
            while not stop.is_set() and conn.recv(64 * 1024):
                time.sleep(0.05)

    t0 = time.monotonic()
    stalled = client.invoke_async(server.addr, _stalled_request(server), 0.5)
    threading.Thread(target=trickle, args=(server.accept(),), daemon=True).start()
    with pytest.raises((RequestTimeoutError, BrokerUnavailableError), match="SEND_MESSAGE"):
        stalled.result(5)
    stop.set()
    assert time.monotonic() - t0 < 1.5  # the write alone took ~36 s before


@pytest.mark.timeout(30)
def test_no_request_is_written_after_a_half_written_one(
    server: FakeServer, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that times out half-way marks the connection before it lets go of it: a request
    waiting to write behind it is refused, never appended to the broken frame (which the peer
    would take as the rest of the first request's body)."""
    closing = _Connection.close

    def descheduled_close(conn: _Connection, reason: str) -> None:
        time.sleep(1.0)  # the thread that should close is held up: others run meanwhile
        closing(conn, reason)

    monkeypatch.setattr(_Connection, "close", descheduled_close)
    first: list[Future[RemotingCommand]] = []
    second: list[Future[RemotingCommand]] = []
    second_request = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"marker": "SECOND-REQUEST"})
    writers = [
        threading.Thread(target=lambda: first.append(
            client.invoke_async(server.addr, _stalled_request(server), 0.5)), daemon=True),
        threading.Thread(target=lambda: second.append(
            client.invoke_async(server.addr, second_request, 10)), daemon=True),
    ]
    received = bytearray()

    def drain(conn: socket.socket) -> None:
        conn.settimeout(5)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(1 << 20):
                received.extend(chunk)

    t0 = time.monotonic()
    writers[0].start()
    conn = server.accept()
    time.sleep(0.2)  # the first is inside its write
    writers[1].start()  # waits for the connection behind it
    time.sleep(max(0.0, t0 + 0.8 - time.monotonic()))  # the first timed out; its close is held up
    drainer = threading.Thread(target=drain, args=(conn,), daemon=True)
    drainer.start()  # the peer reads again: whatever is written now reaches it
    for w in writers:
        w.join(10)
    drainer.join(10)
    with pytest.raises((RequestTimeoutError, BrokerUnavailableError), match="SEND_MESSAGE"):
        first[0].result(5)
    with pytest.raises(BrokerUnavailableError, match="GET_MAX_OFFSET"):
        second[0].result(5)
    assert 0 < len(received) < len(_stalled_request(server).encode())  # the first, in part
    assert b"SECOND-REQUEST" not in received


def test_refused_connection_names_the_address(client: RemotingClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        with pytest.raises(BrokerUnavailableError, match=rf"cannot connect to {addr}"):
            client.invoke_sync(addr, RemotingCommand.request(30), 2)
        with pytest.raises(BrokerUnavailableError, match=addr):
            client.invoke_async(addr, RemotingCommand.request(30), 2).result(2)
        with pytest.raises(BrokerUnavailableError, match=addr):
            client.invoke_oneway(addr, RemotingCommand.request(30))


def test_oneway_requests_are_flagged(server: FakeServer, client: RemotingClient) -> None:
    client.invoke_oneway(server.addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"a": "b"}))
    req = server.read_frame(server.accept())
    assert req.is_oneway and not req.is_response and req.ext_fields == {"a": "b"}


def _connected_with_handler(
    server: FakeServer, client: RemotingClient, code: int, handler: Callable[[str, RemotingCommand], Any]
) -> socket.socket:
    """The server's side of a connection the client opened, ``handler`` serving ``code`` on it."""
    client.register_processor(code, handler)
    first = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    conn = server.accept()
    conn.sendall(_answer(server.read_frame(conn)))
    first.result(5)
    return conn


def test_broker_requests_go_to_their_handler(server: FakeServer, client: RemotingClient) -> None:
    seen: list[tuple[str, RemotingCommand]] = []

    def check_state(addr: str, request: RemotingCommand) -> RemotingCommand:
        seen.append((addr, request))
        return RemotingCommand.response(0, 0, ext_fields={"commitOrRollback": "8"})

    conn = _connected_with_handler(server, client, RequestCode.CHECK_TRANSACTION_STATE, check_state)

    check = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"msgId": "M"})
    check.opaque = 1000
    unknown = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO)
    unknown.opaque = 1001
    ignored = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED)
    ignored.opaque, ignored.flag = 1002, 2  # one-way: never answered
    conn.sendall(ignored.encode() + check.encode() + unknown.encode())
    answers = {r.opaque: r for r in (server.read_frame(conn), server.read_frame(conn))}
    assert answers[1000].is_response and answers[1000].ext_fields == {"commitOrRollback": "8"}
    assert answers[1001].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert seen[0][0] == server.addr and seen[0][1].ext_fields == {"msgId": "M"}


def test_a_failing_handler_of_a_one_way_request_is_logged(
    server: FakeServer, client: RemotingClient, caplog: pytest.LogCaptureFixture
) -> None:
    # a one-way request's failure has no answer to travel in: the log is where it shows
    def check_state(addr: str, request: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("no such transaction here")

    conn = _connected_with_handler(server, client, RequestCode.CHECK_TRANSACTION_STATE, check_state)
    check = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {"msgId": "M"})
    check.opaque, check.flag = 1000, 2  # one-way, as the broker sends it
    with caplog.at_level(logging.ERROR, logger="pyspark_pymq.rocketmq.remoting"):
        conn.sendall(check.encode())
        deadline = time.monotonic() + 5
        while "no such transaction here" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    assert f"request code {RequestCode.CHECK_TRANSACTION_STATE} from {server.addr} failed" in caplog.text
    assert "no such transaction here" in caplog.text


def test_rpc_hook_signs_every_request(server: FakeServer) -> None:
    with RemotingClient(rpc_hook=AclClientRPCHook(SessionCredentials("ak", "sk"))) as signing:
        signing.invoke_async(server.addr, RemotingCommand.request(30, {"topic": "T"}), 5)
        req = server.read_frame(server.accept())
    assert req.ext_fields["AccessKey"] == "ak" and req.ext_fields["topic"] == "T"
    assert len(req.ext_fields["Signature"]) == 28  # base64 of 20 bytes of HmacSHA1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_opens_its_own_connection(server: FakeServer, client: RemotingClient) -> None:
    first = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    parent_conn = server.accept()
    parent_conn.sendall(_answer(server.read_frame(parent_conn)))
    first.result(5)

    pid = os.fork()
    if pid == 0:  # the child: its request must not go over the parent's socket
        code = 3
        try:
            code = 0 if client.invoke_sync(server.addr, RemotingCommand.request(30), 5).code == 0 else 1
        finally:
            os._exit(code)
    child_conn = server.accept()
    child_conn.sendall(_answer(server.read_frame(child_conn)))
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # the parent's connection survived the child's exit
    again = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    parent_conn.sendall(_answer(server.read_frame(parent_conn), offset="7"))
    assert again.result(5).ext_fields == {"offset": "7"}


class _TlsServer:
    """A TLS remoting server on loopback (asyncio, one thread): answers every request with its
    opaque and a 3000-byte body, and pushes a oneway broker request every half millisecond."""

    def __init__(self, certs: Certificates) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certs.server_cert, certs.server_key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        assert started.wait(5)

    def _run(self, started: threading.Event) -> None:
        async def main() -> None:
            server = await asyncio.start_server(self._serve, sock=self.listener, ssl=self.context)
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                server.close()

        # close() cancels every task: each connection's coroutine ends here, in its loop, not
        # later in the garbage collector (which reported it in whatever test ran then)
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(main())
        async def end_the_rest() -> None:
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        self.loop.run_until_complete(end_the_rest())
        self.loop.close()
        self.stopped.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def push() -> None:
            notify = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"group": "g" * 100})
            notify.flag |= FLAG_ONEWAY
            while True:
                writer.write(notify.encode())
                await asyncio.sleep(0.0005)

        pusher = asyncio.ensure_future(push())
        try:
            while True:
                head = await reader.readexactly(4)
                (length,) = struct.unpack(">i", head)
                request = RemotingCommand.decode(head + await reader.readexactly(length))
                got = {"len": str(len(request.body)), "crc": str(zlib.crc32(request.body))}
                answer = RemotingCommand.response(0, request.opaque, ext_fields=got, body=b"z" * 3000)
                writer.write(answer.encode())
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as err:  # a record that does not decrypt: what the client got wrong
            self.errors.append(repr(err))
        finally:
            pusher.cancel()
            writer.close()

    def close(self) -> None:
        def cancel_all() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)
        assert self.stopped.wait(5)
        self.listener.close()


def test_a_tls_connection_serves_many_threads_while_the_server_pushes(tmp_path: Any) -> None:
    # One SSL object must never be in SSL_read (the reader thread) and SSL_write (a caller) at
    # once: with an ssl.SSLSocket shared that way, a few rounds in ten lost their connection
    # ("EOF occurred in violation of protocol", "bad record mac" on the server) or their answers.
    certs = make_certificates(tmp_path)
    server = _TlsServer(certs)
    try:
        for round_ in range(12):
            client = RemotingClient(tls=TlsConfig(certs.ca))
            failures: list[str] = []

            def ask(client: RemotingClient = client, failures: list[str] = failures) -> None:
                try:
                    for _ in range(30):
                        answer = client.invoke_sync(
                            server.addr, RemotingCommand.request(105, {"topic": "T"}, body=b"b" * 2000), 5
                        )
                        assert answer.code == 0 and answer.body == b"z" * 3000
                except Exception as err:
                    failures.append(repr(err))

            callers = [threading.Thread(target=ask) for _ in range(6)]
            for t in callers:
                t.start()
            for t in callers:
                t.join()
            big = os.urandom(3 * 1024 * 1024 + 17)  # encrypted and sent in slices
            answer = client.invoke_sync(server.addr, RemotingCommand.request(310, body=big), 10)
            assert answer.ext_fields == {"len": str(len(big)), "crc": str(zlib.crc32(big))}
            client.close()
            assert not failures, f"round {round_}: {failures[0]}"
        assert not server.errors, server.errors[0]
    finally:
        server.close()


def test_a_tls_handshake_without_answer_fails_within_the_connect_time_out(
    server: FakeServer, tmp_path: Any
) -> None:
    certs = make_certificates(tmp_path)
    t0 = time.monotonic()
    expected = r"TLS handshake with .* failed: no answer to the TLS handshake within 0\.5 s"
    with (RemotingClient(tls=TlsConfig(certs.ca), connect_timeout_s=0.5) as tls_client,
          pytest.raises(BrokerUnavailableError, match=expected) as err):
        tls_client.invoke_sync(server.addr, RemotingCommand.request(105), 5)
    assert server.addr in str(err.value)
    assert time.monotonic() - t0 < 3


def test_name_servers_are_asked_in_turn_within_the_time_out(
    server: FakeServer, client: RemotingClient
) -> None:
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
        ns = NameServerClient(f"{dead_addr};{server.addr}", remoting=client, timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(BrokerUnavailableError) as err:
            ns.get_route_info("T")  # one refuses, the other (the fake) never answers
        assert time.monotonic() - start < 1.5
        assert dead_addr in str(err.value) and server.addr in str(err.value)
        assert "no name server answered GET_ROUTEINFO_BY_TOPIC of topic 'T'" in str(err.value)


# ---------------------------------------------------------------------------------------------
# pull windows: many PULL_MESSAGE of one queue in flight, answers to one waiter


def _pull_answer(
    request: RemotingCommand, got: int | None = None, *, code: int = 0, max_offset: int = 10_000,
    body: bytes | None = None, remark: str | None = None, binary: bool = False,
) -> bytes:
    """A broker's answer to a PULL_MESSAGE: ``got`` messages (all it asked for by default) from its
    offset; the body names the offset range, so that joined bodies show their order."""
    offset = int(request.ext_fields["queueOffset"])
    got = int(request.ext_fields["maxMsgNums"]) if got is None else got
    ext = {"suggestWhichBrokerId": "0", "nextBeginOffset": str(offset + got if code == 0 else offset),
           "minOffset": "0", "maxOffset": str(max_offset)}
    answer = RemotingCommand.response(code, request.opaque, remark, ext,
                                      body=f"[{offset}+{got}]".encode() if body is None else body)
    if binary:
        answer.serialize_type = SERIALIZE_ROCKETMQ
    return answer.encode()


def _nothing_to_read(conn: socket.socket, wait: float = 0.2) -> bool:
    return not select.select([conn], [], [], wait)[0]


class _Ranged(threading.Thread):
    """``MQClientAPI.pull_range`` on a thread of its own (it blocks until the range is read)."""

    def __init__(self, api: MQClientAPI, addr: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.call = lambda: api.pull_range(addr, "g", MessageQueue("T", "b", 0), *args, **kwargs)
        self.result: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as err:
            self.error = err

    def outcome(self, timeout: float = 5.0) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "pull_range did not return"
        if self.error is not None:
            raise self.error
        return self.result


def test_pull_range_slides_its_window_and_joins_answers_in_order(
    server: FakeServer, client: RemotingClient
) -> None:
    api = MQClientAPI(client)
    call = _Ranged(api, server.addr, 100, 29, 3, window=4, refill=2, timeout_s=5)
    conn = server.accept()
    requests = [server.read_frame(conn) for _ in range(4)]
    assert _nothing_to_read(conn)  # at most 4 in flight
    seen = list(requests)
    while requests:
        # two answered (the later one first): two more go out, in one write
        first, second, *requests = requests
        conn.sendall(_pull_answer(second) + _pull_answer(first))
        more = [server.read_frame(conn) for _ in range(min(2, 10 - len(seen)))]
        assert _nothing_to_read(conn, 0.05)
        seen += more
        requests += more
    got = call.outcome()
    assert [int(r.ext_fields["queueOffset"]) for r in seen] == list(range(100, 129, 3))
    assert [r.ext_fields["maxMsgNums"] for r in seen] == ["3"] * 9 + ["2"]
    assert {r.ext_fields["sysFlag"] for r in seen} == {"4"} and len({r.opaque for r in seen}) == 10
    assert (got.status, got.next_begin_offset, got.pulls, got.short) == (PullStatus.FOUND, 129, 10, None)
    assert got.message_binary == b"".join(f"[{o}+{min(3, 129 - o)}]".encode() for o in range(100, 129, 3))


def test_pull_range_ends_at_a_short_answer_and_drops_later_ones(
    server: FakeServer, client: RemotingClient
) -> None:
    api = MQClientAPI(client)
    call = _Ranged(api, server.addr, 0, 40, 8, window=8, timeout_s=5)
    conn = server.accept()
    requests = [server.read_frame(conn) for _ in range(5)]
    # the third comes back short while the queue holds more (a broker's cap): the range ends there
    answers = [_pull_answer(r, 5 if i == 2 else None) for i, r in enumerate(requests)]
    conn.sendall(b"".join(reversed(answers)))
    got = call.outcome()
    assert (got.next_begin_offset, got.pulls, got.short, got.max_offset) == (21, 3, 5, 10_000)
    assert got.message_binary == b"[0+8][8+8][16+5]"
    # the connection stays usable
    ok = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    conn.sendall(_answer(server.read_frame(conn), offset="1"))
    assert ok.result(5).ext_fields == {"offset": "1"}

    # the queue's end is no cap: not short; a pull that finds nothing ends the range too
    call = _Ranged(api, server.addr, 0, 40, 8, window=8, timeout_s=5)
    requests = [server.read_frame(conn) for _ in range(5)]
    conn.sendall(_pull_answer(requests[0], max_offset=12) + _pull_answer(requests[1], 4, max_offset=12)
                 + _pull_answer(requests[2], code=ResponseCode.PULL_NOT_FOUND, max_offset=12))
    got = call.outcome()
    assert (got.status, got.next_begin_offset, got.pulls, got.short) == (PullStatus.FOUND, 12, 2, None)
    # nothing at the first pull: its status as it came
    call = _Ranged(api, server.addr, 12, 40, 8, window=8, timeout_s=5)
    requests = [server.read_frame(conn) for _ in range(5)]
    conn.sendall(_pull_answer(requests[0], code=ResponseCode.PULL_OFFSET_MOVED, max_offset=12))
    got = call.outcome()
    assert (got.status, got.next_begin_offset, got.message_binary) == (PullStatus.OFFSET_ILLEGAL, 12, b"")


def test_pull_range_errors_and_a_connection_reset(server: FakeServer, client: RemotingClient) -> None:
    api = MQClientAPI(client)
    # the first pull's error is raised, typed
    call = _Ranged(api, server.addr, 0, 64, 8, window=8, timeout_s=5)
    conn = server.accept()
    requests = [server.read_frame(conn) for _ in range(8)]
    conn.sendall(_pull_answer(requests[0], code=ResponseCode.TOPIC_NOT_EXIST, remark="topic[T] not exist"))
    with pytest.raises(TopicNotExistError, match=r"PULL_MESSAGE to .* TOPIC_NOT_EXIST: topic\[T\]"):
        call.outcome()
    # an error after answers that found messages ends the range there
    call = _Ranged(api, server.addr, 0, 64, 8, window=8, timeout_s=5)
    requests = [server.read_frame(conn) for _ in range(8)]
    conn.sendall(_pull_answer(requests[1], code=ResponseCode.SYSTEM_BUSY) + _pull_answer(requests[0]))
    got = call.outcome()
    assert (got.status, got.next_begin_offset, got.pulls) == (PullStatus.FOUND, 8, 1)

    # a reset mid-window: the answers before it are kept
    call = _Ranged(api, server.addr, 0, 64, 8, window=8, timeout_s=5)
    requests = [server.read_frame(conn) for _ in range(8)]
    conn.sendall(_pull_answer(requests[0]) + _pull_answer(requests[1]) + _pull_answer(requests[3]))
    time.sleep(0.1)
    conn.close()
    got = call.outcome()
    assert (got.next_begin_offset, got.pulls, got.message_binary) == (16, 2, b"[0+8][8+8]")
    # a reset before any answer fails the pull; the next one connects again
    call = _Ranged(api, server.addr, 16, 64, 8, window=8, timeout_s=5)
    conn2 = server.accept()
    server.read_frame(conn2)
    conn2.close()
    with pytest.raises(BrokerUnavailableError, match=rf"connection to {server.addr} closed.*PULL_MESSAGE"):
        call.outcome()
    call = _Ranged(api, server.addr, 16, 16, 8, window=8, timeout_s=5)
    conn3 = server.accept()
    conn3.sendall(b"".join(_pull_answer(server.read_frame(conn3)) for _ in range(2)))
    assert call.outcome().next_begin_offset == 32


def test_pull_range_times_out(server: FakeServer, client: RemotingClient) -> None:
    api = MQClientAPI(client)
    start = time.monotonic()
    call = _Ranged(api, server.addr, 0, 64, 8, window=8, timeout_s=0.3)
    with pytest.raises(RequestTimeoutError, match=rf"{server.addr} did not answer PULL_MESSAGE.*0.3 s"):
        call.outcome()
    assert time.monotonic() - start < 2.0
    # late answers are dropped; the connection stays usable
    conn = server.accept()
    conn.sendall(b"".join(_pull_answer(server.read_frame(conn)) for _ in range(8)))
    ok = client.invoke_async(server.addr, RemotingCommand.request(30), 5)
    conn.sendall(_answer(server.read_frame(conn), offset="2"))
    assert ok.result(5).ext_fields == {"offset": "2"}


def test_pull_range_takes_binary_headers_and_signs_each_request(server: FakeServer) -> None:
    credentials = SessionCredentials("ak", "sk")
    with RemotingClient(rpc_hook=AclClientRPCHook(credentials)) as signing:
        call = _Ranged(MQClientAPI(signing), server.addr, 5, 10, 4, window=8, timeout_s=5)
        conn = server.accept()
        requests = [server.read_frame(conn) for _ in range(3)]
        # a broker set to RocketMQ's binary headers answers in them
        conn.sendall(b"".join(_pull_answer(r, binary=True) for r in requests))
        got = call.outcome()
    assert (got.next_begin_offset, got.message_binary) == (15, b"[5+4][9+4][13+2]")
    assert [r.ext_fields["queueOffset"] for r in requests] == ["5", "9", "13"]
    for r in requests:  # each signed over its own fields
        assert r.ext_fields["AccessKey"] == "ak"
        assert r.ext_fields["Signature"] == sign_request(r.ext_fields, b"", "sk")


def test_backend_learns_the_per_pull_cap_and_probes_it_again(
    server: FakeServer, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark_pymq.backend import BackendConfig
    from pyspark_pymq.backend import rocketmq as backend_module

    backend = backend_module.RocketMQBackend(BackendConfig(None, server.addr))
    backend.api = MQClientAPI(client, timeout_s=5)
    monkeypatch.setattr(backend, "_addr", lambda mq: server.addr)
    conns: list[socket.socket] = []
    pulled: list[RemotingCommand] = []

    def serve(cap: int, at: int | None, short: int) -> None:
        """Answer what the pull sends: at most ``cap`` messages each, ``short`` at offset ``at``."""
        if not conns:
            conns.append(server.accept())
        conn = conns[0]
        while not _nothing_to_read(conn, 0.3):
            r = server.read_frame(conn)
            pulled.append(r)
            offset, asked = int(r.ext_fields["queueOffset"]), int(r.ext_fields["maxMsgNums"])
            conn.sendall(_pull_answer(r, short if offset == at else min(asked, cap), max_offset=1_000_000))

    def pull(offset: int, cap: int, at: int | None = None, short: int = 0) -> Any:
        pulled.clear()
        t = threading.Thread(target=serve, args=(cap, at, short), daemon=True)
        t.start()
        got = backend.pull("g", MessageQueue("T", "b", 0), offset, 100, timeout_s=5)
        t.join(5)
        return got

    def cap() -> int:
        return backend._pull_caps[server.addr][0]

    got = pull(0, 32)  # a single pull: the broker's cap shows
    assert (got.next_begin_offset, [p.ext_fields["maxMsgNums"] for p in pulled]) == (32, ["100"])
    assert cap() == 32
    got = pull(32, 32)  # then pulls of 32, all in flight at once
    assert got.next_begin_offset == 132 and got.message_count == 100
    assert [p.ext_fields["maxMsgNums"] for p in pulled] == ["32", "32", "32", "4"]
    # an answer cut at a consume queue file's end says nothing about the cap
    got = pull(299_990, 32, at=299_990, short=10)
    assert got.next_begin_offset == 300_000 and cap() == 32
    # a short answer elsewhere lowers it (a byte cap); a probe once it is old raises it again
    got = pull(0, 32, at=32, short=20)
    assert got.next_begin_offset == 52 and cap() == 20
    monkeypatch.setattr(backend_module, "PULL_CAP_TTL_S", 0.0)
    got = pull(52, 64)
    assert [p.ext_fields["maxMsgNums"] for p in pulled] == ["100"] and got.next_begin_offset == 116
    assert cap() == 64

# ---------------------------------------------------------------------------------------------
# against a real RocketMQ cluster


@pytest.fixture(scope="module")
def cluster(rocketmq_cluster: Any) -> Any:
    return rocketmq_cluster


@pytest.fixture(scope="module")
def remoting() -> Iterator[RemotingClient]:
    with RemotingClient() as c:
        yield c


@pytest.fixture(scope="module")
def api(remoting: RemotingClient) -> MQClientAPI:
    return MQClientAPI(remoting, timeout_s=5.0)


@pytest.fixture(scope="module")
def topic(cluster: Any) -> str:
    """A topic with 8 queues on both brokers; each test below uses queues of its own."""
    name = f"remoting-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, queues=8)
    return name


def codec_encode_batch(messages: Any) -> bytes:
    from pyspark_pymq.rocketmq.codec import encode_batch

    return encode_batch(messages)


def _decode(data: bytes | bytearray, broker_name: str) -> list[Any]:
    from pyspark_pymq.rocketmq.codec import decode_messages

    return list(decode_messages(bytes(data), broker_name))


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def test_route_of_a_topic_on_two_brokers(cluster: Any, remoting: RemotingClient, topic: str) -> None:
    ns = NameServerClient(cluster.namesrv_addr, remoting=remoting)
    data = ns.get_route_info(topic)
    assert [q.broker_name for q in data.queue_datas] == ["broker-a", "broker-b"]
    assert all((q.read_queue_nums, q.write_queue_nums, q.perm) == (8, 8, 6) for q in data.queue_datas)
    assert data.master_addrs() == cluster.broker_addrs
    route = RouteCache(ns).get(topic)
    assert route.publish_queues == route.subscribe_queues
    assert route.publish_queues[:2] == (
        MessageQueue(topic, "broker-a", 0),
        MessageQueue(topic, "broker-a", 1),
    )
    assert len(route.publish_queues) == 16 and route.endpoints == cluster.broker_addrs
    assert topic in ns.get_all_topics()


def test_route_cache_keeps_the_last_route_when_name_servers_go_away(
    cluster: Any, remoting: RemotingClient, topic: str
) -> None:
    ns = NameServerClient(cluster.namesrv_addr, remoting=remoting, timeout_s=1.0)
    routes = RouteCache(ns)
    before = routes.get(topic)
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        ns.addrs = (f"127.0.0.1:{dead.getsockname()[1]}",)
        assert routes.get(topic, refresh=True) is before
        assert routes.broker_addr(topic, "broker-b") == cluster.broker_addrs["broker-b"]
        with pytest.raises(BrokerUnavailableError, match="no name server answered"):
            RouteCache(ns).get(topic)


def test_unknown_topic_and_unreachable_name_server(cluster: Any, remoting: RemotingClient) -> None:
    ns = NameServerClient(cluster.namesrv_addr, remoting=remoting, timeout_s=2.0)
    with pytest.raises(TopicNotExistError, match="no-such-topic") as err:
        ns.get_route_info("no-such-topic")
    assert cluster.namesrv_addr in str(err.value) and err.value.code == "TOPIC_NOT_EXIST"
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]
        start = time.monotonic()
        with pytest.raises(BrokerUnavailableError) as unreachable:
            NameServerClient(";".join(addrs), remoting=remoting, timeout_s=2.0).get_route_info("T")
        assert time.monotonic() - start < 2.0
        assert all(addr in str(unreachable.value) for addr in addrs)


def test_send_sync_async_oneway_and_pull_back(cluster: Any, api: MQClientAPI, topic: str) -> None:
    addr = cluster.broker_addrs["broker-a"]
    mq = MessageQueue(topic, "broker-a", 0)
    sync = api.send_message(
        addr, mq, b"one", {"TAGS": "A", "KEYS": "k1 k2", "color": "red"}, producer_group="pg"
    )
    assert sync.status is SendStatus.SEND_OK and sync.message_queue == mq and sync.queue_offset == 0
    assert len(sync.msg_id) == 32 and len(sync.offset_msg_id) == 32
    fut: Future[Any] = api.send_message_async(addr, mq, b"two", {"TAGS": "B"}, producer_group="pg")
    assert fut.result(5).queue_offset == 1
    oneway_id = api.send_message_oneway(addr, mq, b"three", {}, producer_group="pg")
    _wait_for(lambda: api.get_max_offset(addr, mq) == 3, 5, "the one-way send")

    pulled = api.pull_message(addr, "pull-group", mq, 0, 32)
    assert pulled.status is PullStatus.FOUND and len(pulled.message_binary) > 0
    assert (pulled.next_begin_offset, pulled.min_offset, pulled.max_offset) == (3, 0, 3)
    msgs = _decode(pulled.message_binary, "broker-a")
    assert [m.body for m in msgs] == [b"one", b"two", b"three"]
    assert [m.queue_offset for m in msgs] == [0, 1, 2]
    assert msgs[0].msg_id == sync.msg_id and msgs[0].offset_msg_id == sync.offset_msg_id
    assert msgs[0].tags == "A" and msgs[0].keys == ("k1", "k2") and msgs[0].properties["color"] == "red"
    assert msgs[2].msg_id == oneway_id

    at_end = api.pull_message(addr, "pull-group", mq, 3, 32)
    assert at_end.status is PullStatus.NO_NEW_MSG and at_end.next_begin_offset == 3
    assert at_end.message_binary == b""
    past = api.pull_message(addr, "pull-group", mq, 10, 32)
    assert past.status is PullStatus.OFFSET_ILLEGAL and past.next_begin_offset == 3 == past.max_offset
    nothing = api.pull_message(addr, "pull-group", mq, 0, 32, sub_expression="Z")
    assert nothing.status is PullStatus.NO_MATCHED_MSG and nothing.next_begin_offset == 3
    only_b = api.pull_message(addr, "pull-group", mq, 0, 32, sub_expression="B || C")
    assert [m.body for m in _decode(only_b.message_binary, "broker-a")] == [b"two"]
    sql = api.pull_message(
        addr, "pull-group", mq, 0, 32, sub_expression="color = 'red'", expression_type="SQL92"
    )
    assert [m.body for m in _decode(sql.message_binary, "broker-a")] == [b"one"]
    two = api.pull_message_async(addr, "pull-group", mq, 1, 1).result(5)
    assert (two.status, two.next_begin_offset) == (PullStatus.FOUND, 2)


def test_pull_range_reads_a_queue_in_windows(cluster: Any, api: MQClientAPI, topic: str) -> None:
    addr = cluster.broker_addrs["broker-b"]
    mq = MessageQueue(topic, "broker-b", 4)
    body = codec_encode_batch((f"m{i}".encode(), 0, {"UNIQ_KEY": f"K{i:04d}"}) for i in range(300))
    api.send_batch_message(addr, mq, body, [f"K{i:04d}" for i in range(300)], producer_group="pg")
    _wait_for(lambda: api.get_max_offset(addr, mq) == 300, 5, "the batch")
    got = api.pull_range(addr, "range-group", mq, 10, 250, 7, window=5, refill=2)
    assert (got.status, got.next_begin_offset, got.max_offset, got.pulls) == (PullStatus.FOUND, 260, 300, 36)
    msgs = _decode(got.message_binary, "broker-b")
    assert [m.queue_offset for m in msgs] == list(range(10, 260))
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(10, 260)]
    tail = api.pull_range(addr, "range-group", mq, 290, 50, 16)  # the queue ends first
    assert (tail.next_begin_offset, tail.pulls, tail.short) == (300, 1, None)
    assert len(_decode(tail.message_binary, "broker-b")) == 10
    past = api.pull_range(addr, "range-group", mq, 300, 50, 16)
    assert (past.status, past.next_begin_offset, past.message_binary) == (PullStatus.NO_NEW_MSG, 300, b"")


def test_many_sends_in_flight(cluster: Any, api: MQClientAPI, topic: str) -> None:
    addr = cluster.broker_addrs["broker-b"]
    mq = MessageQueue(topic, "broker-b", 1)
    futures = [
        api.send_message_async(addr, mq, f"m{i}".encode(), {}, producer_group="pg") for i in range(500)
    ]
    offsets = sorted(f.result(10).queue_offset for f in futures)
    assert offsets == list(range(500))
    seen: list[bytes] = []
    offset = 0
    while offset < 500:
        r = api.pull_message(addr, "bulk", mq, offset, 32)
        seen += [m.body for m in _decode(r.message_binary, "broker-b")]
        offset = r.next_begin_offset
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(500))


def test_batch_send(cluster: Any, api: MQClientAPI, topic: str) -> None:
    from pyspark_pymq.rocketmq.codec import encode_batch

    addr = cluster.broker_addrs["broker-b"]
    mq = MessageQueue(topic, "broker-b", 2)
    ids = [uuid.uuid4().hex.upper() for _ in range(3)]
    body = encode_batch((f"b{i}".encode(), 0, {"UNIQ_KEY": ids[i], "TAGS": "T"}) for i in range(3))
    sent = api.send_batch_message(addr, mq, body, ids, producer_group="pg")
    assert sent.status is SendStatus.SEND_OK and sent.msg_ids == tuple(ids) and sent.queue_offset == 0
    assert len(sent.offset_msg_ids) == 3
    _wait_for(lambda: api.get_max_offset(addr, mq) == 3, 5, "the batch's consume queue entries")
    msgs = _decode(api.pull_message(addr, "batch", mq, 0, 32).message_binary, "broker-b")
    assert [(m.body, m.msg_id, m.tags) for m in msgs] == [(f"b{i}".encode(), ids[i], "T") for i in range(3)]
    assert [m.offset_msg_id for m in msgs] == list(sent.offset_msg_ids)


def test_messages_of_the_java_producer(cluster: Any, api: MQClientAPI, topic: str) -> None:
    from rocketmq_cluster import JavaMessage

    [java] = cluster.produce(
        topic, [JavaMessage(b"from java", tags="J", keys="jk", broker="broker-b", queue_id=3)]
    )
    mq = MessageQueue(topic, "broker-b", 3)
    pulled = api.pull_message(cluster.broker_addrs["broker-b"], "java", mq, java.queue_offset, 1)
    [m] = _decode(pulled.message_binary, "broker-b")
    assert (m.body, m.tags, m.keys) == (b"from java", "J", ("jk",))
    assert m.msg_id == java.msg_id and m.offset_msg_id == java.offset_msg_id


def test_consumer_offsets_round_trip(cluster: Any, api: MQClientAPI, topic: str) -> None:
    addr = cluster.broker_addrs["broker-a"]
    with_msgs, empty = MessageQueue(topic, "broker-a", 2), MessageQueue(topic, "broker-a", 3)
    api.send_message(addr, with_msgs, b"x", {}, producer_group="pg")
    _wait_for(lambda: api.get_max_offset(addr, with_msgs) == 1, 5, "the sent message")
    group = f"offsets-{uuid.uuid4().hex[:6]}"
    # Never committed: the broker answers 0 for a queue whose messages start at 0 and are in
    # memory, QUERY_NOT_FOUND (-1) for an empty queue, and -1 always when asked not to guess.
    assert api.query_consumer_offset(addr, group, with_msgs) == 0
    assert api.query_consumer_offset(addr, group, with_msgs, set_zero_if_not_found=False) == -1
    assert api.query_consumer_offset(addr, group, empty) == -1
    # A commit needs the group to exist on the broker: a pull or a heartbeat creates it
    # (autoCreateSubscriptionGroup); a query does not.
    with pytest.raises(PymqError, match=f"SUBSCRIPTION_GROUP_NOT_EXIST: Group {group} not exist") as err:
        api.update_consumer_offset(addr, group, with_msgs, 1)
    assert err.value.code == "SUBSCRIPTION_GROUP_NOT_EXIST"
    api.pull_message(addr, group, with_msgs, 0, 1)
    api.update_consumer_offset(addr, group, with_msgs, 1)
    assert api.query_consumer_offset(addr, group, with_msgs) == 1
    assert api.query_consumer_offset(addr, group, with_msgs, set_zero_if_not_found=False) == 1
    api.update_consumer_offset(addr, group, empty, 100)  # not checked against the queue's range
    assert api.query_consumer_offset(addr, group, empty) == 100
    api.update_consumer_offset_oneway(addr, group, empty, 7)
    _wait_for(lambda: api.query_consumer_offset(addr, group, empty) == 7, 5, "the one-way commit")


def test_max_min_and_search_offsets(cluster: Any, api: MQClientAPI, topic: str) -> None:
    addr = cluster.broker_addrs["broker-a"]
    mq = MessageQueue(topic, "broker-a", 4)
    assert (api.get_max_offset(addr, mq), api.get_min_offset(addr, mq)) == (0, 0)
    first = api.send_message(addr, mq, b"a", {}, producer_group="pg")
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    for body in (b"b", b"c"):
        api.send_message(addr, mq, body, {}, producer_group="pg")
    _wait_for(lambda: api.get_max_offset(addr, mq) == 3, 5, "the sent messages")
    assert (api.get_max_offset(addr, mq), api.get_min_offset(addr, mq)) == (3, 0)
    assert api.search_offset(addr, mq, 0) == 0
    assert api.search_offset(addr, mq, middle) == 1
    assert api.search_offset(addr, mq, middle + 3_600_000) == 3
    stored = _decode(api.pull_message(addr, "s", mq, 0, 1).message_binary, "broker-a")[0].store_timestamp
    assert api.get_earliest_msg_store_time(addr, mq) == stored
    assert first.queue_offset == 0
    stats = api.get_topic_stats_info(addr, topic)
    assert sorted(stats) == [MessageQueue(topic, "broker-a", i) for i in range(8)]
    assert (stats[mq].min_offset, stats[mq].max_offset) == (0, 3)


def test_heartbeat_registers_the_consumer_and_creates_its_retry_topic(
    cluster: Any, api: MQClientAPI, topic: str
) -> None:
    addr = cluster.broker_addrs["broker-b"]
    group = f"hb-{uuid.uuid4().hex[:6]}"
    with pytest.raises(TopicNotExistError, match=f"%RETRY%{group}"):
        api.get_topic_stats_info(addr, f"%RETRY%{group}")
    assert api.get_consumer_list_by_group(addr, group) == []
    consumer = ConsumerData.for_topics(group, {topic: "A || B"})
    assert [s.topic for s in consumer.subscriptions] == [topic, f"%RETRY%{group}"]
    assert api.heartbeat(addr, "pymq-test@1", [consumer], ["pg"]) > 0
    assert api.get_consumer_list_by_group(addr, group) == ["pymq-test@1"]
    retry = api.get_topic_stats_info(addr, f"%RETRY%{group}")
    assert list(retry) == [MessageQueue(f"%RETRY%{group}", "broker-b", 0)]
    api.unregister_client(addr, "pymq-test@1", consumer_group=group, producer_group="pg")
    assert api.get_consumer_list_by_group(addr, group) == []


def test_send_back_goes_through_the_schedule_topic_to_retry(
    cluster: Any, api: MQClientAPI, topic: str
) -> None:
    addr = cluster.broker_addrs["broker-a"]
    mq = MessageQueue(topic, "broker-a", 5)
    group = f"sb-{uuid.uuid4().hex[:6]}"
    api.heartbeat(addr, "pymq-test@2", [ConsumerData.for_topics(group, [topic])])
    api.send_message(addr, mq, b"fail me", {"TAGS": "F"}, producer_group="pg")
    # the send is acknowledged once in the commit log; the consume queue entry follows a moment later
    _wait_for(lambda: api.get_max_offset(addr, mq) == 1, 5, "the sent message")
    [msg] = _decode(api.pull_message(addr, group, mq, 0, 1).message_binary, "broker-a")

    level3 = MessageQueue("SCHEDULE_TOPIC_XXXX", "broker-a", 2)  # delay level 3 -> queue 2
    scheduled = api.get_max_offset(addr, level3)
    api.consumer_send_msg_back(
        addr, group, msg.commit_log_offset, 0, msg.msg_id, topic, 16, broker_name="broker-a"
    )
    # the broker has stored it; its consume queue entry follows a moment later
    _wait_for(lambda: api.get_max_offset(addr, level3) == scheduled + 1, 5, "the scheduled copy")

    retry_mq = MessageQueue(f"%RETRY%{group}", "broker-a", 0)
    _wait_for(lambda: api.get_max_offset(addr, retry_mq) == 1, 20, f"the message in %RETRY%{group}")
    [retried] = _decode(api.pull_message(addr, group, retry_mq, 0, 1).message_binary, "broker-a")
    assert retried.body == b"fail me" and retried.reconsume_times == 1
    assert retried.retry_topic == topic and retried.msg_id == msg.msg_id

    # at max reconsume times the broker writes to the dead letter queue at once
    dlq = MessageQueue(f"%DLQ%{group}", "broker-a", 0)
    api.consumer_send_msg_back(addr, group, retried.commit_log_offset, 0, retried.msg_id, topic, 1)
    _wait_for(lambda: api.get_max_offset(addr, dlq) == 1, 5, f"the message in %DLQ%{group}")
    [dead] = _decode(api.pull_message(addr, group, dlq, 0, 1).message_binary, "broker-a")
    assert dead.body == b"fail me" and dead.reconsume_times == 2


def test_broker_errors_are_typed_and_named(cluster: Any, api: MQClientAPI, topic: str) -> None:
    addr = cluster.broker_addrs["broker-a"]
    with pytest.raises(TopicNotExistError, match=rf"PULL_MESSAGE to {addr} failed with TOPIC_NOT_EXIST"):
        api.pull_message(addr, "g", MessageQueue("never-created-topic", "broker-a", 0), 0)
    with pytest.raises(NoPermissionError, match=rf"to {addr} failed with NO_PERMISSION"):
        api.send_message(
            addr, MessageQueue("SCHEDULE_TOPIC_XXXX", "broker-a", 0), b"x", {}, producer_group="pg"
        )
    # A topic's permission is checked on pull; a send to a read-only topic is stored all the
    # same (RocketMQ's producers respect the route's permission themselves).
    write_only, read_only = f"{topic}-wo", f"{topic}-ro"
    cluster.create_topic(write_only, queues=1, brokers=["broker-a"], perm=2)
    cluster.create_topic(read_only, queues=1, brokers=["broker-a"], perm=4)
    with pytest.raises(NoPermissionError, match="pulling message is forbidden"):
        api.pull_message(addr, "g", MessageQueue(write_only, "broker-a", 0), 0)
    sent = api.send_message(addr, MessageQueue(read_only, "broker-a", 0), b"x", {}, producer_group="pg")
    assert sent.status is SendStatus.SEND_OK
    route = NameServerClient(cluster.namesrv_addr, remoting=api.remoting).get_route_info(read_only)
    assert route.publish_queues() == () and len(route.subscribe_queues()) == 1


def test_a_subscription_of_blanks_around_a_star_reaches_the_broker_as_star(server: FakeServer) -> None:
    # RocketMQ's FilterAPI trims each tag, not the expression: " * " would be the tag "*",
    # which no message has, while the backend's own checks read it as "every message"
    from pyspark_pymq.backend.base import BackendConfig
    from pyspark_pymq.backend.rocketmq import RocketMQBackend
    from pyspark_pymq.client.message import MessageQueue

    backend = RocketMQBackend(BackendConfig(namesrv_addr="127.0.0.1:9"), timeout_s=2)
    backend._addr = lambda mq: server.addr  # type: ignore[method-assign]
    sent: list[str] = []

    def answer() -> None:
        conn = server.accept()
        for _ in range(2):
            req = server.read_frame(conn)
            sent.append(req.ext_fields["subscription"])
            conn.sendall(_answer(req, ResponseCode.PULL_NOT_FOUND, nextBeginOffset="0", minOffset="0",
                                 maxOffset="0", suggestWhichBrokerId="0"))

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        for blank in (" * ", "  "):
            backend.pull("g", MessageQueue("T", "broker-a", 0), 0, 32, subscription=blank)
    finally:
        t.join(5)
    assert sent == ["*", "*"]


def test_a_new_connection_has_a_new_id(server: FakeServer, client: RemotingClient) -> None:
    # what a broker ties to a connection (a producer group's registration for check-backs) is
    # registered again when the id changes: a reconnect must never look like the same one
    ids = []
    for _ in range(20):
        client._connection(server.addr, 1.0)
        ids.append(client.connection_id(server.addr))
        server.accept().close()  # the broker drops it
        deadline = time.monotonic() + 2
        while client.connection_id(server.addr) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # its reader thread ends and the old object is freed: id() is reused
    assert None not in ids and len(set(ids)) == len(ids)


def test_callers_of_an_address_that_does_not_answer_wait_their_own_time_out_once() -> None:
    # a listener whose accept queue is full drops further SYNs: connecting there hangs
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.3)
    addr = f"127.0.0.1:{port}"
    client = RemotingClient()
    took: list[float] = []

    def call() -> None:
        t0 = time.monotonic()
        with pytest.raises(BrokerUnavailableError, match=addr):
            client.invoke_sync(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {}), timeout_s=1.0)
        took.append(time.monotonic() - t0)

    try:
        threads = [threading.Thread(target=call) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # each within its own 1 s (they used to queue behind each other's attempts: 1, 2 ... 5 s)
        assert len(took) == 5 and max(took) < 1.8, took
        # and right after a failed attempt, requests fail at once rather than try again each
        t0 = time.monotonic()
        futures = [client.invoke_async(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {}), 1.0)
                   for _ in range(10)]
        assert time.monotonic() - t0 < 0.5
        for fut in futures:
            with pytest.raises(BrokerUnavailableError, match="an attempt just now"):
                fut.result(timeout=1)
    finally:
        client.close()
        for s in (*fillers, listener):
            s.close()


def test_a_static_topic_is_refused_by_name(server: FakeServer, client: RemotingClient) -> None:
    # a static topic's queue ids are logical ones across brokers (RocketMQ 5's
    # topicQueueMappingByBroker): read as plain queues, rows would be read twice or never
    route = (b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"b","cluster":"c"}],'
             b'"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":2,"topicSysFlag":0,'
             b'"writeQueueNums":2}]')
    static = route + b',"topicQueueMappingByBroker":{"b":{"topic":"T","totalQueues":4,"bname":"b"}}}'
    ns = NameServerClient(server.addr, remoting=client, timeout_s=2.0)

    def answer() -> None:
        conn = server.accept()
        for body in (route + b"}", static):
            req = server.read_frame(conn)
            conn.sendall(RemotingCommand.response(0, req.opaque, body=body).encode())

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    assert [q.queue_id for q in ns.get_route_info("T").subscribe_queues()] == [0, 1]
    with pytest.raises(PymqError, match="topic 'T' is a static topic") as err:
        ns.get_route_info("T")
    assert err.value.code == "NOT_SUPPORTED"
    t.join(5)


@pytest.mark.parametrize("registered", [False, True])
def test_a_name_server_that_knows_no_broker_yet_is_not_taken_for_a_missing_topic(
    server: FakeServer, client: RemotingClient, registered: bool
) -> None:
    """A name server that just restarted answers TOPIC_NOT_EXIST until the brokers' next heartbeat
    (30 s): a running producer dropped its route and failed every send with "Create it", where
    RocketMQ's keeps its route (probe helper-93). With no broker registered the answer is
    transient (the route cache keeps its route); with brokers, the topic is missing."""
    import json

    ns = NameServerClient(server.addr, remoting=client, timeout_s=2.0)
    brokers = {"broker-a": {"brokerAddrs": {"0": "127.0.0.1:10911"}}} if registered else {}

    def answer() -> None:
        conn = server.accept()
        req = server.read_frame(conn)
        assert req.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
        conn.sendall(RemotingCommand.response(ResponseCode.TOPIC_NOT_EXIST, req.opaque).encode())
        req = server.read_frame(conn)
        assert req.code == RequestCode.GET_BROKER_CLUSTER_INFO
        body = json.dumps({"brokerAddrTable": brokers, "clusterAddrTable": {}}).encode()
        conn.sendall(RemotingCommand.response(0, req.opaque, body=body).encode())

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    expected = (TopicNotExistError, r"topic 'orders' does not exist") if registered else (
        BrokerUnavailableError, r"has no broker registered \(restarted\? brokers register again")
    with pytest.raises(expected[0], match=expected[1]):
        ns.get_route_info("orders")
    t.join(5)


def test_a_missing_topic_costs_one_round_trip_on_a_name_server_just_seen_with_brokers(
    server: FakeServer, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every TOPIC_NOT_EXIST was followed by a GET_BROKER_CLUSTER_INFO, to tell a missing topic from a
    name server that just restarted and knows no broker yet: a stream asking, at every trigger, a
    route that is there and one that is not (a deleted topic, a %RETRY% topic without retries yet)
    paid two round trips for the second. A name server that showed a broker over the connection
    open now, a moment ago, has not restarted: its answer stands. Over a new connection (a restart
    closes them), or after BROKERS_SEEN_TTL_S, it is asked again."""
    ns = NameServerClient(server.addr, remoting=client, timeout_s=2.0)
    asked: list[tuple[int, int]] = []  # (connection, request code)
    conns: list[socket.socket] = []
    route = {"queueDatas": [{"brokerName": "broker-a", "readQueueNums": 1, "writeQueueNums": 1,
                             "perm": 6, "topicSysFlag": 0}],
             "brokerDatas": [{"cluster": "c", "brokerName": "broker-a",
                              "brokerAddrs": {"0": "127.0.0.1:10911"}}]}
    cluster = {"brokerAddrTable": {"broker-a": {"brokerAddrs": {"0": "127.0.0.1:10911"}}},
               "clusterAddrTable": {"c": ["broker-a"]}}

    def serve() -> None:
        while True:
            try:
                conn = server.accept(timeout=30)
            except queue.Empty:
                return
            conns.append(conn)
            threading.Thread(target=answer, args=(conn, len(conns)), daemon=True).start()

    def answer(conn: socket.socket, number: int) -> None:
        with contextlib.suppress(Exception):  # until the connection closes
            while True:
                req = server.read_frame(conn)
                asked.append((number, req.code))
                if req.code == RequestCode.GET_BROKER_CLUSTER_INFO:
                    reply = RemotingCommand.response(0, req.opaque, body=json.dumps(cluster).encode())
                elif req.ext_fields.get("topic") == "orders":
                    reply = RemotingCommand.response(0, req.opaque, body=json.dumps(route).encode())
                else:
                    reply = RemotingCommand.response(ResponseCode.TOPIC_NOT_EXIST, req.opaque)
                conn.sendall(reply.encode())

    threading.Thread(target=serve, daemon=True).start()
    route_code, cluster_code = RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO
    assert [q.broker_name for q in ns.get_route_info("orders").subscribe_queues()] == ["broker-a"]
    for _ in range(2):  # two triggers
        with pytest.raises(TopicNotExistError, match="topic 'gone' does not exist"):
            ns.get_route_info("gone")
        ns.get_route_info("orders")
    assert asked == [(1, route_code)] * 5  # no GET_BROKER_CLUSTER_INFO

    # the name server restarts: the connection it showed brokers over is gone
    conns[0].shutdown(socket.SHUT_RDWR)
    deadline = time.monotonic() + 5
    while client.connection_id(server.addr) is not None:
        assert time.monotonic() < deadline, "the client did not see its connection close"
        time.sleep(0.02)
    asked.clear()
    with pytest.raises(TopicNotExistError, match="topic 'gone' does not exist"):
        ns.get_route_info("gone")
    assert asked == [(2, route_code), (2, cluster_code)]  # asked whether it knows a broker
    asked.clear()
    with pytest.raises(TopicNotExistError):  # its cluster info showed one, over this connection
        ns.get_route_info("gone")
    assert asked == [(2, route_code)]

    # a while later it is asked again (all brokers may have gone meanwhile)
    monkeypatch.setattr("pyspark_pymq.rocketmq.route.BROKERS_SEEN_TTL_S", 0.0)
    asked.clear()
    with pytest.raises(TopicNotExistError):
        ns.get_route_info("gone")
    assert asked == [(2, route_code), (2, cluster_code)]


def test_the_next_request_asks_another_name_server_than_one_that_knows_no_broker(
    server: FakeServer, client: RemotingClient
) -> None:
    """With several name servers, one just restarted was asked again and again (the client keeps
    to the one that answered) while another knew the route (review helper-94)."""
    import json

    other = FakeServer()
    ns = NameServerClient(f"{server.addr};{other.addr}", remoting=client, timeout_s=2.0)
    ns._index = 0  # the restarted one first (the client starts at a random one)

    def restarted() -> None:  # as long as it is asked: no route, no broker
        conn = server.accept()
        empty = json.dumps({"brokerAddrTable": {}, "clusterAddrTable": {}}).encode()
        with contextlib.suppress(Exception):  # the connection closes at the end
            while True:
                req = server.read_frame(conn)
                answer = (RemotingCommand.response(0, req.opaque, body=empty)
                          if req.code == RequestCode.GET_BROKER_CLUSTER_INFO
                          else RemotingCommand.response(ResponseCode.TOPIC_NOT_EXIST, req.opaque))
                conn.sendall(answer.encode())

    def knows() -> None:
        conn = other.accept()
        req = other.read_frame(conn)
        assert req.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
        route = {"queueDatas": [{"brokerName": "broker-a", "readQueueNums": 1, "writeQueueNums": 1,
                                 "perm": 6, "topicSysFlag": 0}],
                 "brokerDatas": [{"cluster": "c", "brokerName": "broker-a",
                                  "brokerAddrs": {"0": "127.0.0.1:10911"}}]}
        conn.sendall(RemotingCommand.response(0, req.opaque, body=json.dumps(route).encode()).encode())

    threads = [threading.Thread(target=f, daemon=True) for f in (restarted, knows)]
    for t in threads:
        t.start()
    try:
        with pytest.raises(BrokerUnavailableError, match="has no broker registered"):
            ns.get_route_info("orders")
        assert [q.broker_name for q in ns.get_route_info("orders").publish_queues()] == ["broker-a"]
    finally:
        other.close()
        server.close()
        for t in threads:
            t.join(5)


def test_a_broker_given_as_name_server_is_named_so(server: FakeServer, client: RemotingClient) -> None:
    """A broker's port as namesrvAddr answered "request type 105 not supported" alone (probe
    helper-93)."""
    ns = NameServerClient(server.addr, remoting=client, timeout_s=2.0)

    def answer() -> None:
        conn = server.accept()
        req = server.read_frame(conn)
        refused = RemotingCommand.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, req.opaque,
                                           remark=" request type 105 not supported")
        conn.sendall(refused.encode())

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    with pytest.raises(PymqError, match=r"request type 105 not supported\. Is 127\.0\.0\.1:\d+ a broker "
                                        r"\(port 10911\) rather than a name server \(port 9876\)\?"):
        ns.get_route_info("orders")
    t.join(5)


def test_name_servers_that_do_not_list_topics_say_which_setting(server: FakeServer,
                                                                client: RemotingClient) -> None:
    # NamesrvConfig.enableAllTopicList=false answers SYSTEM_ERROR "disable", and nothing more
    ns = NameServerClient(server.addr, remoting=client, timeout_s=2.0)

    def answer() -> None:
        conn = server.accept()
        req = server.read_frame(conn)
        assert req.code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
        disabled = RemotingCommand.response(ResponseCode.SYSTEM_ERROR, req.opaque, remark="disable")
        conn.sendall(disabled.encode())

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    with pytest.raises(PymqError, match=r"do not list their topics \(enableAllTopicList=false in "
                                        r"their configuration\)\. Set enableAllTopicList=true") as err:
        ns.get_all_topics()
    assert err.value.code == "NOT_SUPPORTED"
    t.join(5)


@pytest.mark.parametrize("remark", ["check signature failed.", "User:nobody is not found.",
                                    "username cannot be null."])
def test_a_refused_signature_says_which_options_hold_the_credentials(remark: str) -> None:
    """RocketMQ's authentication answers NO_PERMISSION with its own words only: the error named
    neither the options nor what to do. A refusal of a topic's ACL keeps its own words."""
    from pyspark_pymq.rocketmq.protocol import response_error

    err = response_error(RemotingCommand.response(ResponseCode.NO_PERMISSION, 1, remark=remark),
                         "127.0.0.1:10911", "GET_TOPIC_STATS_INFO of topic 'secure'")
    assert isinstance(err, NoPermissionError) and remark.rstrip(".") in str(err)
    assert "accessKey / secretKey" in str(err) and "access_key=" in str(err)
    denied = response_error(RemotingCommand.response(ResponseCode.NO_PERMISSION, 1,
                                                     remark="User:etl has no permission to Pub Topic:t"),
                            "127.0.0.1:10911", "SEND_MESSAGE_V2")
    assert "accessKey" not in str(denied) and "Get" not in str(denied)
    # a stream's bounds: RocketMQ authorizes them as Get, which its push consumer does not need
    # (the error said nothing of which action to grant: probe helper-93)
    bounds = response_error(RemotingCommand.response(
        ResponseCode.NO_PERMISSION, 1, remark="User:etl has no permission to access Topic:acltopic"),
        "127.0.0.1:10911", "GET_TOPIC_STATS_INFO of topic 'acltopic'")
    assert "grant the user Get on the topic and the group, besides Sub" in str(bounds)


def test_a_server_that_does_not_speak_remoting_is_named_so(
    server: FakeServer, client: RemotingClient
) -> None:
    """A web or dashboard port given as namesrvAddr: its HTTP answer read as a frame length gave
    "corrupt frame: length 1213486160"; the error says what the server is not, and what to check."""
    def answer_http() -> None:
        conn = server.accept()
        server.read_frame(conn)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer_http, daemon=True).start()
    with pytest.raises(BrokerUnavailableError, match=r"does not speak RocketMQ's remoting protocol "
                                                     r"\(it answered b'HTTP/1.1 400 Bad'\): is this"):
        client.invoke_sync(server.addr, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC), 3.0)
