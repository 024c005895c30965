"""Start and stop a real `pymq-broker` process for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

_LISTENING = re.compile(r"pymq broker listening on (\S+):(\d+)")


class BrokerProcess:
    """``python -m pymq_broker`` on 127.0.0.1 with a free port.

    ``kill()`` sends SIGKILL (a crash); ``stop()`` SIGTERM (a clean shutdown);
    ``restart()`` starts again on the same data dir (a new port).
    """

    def __init__(
        self,
        data_dir: Path,
        extra_args: list[str] | None = None,
        *,
        flush_disk_type: str = "ASYNC_FLUSH",
        startup_timeout: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args or [])
        self.flush_disk_type = flush_disk_type
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.output: list[str] = []

    def start(self) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        root = Path(__file__).resolve().parent.parent
        src = [str(root / d) for d in ("connector", "broker_stub", "proto")]
        env["PYTHONPATH"] = os.pathsep.join([*src, env.get("PYTHONPATH", "")])
        cmd = [
            sys.executable, "-m", "pymq_broker",
            "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1",
            "--port", "0",
            "--flush-disk-type", self.flush_disk_type,
            *self.extra_args,
        ]
        self.output = []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        deadline = time.monotonic() + self.startup_timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            m = _LISTENING.search(line)
            if m:
                self.endpoint = f"{m.group(1)}:{m.group(2)}"
                threading.Thread(target=self._drain, daemon=True).start()
                self._wait_client_channel()
                return self
        self.kill()
        raise RuntimeError("broker did not start:\n" + "".join(self.output))

    def _wait_client_channel(self) -> None:
        """Until the clients' shared channel to the endpoint is connected: one cached from an earlier
        broker on the same port (a restart, or a port the OS gave out again) fails calls at once
        while it waits out its reconnect backoff (up to 1 s), and a test's first call came too soon."""
        if any(a.startswith("--tls") for a in self.extra_args):
            return
        import grpc
        from pyspark_pymq.client.transport import _channel

        with contextlib.suppress(grpc.FutureTimeoutError):
            grpc.channel_ready_future(_channel(self.endpoint)).result(timeout=5)

    def _drain(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            self.output.append(line)

    def kill(self) -> None:
        """SIGKILL: the broker dies without any clean-up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def restart(self, *, crash: bool = False) -> BrokerProcess:
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
