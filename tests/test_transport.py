"""The typed broker transport (client/transport.py) and errors that say whether to retry them.

Broker-facing tests run against a real broker process (the ``broker``
fixture); a frozen broker (SIGSTOP) stands for one that does not answer in time.
"""

from __future__ import annotations

import ast
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_proto.v1 import pymq_pb2
from pyspark_pymq import Admin, Message, Producer
from pyspark_pymq import errors as errors_module
from pyspark_pymq.client.message import SendStatus
from pyspark_pymq.client.transport import BrokerClient, ResponseStream, StreamRpc, UnaryRpc
from pyspark_pymq.errors import (
    AccessDeniedError,
    AuthenticationError,
    BrokerNotReadableError,
    BrokerUnavailableError,
    IllegalArgumentError,
    MessageIllegalError,
    NoPermissionError,
    OffsetIllegalError,
    PymqError,
    RequestTimeoutError,
    SubscriptionParseError,
    SystemBusyError,
    TlsRequiredError,
    TopicExistError,
    TopicNotExistError,
    error_for_code,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "connector" / "pyspark_pymq"
TRANSPORT = PACKAGE / "client" / "transport.py"


# -- retriable errors (unit) ---------------------------------------------------------------

# As RocketMQ's producer retries: connection failures and timeouts (RemotingException),
# SERVICE_NOT_AVAILABLE and SYSTEM_BUSY. TOPIC_NOT_EXIST and NO_PERMISSION, which RocketMQ
# also retries for stale name-server routes, are the topic's own state in pymq (see errors.py).
RETRIABLE = {
    PymqError: False,
    TopicNotExistError: False,
    TopicExistError: False,
    MessageIllegalError: False,
    NoPermissionError: False,
    SubscriptionParseError: False,
    SystemBusyError: True,
    IllegalArgumentError: False,
    OffsetIllegalError: False,
    BrokerUnavailableError: True,
    BrokerNotReadableError: True,  # a RocketMQ slave refusing pulls: read on once the master is back
    RequestTimeoutError: True,
    AccessDeniedError: False,
    AuthenticationError: False,
    TlsRequiredError: False,
}


def test_every_error_class_says_whether_a_retry_may_mend_it() -> None:
    exported = {
        obj for name in errors_module.__all__
        if isinstance(obj := getattr(errors_module, name), type) and issubclass(obj, PymqError)
    }
    assert exported == set(RETRIABLE), "classify every error class of errors.py here"
    for cls, retriable in RETRIABLE.items():
        assert cls.retriable is retriable, cls.__name__
        err = cls("x")
        assert err.retriable is retriable, cls.__name__
        # re-raised with a better message (as the Spark modules do): still the same answer
        assert type(err)(f"while doing y: {err.remark}", code=err.code).retriable is retriable


def test_broker_codes_become_errors_that_say_whether_to_retry() -> None:
    for code, retriable in [
        ("SYSTEM_BUSY", True), ("SERVICE_NOT_AVAILABLE", True), ("REQUEST_TIMEOUT", True),
        ("TOPIC_NOT_EXIST", False), ("NO_PERMISSION", False), ("MESSAGE_ILLEGAL", False),
        ("ILLEGAL_ARGUMENT", False), ("PULL_OFFSET_MOVED", False), ("SYSTEM_ERROR", False),
        ("SOME_FUTURE_CODE", False), ("FORBIDDEN", False), ("UNAUTHORIZED", False),
    ]:
        err = error_for_code(code, "remark")
        assert err.code == code and err.retriable is retriable, code


def test_rocketmq_flow_control_answers_are_retriable() -> None:
    from pyspark_pymq.rocketmq.protocol import RemotingCommand, ResponseCode, response_error

    for code in (ResponseCode.FLOW_CONTROL, ResponseCode.POLLING_FULL, ResponseCode.SYSTEM_BUSY):
        err = response_error(RemotingCommand.response(code, 1, "busy"), "10.0.0.1:10911", "SEND_MESSAGE")
        assert isinstance(err, SystemBusyError) and err.retriable
    err = response_error(RemotingCommand.response(ResponseCode.MESSAGE_ILLEGAL, 1, "big"), "a:1", "SEND")
    assert not err.retriable


def test_rocketmq_remarks_lose_their_faq_links_and_the_separator_before_them() -> None:
    from pyspark_pymq.rocketmq.protocol import RemotingCommand, ResponseCode, response_error

    url = "https://rocketmq.apache.org/docs/bestPractice/06FAQ"
    # FAQUrl.suggestTodo after a ", " as the pull and send processors write it; attachDefaultURL
    for remark in (
        f"subscription group [g1] does not exist, \nSee {url} for further details.",
        f"subscription group [g1] does not exist\nFor more information, please visit the url, {url}",
    ):
        err = response_error(RemotingCommand.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, 1, remark),
                             "a:1", "PULL_MESSAGE")
        assert str(err).endswith("PULL_MESSAGE to a:1 failed with SUBSCRIPTION_GROUP_NOT_EXIST: "
                                 "subscription group [g1] does not exist"), str(err)


