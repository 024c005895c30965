"""Broker start-up safety: one broker per data dir, a busy port, an open broker warned about."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from helpers import read_all
from pymq_broker import EmbeddedBroker
from pymq_broker.controller import is_loopback
from pymq_broker.store.index_service import IndexService
from pymq_broker.store.store_lock import DataDirInUseError, StoreLock
from pyspark_pymq import Admin, Message, Producer, PullConsumer
from pyspark_pymq.client.message import SendStatus


def _send(endpoint: str, topic: str, bodies: list[bytes]) -> None:
    with Producer(endpoint) as producer:
        for body in bodies:
            assert producer.send(Message(topic, body)).status == SendStatus.SEND_OK


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root`` but the lock file: its size, mtime and content hash."""
    return {
        str(p.relative_to(root)): (
            p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != "lock"
    }


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# -- one broker per data dir ------------------------------------------------------------------


def test_a_second_broker_process_on_a_data_dir_is_refused_and_the_first_keeps_its_messages(
    tmp_path: Path,
) -> None:
    data = tmp_path / "b"
    first = BrokerProcess(data).start()
    try:
        Admin(first.endpoint).create_topic("dup", queues=1)
        _send(first.endpoint, "dup", [b"before-0", b"before-1"])
        second = BrokerProcess(data, startup_timeout=20)
        with pytest.raises(RuntimeError, match="broker did not start") as refused:
            second.start()
        text = str(refused.value)
        assert f"data dir {str(data)!r} is in use by another broker (pid {first.pid}" in text
        assert "Traceback" not in text
        assert second.proc is not None and second.proc.returncode not in (0, None)
        _send(first.endpoint, "dup", [b"after"])  # the first one still serves
        first.restart()
        assert sorted(m.body for m in read_all(first.endpoint, "dup")) == [b"after", b"before-0", b"before-1"]
    finally:
        first.stop()


def test_an_embedded_broker_on_a_busy_data_dir_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "b"
    with EmbeddedBroker(data) as broker:  # a store with every file a broker leaves
        Admin(broker.endpoint).create_topic("dup", queues=1)
        _send(broker.endpoint, "dup", [b"kept"])
    before = _snapshot(data)
    assert "abort" not in before  # a clean stop removed it: a refused broker must not create it
    holder = StoreLock(data)
    holder.acquire()
    try:
        with pytest.raises(DataDirInUseError, match=r"is in use by another broker \(pid \d+, this process"):
            EmbeddedBroker(data).start()
        assert _snapshot(data) == before
    finally:
        holder.release()
    with EmbeddedBroker(data) as broker:  # released: the next broker starts, the message is there
        assert [m.body for m in read_all(broker.endpoint, "dup")] == [b"kept"]


def test_an_embedded_broker_is_refused_a_data_dir_a_broker_process_runs_on(tmp_path: Path) -> None:
    data = tmp_path / "b"
    with BrokerProcess(data) as process:
        Admin(process.endpoint).create_topic("dup", queues=1)
        _send(process.endpoint, "dup", [b"one"])
        in_use = rf"{str(data)!r} is in use by another broker \(pid {process.pid}"
        with pytest.raises(DataDirInUseError, match=in_use):
            EmbeddedBroker(data).start()
        _send(process.endpoint, "dup", [b"two"])
        assert sorted(m.body for m in read_all(process.endpoint, "dup")) == [b"one", b"two"]


def test_a_killed_broker_leaves_no_stale_lock(tmp_path: Path) -> None:
    data = tmp_path / "b"
    first = BrokerProcess(data).start()
    Admin(first.endpoint).create_topic("dup", queues=1)
    _send(first.endpoint, "dup", [b"one"])
    first.kill()
    with EmbeddedBroker(data) as broker:
        assert [m.body for m in read_all(broker.endpoint, "dup")] == [b"one"]
    with BrokerProcess(data) as second:
        assert [m.body for m in read_all(second.endpoint, "dup")] == [b"one"]


# -- a busy port --------------------------------------------------------------------------------


def test_a_busy_port_is_named_without_a_traceback(tmp_path: Path, busy_port: int) -> None:
    proc = BrokerProcess(tmp_path / "b", ["--port", str(busy_port)], startup_timeout=20)
    with pytest.raises(RuntimeError, match="broker did not start") as refused:
        proc.start()
    text = str(refused.value)
    assert f"pymq-broker: cannot listen on 127.0.0.1:{busy_port}: the port is in use" in text
    assert "Traceback" not in text
    assert proc.proc is not None and proc.proc.returncode not in (0, None)


def test_an_embedded_broker_on_a_busy_port_releases_the_data_dir(tmp_path: Path, busy_port: int) -> None:
    data = tmp_path / "b"
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{busy_port}: the port is in use"):
        EmbeddedBroker(data, port=busy_port).start()
    with EmbeddedBroker(data) as broker:  # the failed start let go of the data dir
        Admin(broker.endpoint).create_topic("t", queues=1)


def _open_files_under(root: Path) -> list[str]:
    """Files under ``root`` this process holds a descriptor to."""
    fds = Path("/proc/self/fd")
    held = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith(str(root) + os.sep) and not target.endswith(os.sep + "lock"):
            held.append(target)
    return held


def test_a_store_that_fails_to_load_closes_its_files_and_a_retry_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "b"
    with EmbeddedBroker(data) as broker:  # a commit log, consume queues and an index to open
        Admin(broker.endpoint).create_topic("t", queues=2)
        _send(broker.endpoint, "t", [b"one", b"two"])
    refused = OSError(5, "Input/output error")

    def fail(self: IndexService, *, crashed: bool = False) -> None:
        raise refused

    with monkeypatch.context() as patch:
        patch.setattr(IndexService, "load", fail)
        with pytest.raises(OSError, match="Input/output error"):
            EmbeddedBroker(data).start()
        assert _open_files_under(data) == []  # not left for the garbage collector
    with EmbeddedBroker(data) as broker:
        assert sorted(m.body for m in read_all(broker.endpoint, "t")) == [b"one", b"two"]


def test_a_stray_file_among_the_consume_queues_does_not_stop_the_broker(tmp_path: Path) -> None:
    data = tmp_path / "b"
    with EmbeddedBroker(data) as broker:
        Admin(broker.endpoint).create_topic("t", queues=1)
        _send(broker.endpoint, "t", [b"kept"])
    queues = next(p for p in data.rglob("consumequeue") if p.is_dir())
    (queues / ".DS_Store").write_bytes(b"\0" * 16)  # left by a file browser, or a note
    (queues / "t" / "README").write_text("queue 0 is the only one")
    with EmbeddedBroker(data) as broker:
        assert [m.body for m in read_all(broker.endpoint, "t")] == [b"kept"]
        _send(broker.endpoint, "t", [b"after"])
        assert sorted(m.body for m in read_all(broker.endpoint, "t")) == [b"after", b"kept"]


# -- an open broker -----------------------------------------------------------------------------


def test_a_broker_open_beyond_loopback_is_warned_about(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b", ["--host", "0.0.0.0"]) as proc:
        output = "".join(proc.output)
    assert "WARNING" in output
    assert "listens on 0.0.0.0 without authentication" in output
    assert "--authentication-enabled" in output and "127.0.0.1" in output
    with BrokerProcess(tmp_path / "c") as proc:  # loopback: nothing to warn about
        assert "without authentication" not in "".join(proc.output)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("[::]", False), ("10.0.0.5", False), ("broker.example.com", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_users_without_authentication_are_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "b"
    monkeypatch.setenv("PYMQ_INIT_AUTHENTICATION_USER", "root:root-password")
    with BrokerProcess(data) as proc:
        output = "".join(proc.output)
    assert "WARNING" in output
    assert "1 user(s) exist in" in output and "authentication is off" in output
    assert "$PYMQ_INIT_AUTHENTICATION_USER given" in output
    monkeypatch.delenv("PYMQ_INIT_AUTHENTICATION_USER")
    with BrokerProcess(data) as proc:  # the users file alone
        output = "".join(proc.output)
    assert f"1 user(s) exist in {data / 'config' / 'users.json'} but authentication is off" in output
    with BrokerProcess(data, ["--authentication-enabled"]) as proc:
        assert "authentication is off" not in "".join(proc.output)


def test_users_without_authentication_are_warned_about_by_an_embedded_broker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pymq_broker.controller"), \
            EmbeddedBroker(tmp_path / "b", init_authentication_user="root:root-password"):
        pass
    assert any("authentication is off" in r.getMessage() for r in caplog.records)


def test_a_forked_child_does_not_keep_the_data_dir_locked(tmp_path: Path) -> None:
    # flock belongs to the open file: a child forked while a broker ran (multiprocessing's fork)
    # held it on, and no broker could start on the dir after this one stopped until the child exited
    import os
    import signal

    lock = StoreLock(tmp_path)
    lock.acquire()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (its fork hooks have run) says so, then idles until killed
        os.write(ready_w, b"1")
        signal.pause()
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        lock.release()
        again = StoreLock(tmp_path)
        again.acquire()
        again.release()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)


@pytest.mark.parametrize("host", ["::1", "::"])
def test_an_ipv6_host_without_brackets_is_served(tmp_path: Path, host: str) -> None:
    """``--host ::`` failed to bind (``:::0``), blaming the port."""
    with EmbeddedBroker(tmp_path / "b", host=host) as broker:
        port = broker.endpoint.rpartition(":")[2]
        assert broker.endpoint == f"[{host}]:{port}"
        ep = f"[::1]:{port}"
        Admin(ep).create_topic("v6", queues=1)
        Producer(ep).send(Message("v6", b"x"))
        consumer = PullConsumer(ep, "g")
        assert [m.body for m in consumer.pull(consumer.queues("v6")[0], 0, 10).messages] == [b"x"]


def test_a_forked_childs_release_touches_no_other_file(tmp_path: Path) -> None:
    """A child closes its copy of the lock at the fork; its StoreLock still had the number, so a
    release there truncated and closed whatever file had that number since."""
    import os

    lock = StoreLock(tmp_path / "d")
    lock.acquire()
    other = tmp_path / "other"
    pid = os.fork()
    if pid == 0:  # the child: another file takes the lock's old number, then the lock is released
        code = 1
        try:
            number = lock._fd
            assert number is not None
            fd = os.open(other, os.O_RDWR | os.O_CREAT)  # often the same number already
            if fd != number:
                os.dup2(fd, number)
                os.close(fd)
            os.write(number, b"data")
            lock.release()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert other.read_bytes() == b"data"
    with pytest.raises(DataDirInUseError):  # the parent still holds the data dir
        StoreLock(tmp_path / "d").acquire()
    lock.release()
    StoreLock(tmp_path / "d").acquire()
