"""A real Apache RocketMQ 5.3.3 cluster on loopback, and RocketMQ's own Java producer, for tests."""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from pymq_broker.store.disk_space import disk_partition_space, used_ratio

ROCKETMQ_VERSION = "5.3.3"
ROOT = Path(__file__).resolve().parent.parent
# Filled by `make rocketmq` (tests/rocketmq/pom.xml); the compiled Java producer goes next to it.
DEFAULT_ROCKETMQ_DIR = ROOT / ".venv" / f"rocketmq-{ROCKETMQ_VERSION}"
JAVA_PRODUCER_SOURCE = Path(__file__).resolve().parent / "rocketmq" / "JavaProducer.java"

# Delay levels 1..18 in seconds: retry and delay tests wait seconds, not RocketMQ's 1s..2h ladder.
# RocketMQ parses only the units s, m, h and d ("100ms" would stop the broker from starting).
FAST_DELAY_LEVELS = "1s 1s 1s 2s 2s 2s 2s 2s 2s 2s 2s 2s 2s 2s 2s 2s 2s 2s"
# The brokers' transaction check-back timings (ms): first check, then between checks. The
# op records that mark half messages ended are written in batches every
# transactionOpBatchInterval (3 s by default): it must be well under the time-out, or a half
# message committed or rolled back a moment ago is checked back (and may be committed twice).
TRANSACTION_TIMEOUT_MS = 2000
TRANSACTION_CHECK_INTERVAL_MS = 1000
TRANSACTION_OP_BATCH_INTERVAL_MS = 200

# Logged by BrokerOuterAPI.registerBrokerAll only after the name server accepted the
# registration; "The broker[...] boot success" comes earlier, before routes exist.
_REGISTERED = "Registering current broker to name server completed"
_NAMESRV_READY = "The Name Server boot success"
_MQADMIN_FAILED = re.compile(
    r"^\s+at [\w.$]+\(|^usage: mqadmin|^Missing required option|^Unrecognized option"
    r"|^The sub command \S+ not exist|command failed",
    re.MULTILINE,
)

_LOGBACK_STATUS = re.compile(r"^\d\d:\d\d:\d\d,\d{3} \|-")
_PROBLEM = re.compile(r" ERROR |^[\w.$]+(Exception|Error)\b")

# Ports are drawn below Linux's ephemeral range (32768+) so that outgoing connections of other
# tests cannot take them between kill_broker() and start_broker().
_PORT_RANGE = (20000, 32000)
_ROCKETMQ_DISK_FULL_PERCENT = 90
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class JavaMessage:
    """One message for :meth:`RocketMQCluster.produce` (fields as in RocketMQ's ``Message``).

    ``broker`` and ``queue_id`` together pin the message queue; without them the Java client's
    round robin over every queue of every broker chooses.
    """

    body: bytes | str
    tags: str | None = None
    keys: Sequence[str] | str = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int = 0
    broker: str | None = None
    queue_id: int | None = None

    def to_json(self, topic: str, batch: int | None) -> str:
        body = self.body.encode() if isinstance(self.body, str) else self.body
        keys = [self.keys] if isinstance(self.keys, str) else list(self.keys)
        obj: dict[str, object] = {"topic": topic, "body": base64.b64encode(body).decode("ascii")}
        if self.tags is not None:
            obj["tags"] = self.tags
        if keys:
            obj["keys"] = keys
        if self.properties:
            obj["properties"] = dict(self.properties)
        if self.delay_level:
            obj["delayLevel"] = self.delay_level
        if self.broker is not None or self.queue_id is not None:
            obj["broker"] = self.broker
            obj["queueId"] = self.queue_id
        if batch is not None:
            obj["batch"] = batch
        return json.dumps(obj)


@dataclass(frozen=True)
class SendResult:
    """What the Java client's ``SendResult`` said about one message."""

    status: str  # SendStatus name: SEND_OK, FLUSH_DISK_TIMEOUT, ...
    msg_id: str  # UNIQ_KEY, made by the client
    offset_msg_id: str  # store host + commit-log offset, made by the broker
    broker_name: str
    queue_id: int
    queue_offset: int