def test_the_producer_has_no_list_of_retriable_classes() -> None:
    from pyspark_pymq.client import producer

    assert not hasattr(producer, "RETRYABLE")


# -- the transport (unit) --------------------------------------------------------------------


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_every_rpc_of_the_service_is_a_typed_attribute_of_the_client() -> None:
    client = BrokerClient("127.0.0.1:1")
    service = pymq_pb2.DESCRIPTOR.services_by_name["Broker"]
    assert len(service.methods) >= 23
    for method in service.methods:
        rpc = getattr(client, _snake(method.name))
        assert isinstance(rpc, StreamRpc if method.server_streaming else UnaryRpc), method.name
        assert rpc.name == method.name and rpc.endpoint == "127.0.0.1:1"
        if isinstance(rpc, UnaryRpc):
            assert rpc.timeout == client.timeout == 10.0


def test_client_survives_pickling_with_its_endpoint_and_timeout() -> None:
    client = pickle.loads(pickle.dumps(BrokerClient("127.0.0.1:1", timeout=2.5)))
    assert (client.endpoint, client.timeout, client.pull_message.timeout) == ("127.0.0.1:1", 2.5, 2.5)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_only_the_transport_imports_grpc() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == TRANSPORT:
            continue
        for name in _imports(path):
            if name == "grpc" or name.startswith("grpc.") or name.endswith("pymq_pb2_grpc"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "only client/transport.py may talk gRPC:\n" + "\n".join(offenders)
    assert "grpc" in _imports(TRANSPORT)


def test_connector_calls_rpcs_by_attribute_not_by_name() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"\.call(_future)?\(\s*\"[A-Z]", text), f"{path} calls an RPC by its name"


def test_mypy_knows_each_rpcs_request_and_response_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    snippet = tmp_path / "typed_calls.py"
    snippet.write_text(
        "from pymq_proto.v1 import pymq_pb2\n"
        "from pyspark_pymq.client.transport import BrokerClient\n"
        "client = BrokerClient('127.0.0.1:1')\n"
        "reveal_type(client.pull_message(pymq_pb2.PullMessageRequest()))\n"
        "reveal_type(client.send_message.future(pymq_pb2.SendMessageRequest(), then=lambda r: r.queue_id))\n"
        "client.send_message(pymq_pb2.PullMessageRequest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", str(snippet)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    ).stdout
    assert 'Revealed type is "pymq_proto.v1.pymq_pb2.PullMessageResponse"' in out, out
    assert re.search(r'Revealed type is "concurrent\.futures\._base\.Future\[(builtins\.)?int\]"', out), out
    assert re.search(r':6: error: .*incompatible type "PullMessageRequest"; '
                     r'expected "SendMessageRequest( \| SerializedRequest)?"', out), out


# -- the transport against a real broker ---------------------------------------------------------


@contextmanager
def frozen(broker: BrokerProcess, seconds: float | None = None) -> Iterator[None]:
    """The broker stopped (SIGSTOP): connected, but answering nothing, until the block ends
    (or, with ``seconds``, until that long after it began)."""
    os.kill(broker.pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, os.kill, (broker.pid, signal.SIGCONT)) if seconds else None
    if timer is not None:
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        os.kill(broker.pid, signal.SIGCONT)


def test_typed_calls_return_typed_answers_and_raise_pymq_errors(endpoint: str) -> None:
    client = BrokerClient(endpoint, timeout=5.0)
    made = client.create_topic(pymq_pb2.CreateTopicRequest(
        config=pymq_pb2.TopicConfig(topic_name="typed", read_queue_nums=2, write_queue_nums=2, perm=6)))
    assert isinstance(made, pymq_pb2.CreateTopicResponse) and made.config.topic_name == "typed"
    route = client.query_route(pymq_pb2.QueryRouteRequest(topic="typed"))
    assert isinstance(route, pymq_pb2.TopicRouteData) and route.topic == "typed"
    with pytest.raises(TopicNotExistError, match="nope") as info:
        client.topic_stats(pymq_pb2.TopicStatsRequest(topic="nope"))
    assert not isinstance(info.value, grpc.RpcError) and not info.value.retriable
    # a future holds the same error, or what ``then`` made of the answer
    fut = client.topic_stats.future(pymq_pb2.TopicStatsRequest(topic="nope"))
    assert isinstance(fut, Future)
    with pytest.raises(TopicNotExistError):
        fut.result(10)
    stats = pymq_pb2.TopicStatsRequest(topic="typed")
    queues = client.topic_stats.future(stats, then=lambda r: len(r.queues))
    assert queues.result(10) == 2

    def boom(resp: pymq_pb2.TopicStatsResponse) -> int:
        raise ValueError("bad answer")

    with pytest.raises(ValueError, match="bad answer"):
        client.topic_stats.future(stats, then=boom).result(10)


def test_unreachable_and_silent_brokers_raise_retriable_errors(broker: BrokerProcess) -> None:
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:1") as info:
        BrokerClient("127.0.0.1:1", timeout=5.0).broker_runtime_info(pymq_pb2.BrokerRuntimeInfoRequest())
    assert info.value.retriable
    client = BrokerClient(broker.endpoint, timeout=0.5)
    client.broker_runtime_info(pymq_pb2.BrokerRuntimeInfoRequest())  # connected
    with frozen(broker):
        with pytest.raises(RequestTimeoutError, match="BrokerRuntimeInfo") as timed_out:
            client.broker_runtime_info(pymq_pb2.BrokerRuntimeInfoRequest())
        assert timed_out.value.retriable
        with pytest.raises(RequestTimeoutError):
            client.broker_runtime_info.future(pymq_pb2.BrokerRuntimeInfoRequest(), 0.3).result(10)
    assert client.broker_runtime_info(pymq_pb2.BrokerRuntimeInfoRequest()).broker_name