@dataclass
class _Proc:
    """One JVM of the cluster: its command, log files and readiness signal."""

    name: str
    home: Path  # -Duser.home: RocketMQ's logs/ (and namesrv/, store/) go under it
    cmd: list[str]
    ready_log: Path
    ready_line: str
    popen: subprocess.Popen[bytes] | None = None
    ready_from: int = 0  # offset in ready_log where this run's lines start

    @property
    def stdout_path(self) -> Path:
        return self.home / "stdout.log"

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class RocketMQCluster:
    """A real RocketMQ cluster on 127.0.0.1: one name server and brokers ``broker-a``, ``broker-b``.

    Runs the Apache RocketMQ 5.3.3 jars that ``make rocketmq`` puts into
    ``.venv/rocketmq-5.3.3/lib`` (one JVM per server), each broker a master (brokerId 0) of
    ``cluster_name`` with its own store, so a topic created on the cluster has queues on both.

    Usage::

        with RocketMQCluster(tmp_path) as c:          # start(): name server, then brokers in parallel
            c.create_topic("orders", queues=4)        # on every broker (mqadmin updateTopic -c)
            sent = c.produce("orders", [b"a", JavaMessage(b"b", tags="T", keys="k1")])
            c.mqadmin("topicStatus", "-t", "orders")  # any mqadmin command; -n is added
            c.kill_broker("broker-a")                 # SIGKILL: a crash (stop_broker: SIGTERM)
            c.start_broker("broker-a")                # same store and ports; waits until registered

    Addresses: ``namesrv_addr`` ("127.0.0.1:port"), ``broker_addrs`` (name -> "127.0.0.1:port", the
    remoting port clients use), ``cluster_name``. A broker on port L also listens on L-2 (the "VIP"
    channel) and L+1 (HA, which RocketMQ binds on every interface); all three are free when chosen.

    ``slaves=("broker-a",)``: those brokers get a slave too (process ``broker-a-slave``:
    brokerId 1, brokerRole SLAVE, its own store and ports, started once the masters are
    registered), ``slave_addrs`` name -> its address; ``kill_broker("broker-a")`` kills the master only.
    RocketMQ's default slaveReadEnable=false applies unless ``extra_broker_conf`` sets it.

    ``tls=(cert_file, key_file)``: every server speaks TLS only (RocketMQ's
    ``tls.server.mode=enforcing``) with that PEM certificate and unencrypted PKCS#8 key.

    Broker settings: autoCreateTopicEnable, autoCreateSubscriptionGroup, enablePropertyFilter
    (SQL92 filters), ASYNC_FLUSH, 64 MiB commit-log files, diskMaxUsedSpaceRatio=95, short delay
    levels (``delay_levels``, 18 of them) and short transaction check-backs
    (``transactionTimeOut`` / ``transactionCheckInterval`` / ``transactionOpBatchInterval`` of
    TRANSACTION_TIMEOUT_MS / TRANSACTION_CHECK_INTERVAL_MS / TRANSACTION_OP_BATCH_INTERVAL_MS);
    ``extra_broker_conf`` adds or overrides broker.conf keys.

    ``produce`` sends with RocketMQ's own Java client (tests/rocketmq/JavaProducer.java, compiled
    once next to the jars): plain sends, tags, keys, user properties, delay levels, pinned queues,
    one MessageBatch (``batch=True``); bodies above 4 KiB are stored compressed, as Java producers do.
    Each call starts a JVM (about 1-2 s).

    Files: everything lives under ``base_dir``: ``<name>/stdout.log``, ``<name>/logs/rocketmqlogs/``
    (broker.log, namesrv.log, ...), ``<broker>/store``. Processes are stopped by ``stop()`` (SIGTERM,
    then SIGKILL), by the context manager, at interpreter exit, and (when started from the main
    thread) by the kernel if the test process itself dies (PR_SET_PDEATHSIG).
    """

    # RocketMQ 5's TimerFlushService forces its timer wheel every timerFlushIntervalMs (1 s): an idle
    # test broker spent 31% of a core on it, 0.6 of this 2-core machine's cores for the whole suite.
    # Only timer messages' durability across a broker crash waits longer for it.
    test_broker_conf: Mapping[str, str] = {"timerFlushIntervalMs": "10000"}

    def __init__(
        self,
        base_dir: Path,
        *,
        brokers: Sequence[str] = ("broker-a", "broker-b"),
        delay_levels: str = FAST_DELAY_LEVELS,
        extra_broker_conf: Mapping[str, str] | None = None,
        cluster_name: str = "PymqTestCluster",
        rocketmq_dir: Path = DEFAULT_ROCKETMQ_DIR,
        startup_timeout: float = 90.0,
        tls: tuple[str, str] | None = None,
        slaves: Sequence[str] = (),
    ) -> None:
        if len(set(brokers)) != len(brokers) or not brokers:
            raise ValueError(f"broker names must be distinct and not empty: {brokers!r}")
        if not set(slaves) <= set(brokers):
            raise ValueError(f"slaves {slaves!r} name brokers that are not among {brokers!r}")
        if not all(re.fullmatch(r"\d+[smhd]", level) for level in delay_levels.split()):
            # The broker would log a NumberFormatException and exit.
            raise ValueError(f"delay levels take the units s, m, h and d only: {delay_levels!r}")
        self.base_dir = Path(base_dir).resolve()
        self.broker_names = tuple(brokers)
        self.slave_of = {slave_name(b): b for b in slaves}  # process name -> its master's broker name
        self.delay_levels = delay_levels
        self.extra_broker_conf = dict(extra_broker_conf or {})
        self.cluster_name = cluster_name
        self.rocketmq_dir = Path(rocketmq_dir)
        self.lib_dir = self.rocketmq_dir / "lib"
        self.startup_timeout = startup_timeout
        self.tls = tls
        self.namesrv_addr = ""
        self.broker_addrs: dict[str, str] = {}
        self.slave_addrs: dict[str, str] = {}  # broker name -> its slave's address
        self._procs: dict[str, _Proc] = {}
        self._lock = threading.Lock()

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> RocketMQCluster:
        """Start the name server, then every broker at once; return when all are registered."""
        if self._procs:
            raise RuntimeError("this cluster was started before; use start_broker() to restart a broker")
        self._check_install()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._check_disk()
        taken: set[int] = set()
        ns_port = _pick_port(taken, below=0, above=0)
        self.namesrv_addr = f"127.0.0.1:{ns_port}"
        ns = self._namesrv_proc(ns_port)
        self._procs["namesrv"] = ns
        for name in self.broker_names:
            # L-2 is the "fast" channel, L+1 HA; L-1 is kept out of the next broker's hands too.
            port = _pick_port(taken, below=2, above=1)
            self.broker_addrs[name] = f"127.0.0.1:{port}"
            self._procs[name] = self._broker_proc(name, port)
        for proc_name, master in self.slave_of.items():
            port = _pick_port(taken, below=2, above=1)  # a slave binds its own fast and HA ports too
            self.slave_addrs[master] = f"127.0.0.1:{port}"
            self._procs[proc_name] = self._broker_proc(proc_name, port, master=master)
        _LIVE.add(self)
        try:
            self._launch(ns)
            # A broker registers once at start-up, then every 30 s: if the name server were not
            # up by then, the cluster would look broken for half a minute.
            self._wait_ready([ns])
            brokers = [self._procs[n] for n in self.broker_names]
            for p in brokers:
                self._launch(p)
            self._wait_ready(brokers)
            # A slave learns its master's HA address from the name server's answer to its
            # registration, which names it only once the master has registered (else the next
            # registration, 30 s later): slaves start after their masters.
            slaves = [self._procs[n] for n in self.slave_of]
            for p in slaves:
                self._launch(p)
            self._wait_ready(slaves)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every process (brokers before the name server they unregister from), then SIGKILL.

        Idempotent; safe to call on a cluster that failed half-way through ``start``.
        """
        brokers = [p for n, p in self._procs.items() if n != "namesrv"]
        _terminate(brokers, grace)
        _terminate([p for n, p in self._procs.items() if n == "namesrv"], grace)
        _LIVE.discard(self)

    def kill_broker(self, name: str) -> None:
        """SIGKILL one broker: a crash (no unregistering, unflushed pages stay in the OS cache)."""
        p = self._broker(name)
        if p.popen is not None and p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait(30)

    def pause_broker(self, name: str) -> None:
        """SIGSTOP one broker: hung (still registered at the name server, answering nothing) until
        :meth:`resume_broker`; a test must resume it (in a ``finally``) within the name server's
        120 s broker expiry, or the broker leaves the cluster until its next heartbeat."""
        p = self._broker(name)
        if p.popen is None or p.popen.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        os.kill(p.popen.pid, signal.SIGSTOP)

    def resume_broker(self, name: str) -> None:
        """SIGCONT a broker :meth:`pause_broker` stopped."""
        p = self._broker(name)
        if p.popen is not None and p.popen.poll() is None:
            os.kill(p.popen.pid, signal.SIGCONT)

    def running(self, name: str) -> bool:
        """Whether broker (or slave) process ``name`` runs now."""
        return self._broker(name).alive()

    def stop_broker(self, name: str, grace: float = 30.0) -> None:
        """SIGTERM one broker and wait: a clean shutdown (it unregisters from the name server)."""
        _terminate([self._broker(name)], grace)

    def _check_disk(self) -> None:
        # RocketMQ refuses every send above 90% of its disk used, whatever the broker.conf says
        # (DefaultMessageStore caps diskSpaceWarningLevelRatio at 0.90): one clear error up front
        # instead of every test failing on SERVICE_NOT_AVAILABLE.
        ratio = used_ratio(*disk_partition_space(self.base_dir))  # RocketMQ's own figure
        if ratio * 100 > _ROCKETMQ_DISK_FULL_PERCENT - 1:  # a point of margin for what the tests write
            raise RuntimeError(
                f"the disk holding {self.base_dir} is {ratio:.0%} used: Apache RocketMQ refuses "
                f"sends above {_ROCKETMQ_DISK_FULL_PERCENT}% (diskSpaceWarningLevelRatio, capped there); "
                "free space on it first"
            )

    def start_broker(self, name: str) -> None:
        """Start a stopped or killed broker again (same store, same ports); wait until registered."""
        p = self._broker(name)
        if p.alive():
            raise RuntimeError(f"{name} is still running (pid {p.popen.pid if p.popen else '?'})")
        self._launch(p)
        self._wait_ready([p])

    def __enter__(self) -> RocketMQCluster:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- admin ------------------------------------------------------------------------------------

    def mqadmin(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``mqadmin <args> -n <namesrv>`` and return its output (stdout, then stderr).

        mqadmin exits with 0 even when a command fails (it prints a stack trace or its usage),
        so such output raises ``RuntimeError`` with the output.
        """
        classes = self._compile_helper()
        cmd = [
            *self._java("tools", heap="256m", logback="rmq.tools.logback.xml", classes=classes),
            # MQAdminStartup itself, run by the helper so the JVM exits when the command is done.
            "JavaProducer",
            "--mqadmin",
            *args,
            "-n",
            self.namesrv_addr,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        out = r.stdout + r.stderr
        if r.returncode != 0 or (args[:1] != ("help",) and _MQADMIN_FAILED.search(out)):
            raise RuntimeError(f"mqadmin {' '.join(args)} failed (exit {r.returncode}):\n{out}")
        return out

    def create_topic(
        self,
        topic: str,
        queues: int = 4,
        *,
        brokers: Iterable[str] | None = None,
        perm: int = 6,
    ) -> None:
        """Create or update ``topic`` with ``queues`` read and write queues.

        On every broker of the cluster by default (``updateTopic -c``); on the named brokers only
        (``updateTopic -b addr`` each) when ``brokers`` is given. perm: 2 write, 4 read, 6 both.
        A broker's slave gets it too: a slave copies its master's topics only every 60 s
        (SlaveSynchronize.syncAll), and answers no stats of a topic it does not know.
        """
        common = ["-t", topic, "-r", str(queues), "-w", str(queues), "-p", str(perm)]
        if brokers is None:
            self.mqadmin("updateTopic", "-c", self.cluster_name, *common)
        else:
            for name in brokers:
                self.mqadmin("updateTopic", "-b", self.broker_addrs[name], *common)
        for name in self.broker_names if brokers is None else brokers:
            if name in self.slave_addrs:
                self.mqadmin("updateTopic", "-b", self.slave_addrs[name], *common)

    def topic_status(self, topic: str) -> dict[tuple[str, int], tuple[int, int]]:
        """``mqadmin topicStatus``: (broker name, queue id) -> (min offset, max offset)."""
        out = self.mqadmin("topicStatus", "-t", topic)
        status: dict[tuple[str, int], tuple[int, int]] = {}
        for line in out.splitlines():
            # "#Broker Name  #QID  #Min Offset  #Max Offset  #Last Updated"
            parts = line.split()
            if len(parts) >= 4 and parts[0] in self.broker_addrs and parts[1].isdigit():
                status[(parts[0], int(parts[1]))] = (int(parts[2]), int(parts[3]))
        return status

    def topic_route(self, topic: str) -> dict[str, object]:
        """``mqadmin topicRoute``: the name server's TopicRouteData as JSON (brokerDatas, queueDatas)."""
        out = self.mqadmin("topicRoute", "-t", topic)
        text = out[out.index("{") :]
        # fastjson writes the brokerAddrs map's integer keys (broker ids) without quotes.
        text = re.sub(r"([{,]\s*)(-?\d+):", r'\1"\2":', text)
        route: dict[str, object] = json.JSONDecoder().raw_decode(text)[0]
        return route

    # -- producing --------------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        messages: Iterable[JavaMessage | bytes | str],
        *,
        batch: bool = False,
        group: str = "pymq-java-producer",
        timeout: float = 120.0,
    ) -> list[SendResult]:
        """Send ``messages`` to ``topic`` with RocketMQ's Java ``DefaultMQProducer`` (sync sends).

        ``batch=True`` sends them all as one MessageBatch (same topic; no delay levels; never
        compressed by the client). Returns one ``SendResult`` per message, in order.
        """
        msgs = [m if isinstance(m, JavaMessage) else JavaMessage(m) for m in messages]
        if not msgs:
            return []
        classes = self._compile_helper()
        payload = "".join(m.to_json(topic, 0 if batch else None) + "\n" for m in msgs)
        (self.base_dir / "producer").mkdir(parents=True, exist_ok=True)
        cmd = [
            *self._java("producer", heap="256m", logback="rmq.client.logback.xml", classes=classes),
            "JavaProducer",
            self.namesrv_addr,
            group,
        ]
        r = subprocess.run(cmd, input=payload, capture_output=True, text=True, timeout=timeout, check=False)
        results = [_parse_sent(line) for line in r.stdout.splitlines() if line.startswith("SENT\t")]
        if r.returncode != 0 or len(results) != len(msgs):
            raise RuntimeError(
                f"JavaProducer failed (exit {r.returncode}, {len(results)} of {len(msgs)} sent):\n"
                f"{r.stdout}{r.stderr}"
            )
        return results

    # -- internals --------------------------------------------------------------------------------

    def _check_install(self) -> None:
        if not (self.lib_dir / f"rocketmq-broker-{ROCKETMQ_VERSION}.jar").is_file():
            raise RuntimeError(
                f"RocketMQ {ROCKETMQ_VERSION} jars not found in {self.lib_dir}: run `make rocketmq`"
            )

    def _classpath(self, *extra: Path) -> str:
        return os.pathsep.join([*(str(p) for p in extra), str(self.lib_dir / "*")])

    def _java(self, home_name: str, *, heap: str, logback: str, classes: Path | None = None) -> list[str]:
        home = self.base_dir / home_name
        return [
            "java",
            f"-Xmx{heap}",
            # Start-up speed over peak speed: these JVMs live for one test session at most.
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Duser.home={home}",
            f"-Drocketmq.home.dir={self.base_dir}",
            # Without it every JVM picks the first rmq.*.logback.xml on the class path (the broker's).
            f"-Drmq.logback.configurationFile={logback}",
            *self._tls_properties(),
            "-cp",
            self._classpath(*([classes] if classes else [])),
        ]

    def _tls_properties(self) -> list[str]:
        # TlsSystemConfig: servers refuse plaintext (enforcing) with this certificate; the brokers'
        # and the tools' clients speak TLS to the name server without checking it (RocketMQ's
        # tls.client.authServer=false default).
        if self.tls is None:
            return []
        cert, key = self.tls
        return [
            "-Dtls.server.mode=enforcing", "-Dtls.test.mode.enable=false",
            f"-Dtls.server.certPath={cert}", f"-Dtls.server.keyPath={key}",
            "-Dtls.enable=true", "-Dtls.client.authServer=false",
        ]

    def _namesrv_proc(self, port: int) -> _Proc:
        home = self.base_dir / "namesrv"
        home.mkdir(parents=True, exist_ok=True)
        conf = home / "namesrv.conf"
        conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\n")
        cmd = [
            *self._java("namesrv", heap="256m", logback="rmq.namesrv.logback.xml"),
            "org.apache.rocketmq.namesrv.NamesrvStartup",
            "-c",
            str(conf),
        ]
        # NamesrvStartup prints its boot line to stdout.
        return _Proc("namesrv", home, cmd, home / "stdout.log", _NAMESRV_READY)

    def _broker_proc(self, name: str, port: int, *, master: str | None = None) -> _Proc:
        """The broker process ``name`` on ``port``: a master, or with ``master`` that broker's slave."""
        home = self.base_dir / name
        store = home / "store"
        store.mkdir(parents=True, exist_ok=True)
        role: dict[str, str] = {"brokerName": name, "brokerId": "0", "brokerRole": "ASYNC_MASTER"}
        if master is not None:
            # No haMasterAddress: set, 5.3.3's slave logged "HAClient connect to master null
            # failed" for good; it learns the address from its registrations instead.
            role = {"brokerName": master, "brokerId": "1", "brokerRole": "SLAVE"}
        conf: dict[str, str] = {
            "brokerClusterName": self.cluster_name,
            **role,
            "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": self.namesrv_addr,
            "brokerIP1": "127.0.0.1",
            "bindAddress": "127.0.0.1",
            "listenPort": str(port),
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
            "autoCreateTopicEnable": "true",
            "autoCreateSubscriptionGroup": "true",
            "enablePropertyFilter": "true",
            "diskMaxUsedSpaceRatio": "95",
            "messageDelayLevel": self.delay_levels,
            # A loaded 2-core test machine keeps sends queued longer than the 200 ms after which
            # a broker answers SYSTEM_BUSY ([TIMEOUT_CLEAN_QUEUE] flow control): tests would be
            # flaky, not wrong. Production brokers keep their own setting.
            "waitTimeMillsInSendQueue": "3000",
            # Check-backs within seconds (RocketMQ's 6 s / 30 s / 3 s): an unresolved half message
            # is first checked 2 s after it was born, then about every second (at most 15 times).
            "transactionTimeOut": str(TRANSACTION_TIMEOUT_MS),
            "transactionCheckInterval": str(TRANSACTION_CHECK_INTERVAL_MS),
            "transactionOpBatchInterval": str(TRANSACTION_OP_BATCH_INTERVAL_MS),
            **self.test_broker_conf,
            **self.extra_broker_conf,
        }
        path = home / "broker.conf"
        path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        java = self._java(name, heap="512m", logback="rmq.broker.logback.xml")
        java[1:1] = ["-Xms256m", "-XX:MaxDirectMemorySize=512m"]
        cmd = [*java, "org.apache.rocketmq.broker.BrokerStartup", "-c", str(path), "-n", self.namesrv_addr]
        return _Proc(name, home, cmd, home / "logs" / "rocketmqlogs" / "broker.log", _REGISTERED)

    def _broker(self, name: str) -> _Proc:
        if name not in (*self.broker_names, *self.slave_of) or name not in self._procs:
            raise KeyError(f"no broker {name!r} in this cluster (brokers: "
                           f"{', '.join((*self.broker_names, *self.slave_of))})")
        return self._procs[name]

    def _launch(self, p: _Proc) -> None:
        # Readiness is looked for only in what this run appends: a restarted broker's log
        # already holds the previous run's "registered" lines.
        p.ready_from = p.ready_log.stat().st_size if p.ready_log.exists() else 0
        # PR_SET_PDEATHSIG follows the *thread* that forks: from any other thread the JVM would die
        # with that thread, so only the main thread asks for it.
        die_with_parent = _die_with_parent if threading.current_thread() is threading.main_thread() else None
        with open(p.stdout_path, "ab") as out:
            out.write(f"\n==== {time.strftime('%H:%M:%S')} starting {p.name}\n".encode())
            out.flush()
            p.popen = subprocess.Popen(
                p.cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=p.home,
                preexec_fn=die_with_parent,
            )

    def _wait_ready(self, procs: list[_Proc]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending = list(procs)
        while pending:
            for p in list(pending):
                if _log_contains(p.ready_log, p.ready_from, p.ready_line):
                    pending.remove(p)
                elif p.popen is not None and p.popen.poll() is not None:
                    code = p.popen.returncode
                    raise RuntimeError(f"{p.name} exited with {code} while starting\n{_tails(p)}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(
                    f"RocketMQ {', '.join(p.name for p in pending)} not ready after "
                    f"{self.startup_timeout:.0f} s (no {pending[0].ready_line!r})\n"
                    + "\n".join(_tails(p) for p in pending)
                )
            if pending:
                time.sleep(0.2)

    def _compile_helper(self) -> Path:
        """Compile JavaProducer.java into <rocketmq_dir>/classes unless its .class is up to date."""
        classes = self.rocketmq_dir / "classes"
        target = classes / "JavaProducer.class"
        with self._lock:
            if target.exists() and target.stat().st_mtime >= JAVA_PRODUCER_SOURCE.stat().st_mtime:
                return classes
            # Compiled aside and renamed: a concurrent run never sees a half-written class.
            tmp = classes.with_name(f"classes.tmp-{os.getpid()}")
            tmp.mkdir(parents=True, exist_ok=True)
            r = subprocess.run(
                ["javac", "-nowarn", "-cp", self._classpath(), "-d", str(tmp), str(JAVA_PRODUCER_SOURCE)],
                capture_output=True,
                text=True,
                check=False,
            )
            if r.returncode != 0:
                raise RuntimeError(f"javac {JAVA_PRODUCER_SOURCE} failed:\n{r.stdout}{r.stderr}")
            classes.mkdir(parents=True, exist_ok=True)
            for f in tmp.iterdir():
                f.replace(classes / f.name)
            tmp.rmdir()
            return classes


def slave_name(broker: str) -> str:
    """The process name of ``broker``'s slave (for kill_broker, start_broker, its log directory)."""
    return f"{broker}-slave"


def _parse_sent(line: str) -> SendResult:
    _, status, msg_id, offset_msg_id, broker, queue_id, queue_offset = line.rstrip("\n").split("\t")
    return SendResult(status, msg_id, offset_msg_id, broker, int(queue_id), int(queue_offset))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_port(taken: set[int], *, below: int, above: int) -> int:
    """A port L with L-below .. L+above free on loopback and not handed out before."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(_PORT_RANGE[0] + below, _PORT_RANGE[1] - above)
        span = range(port - below, port + above + 1)
        if not taken.intersection(span) and all(_port_free(p) for p in span):
            taken.update(span)
            return port
    raise RuntimeError(f"no free loopback ports in {_PORT_RANGE}")


def _log_contains(path: Path, offset: int, needle: str) -> bool:
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) < offset:
                offset = 0  # rolled over: the new file is all this run's
            f.seek(offset)
            return needle.encode() in f.read()
    except FileNotFoundError:
        return False


def _excerpt(path: Path, tail: int = 25) -> str:
    """The ERROR entries and exceptions (stack traces cut short) and the last lines of a log."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 256 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return f"  ({path} does not exist)"
    # Logback's own status lines fill the JVM's stdout and say nothing about RocketMQ.
    lines = [ln for ln in text.splitlines() if not _LOGBACK_STATUS.match(ln)]
    problems: list[str] = []
    i = 0
    while i < len(lines):
        if _PROBLEM.search(lines[i]):
            problems.append(lines[i])
            # Its stack trace, shortened: RocketMQ's frames tell more than the JDK's.
            frames = 0
            while i + 1 < len(lines) and (lines[i + 1][:1].isspace() or lines[i + 1].startswith("Caused by")):
                i += 1
                frames += 1
                if frames <= 8:
                    problems.append(lines[i])
        i += 1
    out = "\n".join(lines[-tail:])
    if problems:
        out = "errors:\n" + "\n".join(problems[:80]) + "\nlast lines:\n" + out
    return out


def _tails(p: _Proc) -> str:
    out = f"--- {p.stdout_path}\n{_excerpt(p.stdout_path)}"
    if p.ready_log != p.stdout_path:
        out += f"\n--- {p.ready_log}\n{_excerpt(p.ready_log)}"
    return out


def _terminate(procs: Iterable[_Proc], grace: float) -> None:
    running = [p.popen for p in procs if p.popen is not None and p.popen.poll() is None]
    for popen in running:
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for popen in running:
        try:
            popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(30)


# The kernel SIGKILLs the JVMs when the test process dies without running atexit (SIGKILL, OOM).
# Looked up before any fork: between fork and exec the child only calls it.
try:
    _PRCTL: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def _die_with_parent() -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


_LIVE: set[RocketMQCluster] = set()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop(grace=5.0)


__all__ = ["FAST_DELAY_LEVELS", "JavaMessage", "RocketMQCluster", "SendResult", "slave_name"]