def test_another_grpc_server_is_named_as_not_a_pymq_broker() -> None:
    """A RocketMQ 5 proxy serves gRPC on 8081 too: its UNIMPLEMENTED was a bare SYSTEM_ERROR."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(PymqError, match=rf"127\.0\.0\.1:{port} is a gRPC server without pymq's "
                                            r"ListTopics .*not a pymq broker") as info:
            Admin(f"127.0.0.1:{port}").topics()
        assert "namesrv_addr" in str(info.value) and not info.value.retriable
        assert info.value.code == "REQUEST_CODE_NOT_SUPPORTED"  # RocketMQ's code for an unknown request
    finally:
        server.stop(0)


class _NoChannelWait(BrokerProcess):
    """A broker process whose start does not warm the clients' shared channel (as a user's broker)."""

    def _wait_client_channel(self) -> None:
        pass


def test_a_broker_back_on_its_address_answers_the_first_call(tmp_path: Path) -> None:
    """The shared channel to a dead broker backs off its reconnects (up to 1 s); a call made in that
    window used to fail at once although the broker had come back. A dead broker still fails fast."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    admin = Admin(f"127.0.0.1:{port}")
    back = _NoChannelWait(tmp_path / "store", ["--port", str(port)])
    try:
        for attempt in range(3):
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:  # refused connects: the channel's backoff grows to 1 s
                started = time.monotonic()
                with pytest.raises(BrokerUnavailableError, match="Connection refused"):
                    admin.topics()
                assert time.monotonic() - started < 2.0, "a dead broker must fail fast"
                time.sleep(0.2)
            back.start()
            if attempt == 1:  # a call started with future() (an async send) waits for it too
                listed = admin._client.list_topics.future(pymq_pb2.ListTopicsRequest()).result(10)
                assert "held" in {t.topic_name for t in listed.topics}
            if attempt < 2:
                assert "topic" in admin.topics().columns  # at once, no BrokerUnavailableError
                admin.create_topic("held", queues=1)
            else:
                # once connected the call is sent and keeps its deadline: a long poll the broker holds
                # 4 s was cut at 3 s and reported as never sent (a send so cut was stored twice)
                started = time.monotonic()
                mq = pymq_pb2.MessageQueue(topic="held", broker_name="broker-a")
                request = pymq_pb2.PullMessageRequest(consumer_group="g", message_queue=mq, max_msg_nums=1,
                                                      suspend_timeout_ms=4000)
                held = admin._client.pull_message(request, timeout=15)
                assert held.status == pymq_pb2.NO_NEW_MSG and time.monotonic() - started > 3.5
            back.stop()
    finally:
        back.stop()


def test_a_cancelled_stream_ends_with_a_pymq_error(endpoint: str) -> None:
    stream = BrokerClient(endpoint).transaction_stream(pymq_pb2.TransactionStreamRequest(producer_group="g"))
    assert isinstance(stream, ResponseStream)
    failure: list[BaseException] = []

    def read() -> None:
        try:
            for _ in stream:
                pass
        except BaseException as err:
            failure.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)
    stream.cancel()
    reader.join(10)
    assert len(failure) == 1 and isinstance(failure[0], PymqError), failure
    assert not isinstance(failure[0], grpc.RpcError) and not failure[0].retriable


# -- the producer retries what says it is retriable (real broker) ----------------------------------


def test_producer_retries_a_timeout_and_the_send_succeeds(broker: BrokerProcess) -> None:
    ep = broker.endpoint
    Admin(ep).create_topic("slow", queues=1)
    once = Producer(ep, retry_times_when_send_failed=0, send_msg_timeout_ms=500)
    retrying = Producer(ep, retry_times_when_send_failed=2, send_msg_timeout_ms=800)
    for p in (once, retrying):
        p.send(Message("slow", b"warm"))  # route cached, channel connected
    with frozen(broker), pytest.raises(RequestTimeoutError, match="after 1 attempts"):
        once.send(Message("slow", b"x"))
    start = time.monotonic()
    with frozen(broker, seconds=1.0):
        result = retrying.send(Message("slow", b"y"))
        elapsed = time.monotonic() - start
    assert result.status == SendStatus.SEND_OK
    assert elapsed >= 0.8, "the first attempt timed out, the send came from a retry"


def test_async_producer_retries_a_timeout_when_told_to(broker: BrokerProcess) -> None:
    ep = broker.endpoint
    Admin(ep).create_topic("slow-async", queues=1)
    once = Producer(ep, send_mode="async", send_msg_timeout_ms=500)
    retrying = Producer(ep, send_mode="async", retry_times_when_send_async_failed=2, send_msg_timeout_ms=800)
    for p in (once, retrying):
        p.send(Message("slow-async", b"warm")).result(10)
    with frozen(broker):
        failed = once.send(Message("slow-async", b"x"))
        with pytest.raises(RequestTimeoutError):
            failed.result(10)
    with frozen(broker, seconds=1.0):
        sent = retrying.send(Message("slow-async", b"y"))
        assert sent.result(10).status == SendStatus.SEND_OK


def test_producer_does_not_retry_what_is_not_retriable(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = Admin(endpoint)
    admin.create_topic("gone", queues=1)
    producer = Producer(endpoint, retry_times_when_send_failed=2)
    producer.send(Message("gone", b"x"))  # the route stays cached
    admin.delete_topic("gone")
    with pytest.raises(TopicNotExistError) as info:
        producer.send(Message("gone", b"y"))
    assert "attempts" not in str(info.value), "TOPIC_NOT_EXIST was retried"
    # the decision is the error's: made retriable, the same answer is tried 3 times
    monkeypatch.setattr(TopicNotExistError, "retriable", True)
    with pytest.raises(TopicNotExistError, match=r"after 3 attempts"):
        producer.send(Message("gone", b"z"))


class _SilentProxy:
    """A TCP proxy to a broker whose open connections can go silent (a NAT or firewall that
    forgot them: bytes go nowhere, nothing is closed); new connections are forwarded."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.silent: list[threading.Event] = []
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            silent = threading.Event()
            self.silent.append(silent)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, silent), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, silent: threading.Event) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    return
                if not silent.is_set():
                    dst.sendall(data)
            except OSError:
                return

    def go_silent(self) -> None:
        for event in self.silent:
            event.set()

    def close(self) -> None:
        self.server.close()
        for s in self.sockets:
            s.close()


def test_a_connection_gone_silent_is_found_by_a_ping_and_made_again(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call on a connection that went silent timed out until the process ended: the
    channel is the process's, shared by its clients, and nothing found it dead (probe helper-92).
    A keep-alive ping that is not answered closes it; the next call makes a new one."""
    from pyspark_pymq.client import transport

    monkeypatch.setattr(transport, "KEEPALIVE_TIME_MS", 1000)  # 20 s: too long to wait for here
    monkeypatch.setattr(transport, "KEEPALIVE_TIMEOUT_MS", 1000)
    proxy = _SilentProxy(endpoint)
    try:
        admin = Admin(proxy.endpoint, timeout_ms=1000)
        admin.create_topic("silent-connection", queues=1)
        proxy.go_silent()
        began, answered = time.monotonic(), False
        while not answered and time.monotonic() - began < 30:
            try:
                answered = len(admin.topics(topic="silent-connection")) == 1
            except PymqError:
                time.sleep(0.2)
        assert answered  # within the loop's 30 s: without keep-alive pings it never answers
    finally:
        proxy.close()


def _call_in_child(endpoint: str, said: Any) -> None:
    try:
        Admin(endpoint, timeout_ms=2000).topics()
        said.put("answered")
    except PymqError as err:
        said.put(str(err))


def test_a_child_forked_from_a_process_that_used_grpc_is_told_instead_of_hanging(endpoint: str) -> None:
    """With gRPC's fork support off (pymq's default), a forked child's first call hung for ever,
    its timeout ignored (probe helper-92): it fails at once, saying what to do instead."""
    import multiprocessing

    Admin(endpoint).topics()  # this process uses gRPC
    ctx = multiprocessing.get_context("fork")
    said = ctx.Queue()
    child = ctx.Process(target=_call_in_child, args=(endpoint, said))
    child.start()
    child.join(30)
    try:
        assert not child.is_alive()
        assert re.search(r"forked from process \d+, which used gRPC.*'spawn' or 'forkserver'.*"
                         r"GRPC_ENABLE_FORK_SUPPORT=true", said.get(timeout=5))
    finally:
        if child.is_alive():
            child.kill()
