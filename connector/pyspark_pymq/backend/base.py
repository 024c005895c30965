"""The one seam between pymq's client and Spark code and a broker.

Spark's source, sink and listener, and the client classes (Producer,
PullConsumer), talk to a :class:`Backend`; they never see a gRPC stub, a
remoting frame, a record layout or a wire status number. Each backend owns:

- its transport (pymq's gRPC, or RocketMQ's remoting protocol over TCP);
- its record codec: raw pulled records -> Arrow rows or MessageExt, and
  messages -> the images it sends (:meth:`Backend.encode_records`,
  :meth:`Backend.frame_columns`);
- the mapping of its answers to pymq's typed results and errors;
- the validation of what only it can judge (subscription expressions).

Two implementations: :class:`~pyspark_pymq.backend.pymq.PymqBackend` (the
embedded broker, ``endpoint``) and
:class:`~pyspark_pymq.backend.rocketmq.RocketMQBackend` (Apache RocketMQ,
``namesrvAddr``). :func:`~pyspark_pymq.backend.open_backend` picks one from a
:class:`BackendConfig`.
"""

from __future__ import annotations

import threading
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pymq_proto.malloc import tune_malloc_once
from pymq_proto.subscription import check_tags, split_tags

from ..client.credentials import check_credentials
from ..client.message import MessageExt, MessageQueue, PullStatus, SendBackColumns, SendResult
from ..tls import TlsConfig

if TYPE_CHECKING:  # numpy and pyarrow load with a backend, not with the options (see spark.options)
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from ..client.route import TopicRoute

__all__ = [
    "Backend",
    "BackendConfig",
    "PullBatch",
    "QueueBounds",
    "SendBackOutcome",
    "SendRequest",
    "backend_config",
    "cached_backend",
    "check_endpoint",
    "check_namesrv_addr",
    "check_subscription",
    "client_tls",
    "open_backend",
    "parse_backend_options",
    "parse_tls_options",
]

BackendKind = Literal["pymq", "rocketmq"]


@dataclass(frozen=True)
class BackendConfig:
    """Where the broker is: exactly one of ``endpoint`` (pymq) or ``namesrv_addr`` (RocketMQ).

    Picklable (it travels to Spark's executors inside the options). The secret
    key never appears in ``repr``, logs or error messages.
    """

    endpoint: str | None = None
    namesrv_addr: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    tls: TlsConfig | None = None  # None: plaintext

    @property
    def kind(self) -> BackendKind:
        return "rocketmq" if self.namesrv_addr else "pymq"

    @property
    def address(self) -> str:
        """The endpoint or the name server list, as the user gave it."""
        return self.namesrv_addr or self.endpoint or ""

    @property
    def option(self) -> str:
        """The option that names the broker, as the user wrote it (for messages)."""
        if self.namesrv_addr:
            return f"namesrvAddr={self.namesrv_addr!r}"
        return f"endpoint={self.endpoint!r}"

    @property
    def where(self) -> str:
        """Where requests go, in words: for error messages."""
        if self.namesrv_addr:
            return f"the RocketMQ cluster of name server(s) {self.namesrv_addr}"
        return f"the broker at {self.endpoint}"


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """A queue's offsets on the broker: messages are at ``[min_offset, max_offset)``.

    ``topic_id`` is the id its broker gave the topic when it was created (the pymq
    broker's; 0 where the backend has none, as RocketMQ): a new id means the topic was
    deleted and created again, whatever the offsets say.
    """

    min_offset: int
    max_offset: int
    topic_id: int = 0


@dataclass(frozen=True, slots=True)
class PullBatch:
    """One pull's answer, records still in the backend's own layout.

    ``records`` is decoded only by the backend that pulled it
    (:meth:`Backend.decode_arrow`, :meth:`Backend.decode_messages`).
    ``first_queue_offset`` is the queue offset of the first record (-1 when
    there is none): a value above the offset asked for means messages expired.
    ``message_count`` may be an estimate where the wire does not say (it only
    sizes Arrow batches). ``record_sizes`` is each record's size as little-endian
    int32s where the broker says (the pymq broker does, from its consume queue),
    else empty: a decoder then follows the records' own sizes one by one.
    """

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: bytes = b""
    message_count: int = 0
    first_queue_offset: int = -1
    record_sizes: bytes = b""


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Messages encoded once by :meth:`Backend.encode_records`, to one queue (or round robin).

    ``records`` are the backend's images back to back, ``sizes`` their lengths,
    ``uniq_keys`` their UNIQ_KEYs (a Sequence: RowKeys for bulk writers).
    """

    topic: str
    records: bytes | memoryview  # a view (of an Arrow buffer) is sent without a copy
    sizes: npt.NDArray[np.int32]
    uniq_keys: Sequence[str]
    sharding_key: str | None = None
    queue_id: int | None = None
    reconsume_times: int = 0  # a consumer's own copy to %RETRY% (RocketMQ's send back fallback)
    broker_name: str | None = None  # with queue_id: that broker's queue (a topic on several brokers)

    def slice(self, start: int, stop: int, first_byte: int, end_byte: int) -> SendRequest:
        return SendRequest(
            self.topic, self.records[first_byte:end_byte], self.sizes[start:stop],
            self.uniq_keys[start:stop], self.sharding_key, self.queue_id, self.reconsume_times,
            self.broker_name,
        )


def subscribed_tags(subscription: str, expression_type: str) -> list[str]:
    """The tags of a tag subscription (none for ``*`` or SQL92)."""
    if expression_type != "TAG":
        return []
    return [t for t in split_tags(subscription) or [] if t]


def filter_by_tags(messages: Sequence[MessageExt], tags: Iterable[str]) -> list[MessageExt]:
    """What RocketMQ's ``PullAPIWrapper.processPullResult`` keeps of a tag subscription's pull.

    A broker (RocketMQ's and pymq's) filters by the tag's hash code only, so the client
    drops messages whose TAGS is not one of ``tags`` (hash collisions) and those with no
    TAGS. An empty ``tags`` (subscription ``*``) keeps everything.
    """
    wanted = set(tags)
    if not wanted:
        return list(messages)
    return [m for m in messages if m.tags is not None and m.tags in wanted]


def filter_batch_by_tags(batch: pa.RecordBatch, tags: Iterable[str]) -> pa.RecordBatch:
    """:func:`filter_by_tags` of Arrow rows (a null tag never matches)."""
    import pyarrow.compute as pc

    from ..arrow_arrays import strings

    wanted = sorted(set(tags))
    if not wanted:
        return batch
    column = batch.column(batch.schema.get_field_index("tags"))
    keep = pc.is_in(column, value_set=strings(wanted))
    if keep.null_count == 0 and pc.all(keep).as_py():
        return batch
    return batch.filter(keep)  # a null (no tag) is left out


@dataclass(frozen=True, slots=True)
class SendBackOutcome:
    """A send back the broker did: the message went to ``%DLQ%`` when ``dead_letter``."""

    dead_letter: bool


class Backend(ABC):
    """What pymq needs from a broker, typed. One instance per (process, config).

    Thread-safe: the Spark read loop pulls from a helper thread, async sends
    complete on transport threads.
    """

    config: BackendConfig
    timeout_s: float  # per request, unless a call says otherwise
    # the reconsume limit a send back carries when the caller gives none (None: the broker's
    # group config decides)
    default_max_reconsume_times: int | None = None
    # Whether the broker keeps a group's progress on a queue its topic does not read now (cut by a
    # scale-in of read queues). The pymq broker refuses a whole update that names one, so such
    # queues are left out of commits there; one that takes them keeps the progress of a drained
    # queue, which a later reader of the group starts from when the queues are raised again.
    takes_progress_of_unread_queues: bool = False

    # -- routes ------------------------------------------------------------------------

    @abstractmethod
    def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The topic's queues (TopicNotExistError when it has none)."""

    def sharding_index(self, sharding_key: str, queues: int) -> int:
        """Which of a topic's ``queues`` publish queues a sharding key's messages go to (a
        MessageQueueSelector by hash): crc32 on the embedded broker, as its v2 FIFO message groups."""
        return zlib.crc32(sharding_key.encode()) % queues

    @abstractmethod
    def topic_names(self) -> list[str]:
        """The users' topics there are now, sorted: no system topic (``%RETRY%``, ``%DLQ%``,
        ``RMQ_SYS_*``, ``SCHEDULE_TOPIC_XXXX``, ``TBW102``, ..., see ``is_system_topic``)."""

    # -- offsets -----------------------------------------------------------------------

    def queue_bounds(
        self, topic: str, *, unreachable: set[str] | None = None, unreadable: set[str] | None = None
    ) -> dict[MessageQueue, QueueBounds] | None:
        """Bounds of every readable queue of ``topic``; None if the topic does not exist.

        One stats request per broker of the route, not two requests per queue.
        With ``unreachable``, a broker of the route that does not answer (killed,
        restarting, before the name servers notice) or serves no reads (a RocketMQ
        broker whose master is down and whose slave has slaveReadEnable=false) is
        added to it and its queues are left out; without it, its error is raised.
        With ``unreadable`` (and without ``unreachable``), a broker that serves no reads
        (:class:`~pyspark_pymq.errors.BrokerNotReadableError`) is added to it and its
        queues are left out; the error of one that does not answer is raised.
        """
        from ..errors import (
            BrokerNotReadableError,
            BrokerUnavailableError,
            RequestTimeoutError,
            TopicNotExistError,
        )

        try:
            route = self.route(topic, refresh=True)
        except TopicNotExistError:
            return None
        if not route.subscribe_queues:
            return None
        stats: dict[MessageQueue, QueueBounds] = {}
        skipped: set[str] = set()
        for broker in sorted({mq.broker_name for mq in route.subscribe_queues}):
            try:
                found = self._broker_bounds(topic, broker)
            except (BrokerUnavailableError, RequestTimeoutError) as err:
                if unreachable is not None:
                    unreachable.add(broker)
                elif unreadable is not None and isinstance(err, BrokerNotReadableError):
                    unreadable.add(broker)
                else:
                    raise
                skipped.add(broker)
                continue
            if found is None:
                return None
            stats.update(found)
        out: dict[MessageQueue, QueueBounds] = {}
        for mq in route.subscribe_queues:
            if mq.broker_name in skipped:
                continue
            bounds = stats.get(mq)
            if bounds is None:  # a queue the broker has not written yet
                topic_id = next((b.topic_id for q, b in stats.items() if q.broker_name == mq.broker_name), 0)
                bounds = QueueBounds(self.min_offset(mq), self.max_offset(mq), topic_id)
            out[mq] = bounds
        return out

    @abstractmethod
    def _broker_bounds(self, topic: str, broker_name: str) -> dict[MessageQueue, QueueBounds] | None:
        """The bounds of ``topic``'s queues on one broker; None: the topic is gone everywhere.

        BrokerUnavailableError (or RequestTimeoutError) when the broker does not answer, or
        answers but would refuse the pulls of its queues (:meth:`queue_bounds` leaves them out).
        """

    def unavailable_brokers(self, queues: Iterable[MessageQueue]) -> set[str]:
        """Which brokers of ``queues`` (queues missing from their topics' routes) still hold
        them: down, restarting, or ahead of the name servers (their queues wait; nothing was
        deleted).

        Where a backend cannot tell, none: a queue missing from its topic's route
        then counts as gone (failOnDataLoss decides).
        """
        return set()

    def unlisted_queues(self, topics: Sequence[str]) -> dict[str, dict[str, list[MessageQueue]]]:
        """Queues of ``topics`` held by brokers that their routes do not list now (topic -> broker
        -> its queues): a broker that registered again but whose routes the name servers have not
        taken (yet). A read planned from the routes alone would leave their messages out.

        Where a topic's route is the only place its queues are known, none.
        """
        return {}

    @abstractmethod
    def min_offset(self, mq: MessageQueue) -> int: ...

    @abstractmethod
    def max_offset(self, mq: MessageQueue) -> int:
        """One past the last message of ``mq``."""

    @abstractmethod
    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (max offset if none)."""

    @abstractmethod
    def committed(self, group: str, mq: MessageQueue) -> int:
        """The group's progress on ``mq`` (the next offset to consume), -1 if none."""

    @abstractmethod
    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        """Record the group's progress (one request per broker where the wire allows)."""

    def check_consumer_group(self, group: str, queues: Iterable[MessageQueue]) -> None:  # noqa: B027
        """Raise if the brokers of ``queues`` refuse pulls of ``group`` (a group that does not
        exist where brokers do not create groups), so that a query fails before its tasks.

        Nothing to check by default (the pymq broker takes any group).
        """

    def check_client_config(
        self, group: str, queues: Iterable[MessageQueue], subscription: str, expression_type: str
    ) -> None:
        """Raise if a broker of ``queues`` would refuse ``group``'s subscription (SQL92 where
        the broker has property filters off), so that a query fails before its tasks.

        RocketMQ's consumers ask each broker before they start (CHECK_CLIENT_CONFIG), for
        expressions other than TAG: :meth:`_check_client_config` once per broker.
        """
        if expression_type.upper() == "TAG":
            return
        for mq in first_queue_per_broker(queues).values():
            self._check_client_config(group, mq, subscription, expression_type)

    def _check_client_config(  # noqa: B027
        self, group: str, mq: MessageQueue, subscription: str, expression_type: str
    ) -> None:
        """Ask ``mq``'s broker whether it takes the subscription; nothing to ask by default."""

    def register_consumer(self, group: str, topics: Sequence[str]) -> None:  # noqa: B027
        """Tell the brokers that ``group`` consumes ``topics`` (CLUSTERING).

        Where the broker needs it (RocketMQ creates ``%RETRY%<group>`` when a
        consumer registers, and its tools show a group's progress only then).
        Nothing to do by default.
        """

    # -- pull ----------------------------------------------------------------------------

    @abstractmethod
    def pull(
        self,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
        timeout_s: float | None = None,
    ) -> PullBatch: ...

    @abstractmethod
    def decode_arrow(
        self,
        pulled: PullBatch,
        mq: MessageQueue,
        *,
        retry: bool,
        end_offset: int | None = None,
        subscription: str = "*",
        expression_type: str = "TAG",
        columns: tuple[str, ...] | None = None,
    ) -> pa.RecordBatch:
        """The rows of a pull, in the source schema (rows at ``end_offset`` or beyond left out).

        ``subscription`` is applied again where the broker filters only
        approximately (RocketMQ filters tags by hash code on the broker).
        ``columns``: the source columns the caller keeps (None: all); the others
        may be left null, so that nothing is decoded for them.
        """

    @abstractmethod
    def decode_messages(
        self, pulled: PullBatch, mq: MessageQueue, *, subscription: str = "*", expression_type: str = "TAG"
    ) -> list[MessageExt]: ...

    # -- send ----------------------------------------------------------------------------

    @abstractmethod
    def encode_records(
        self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes],
        flags: Sequence[int] | None = None,
    ) -> tuple[bytes, npt.NDArray[np.int32]]:
        """Message images of this backend, back to back, and their sizes.

        ``properties[i]`` is RocketMQ's encoding (``name\\x01value\\x02`` ...) and
        starts with UNIQ_KEY.
        """

    @abstractmethod
    def frame_columns(
        self, topic: str, bodies: pa.Array, body_lens: npt.NDArray[np.int64],
        property_parts: Sequence[pa.Array | pa.Scalar], property_lens: npt.NDArray[np.int64],
    ) -> tuple[bytes | memoryview, npt.NDArray[np.int32]] | None:
        """:meth:`encode_records` for Arrow columns, vectorised (the Spark sink's bulk path).

        Each message's properties are the concatenation of ``property_parts``
        (arrays of one value per row, or scalars shared by all). None when a
        message would not fit this backend's image; the caller then takes its
        per-row path, which names the row.
        """

    @abstractmethod
    def send(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, *,
        half: bool = False,
    ) -> SendResult:
        """Send ``request`` to ``mq`` and wait (errors: PymqError subclasses).

        ``half``: store transaction half messages (one transaction per message).
        """

    @abstractmethod
    def send_future(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, *,
        half: bool = False,
    ) -> Future[SendResult]:
        """Start a send; the future fails with a PymqError subclass."""

    # -- send back -------------------------------------------------------------------------

    @abstractmethod
    def send_back(
        self,
        group: str,
        columns: SendBackColumns,
        max_reconsume_times: int | None,
    ) -> list[SendBackOutcome | None]:
        """Ask the broker to send consumed messages back (to %RETRY% or %DLQ%).

        One outcome per item; None where the broker could not do it (the caller
        then sends that message to %RETRY%<group> itself, RocketMQ's fallback).
        """



def backend_config(
    endpoint: str | None, namesrv_addr: str | None, access_key: str | None = None,
    secret_key: str | None = None, tls: TlsConfig | None = None,
) -> BackendConfig:
    """The backend of a client class: exactly one of ``endpoint`` and ``namesrv_addr``."""
    if (endpoint is None) == (namesrv_addr is None):
        raise ValueError(
            "give exactly one of endpoint ('host:port' of a pymq broker) and namesrv_addr "
            f"('host:9876;host2:9876' of Apache RocketMQ), got endpoint={endpoint!r}, "
            f"namesrv_addr={namesrv_addr!r}"
        )
    check_credentials(access_key, secret_key)
    return BackendConfig(endpoint, namesrv_addr, access_key, secret_key, tls)


def client_backend(
    backend: Backend | None, timeout_s: float, endpoint: str | None, namesrv_addr: str | None,
    access_key: str | None, secret_key: str | None, tls: bool | TlsConfig | None, tls_ca_file: str | None,
    tls_cert_file: str | None, tls_key_file: str | None,
) -> Backend:
    """A client class's backend: ``backend`` (one the process shares, as a RocketMQ client
    instance) or a new one for the connection keywords; ValueError when both are given."""
    if backend is None:
        return open_backend(backend_config(endpoint, namesrv_addr, access_key, secret_key,
                                           client_tls(tls, tls_ca_file, tls_cert_file, tls_key_file)),
                            timeout_s)
    given = {"endpoint": endpoint, "namesrv_addr": namesrv_addr, "access_key": access_key,
             "secret_key": secret_key, "tls": tls, "tls_ca_file": tls_ca_file,
             "tls_cert_file": tls_cert_file, "tls_key_file": tls_key_file}
    named = [name for name, value in given.items() if value]
    if named:
        raise ValueError(f"give backend= or the connection keywords, not both: got backend= and "
                         f"{', '.join(named)} (the backend's connection is {backend.config.address!r})")
    return backend


def client_tls(
    tls: bool | TlsConfig | None, tls_ca_file: str | None, tls_cert_file: str | None,
    tls_key_file: str | None,
) -> TlsConfig | None:
    """The TLS of a client class's keywords: ``tls=True`` (system trust store), a TlsConfig, or the files.

    Any of ``tls_ca_file`` / ``tls_cert_file`` / ``tls_key_file`` turns TLS on; ValueError
    names a file that cannot be read.
    """
    if isinstance(tls, TlsConfig):
        if tls_ca_file or tls_cert_file or tls_key_file:
            raise ValueError("give tls=TlsConfig(...) or the tls_*_file keywords, not both")
        return tls
    if not tls and not (tls_ca_file or tls_cert_file or tls_key_file):
        return None
    config = TlsConfig(tls_ca_file, tls_cert_file, tls_key_file)
    config.check_files({"ca_file": "tls_ca_file", "cert_file": "tls_cert_file", "key_file": "tls_key_file"})
    return config


def check_namesrv_addr(value: object) -> str:
    """``value`` as RocketMQ's ``host:port;host2:port`` list, or a ValueError naming it."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"namesrvAddr must be 'host:port' or 'host:port;host2:port', got {value!r}")
    addrs = [a.strip() for a in value.strip().strip(";").split(";")]
    for addr in addrs:
        problem = _host_port_problem(addr)
        if problem:
            raise ValueError(
                f"namesrvAddr {value!r}: {addr!r} {problem} (e.g. '127.0.0.1:9876;127.0.0.1:9877')"
            )
    return ";".join(addrs)


def check_endpoint(endpoint: object) -> str:
    """``endpoint`` as ``host:port``, or a ValueError naming the value."""
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValueError(f"endpoint must be 'host:port', got {endpoint!r}")
    problem = _host_port_problem(endpoint.strip())
    if problem:
        raise ValueError(f"endpoint {endpoint!r} {problem} (e.g. '127.0.0.1:8081')")
    return endpoint.strip()


def _host_port_problem(addr: str) -> str | None:
    """What is wrong with ``addr`` as ``host:port``, None if nothing."""
    scheme, sep, _ = addr.partition("://")
    if sep:  # 'http://host:port' passed as host 'http://host' and took a DNS failure to show
        return f"has a scheme: drop '{scheme}://' and give host:port (TLS is the tls option)"
    if any(c in addr for c in ",; \t"):  # 'h1:8081,h2:8082' passed as host 'h1:8081,h2'
        return ("holds more than one address: endpoint takes one pymq broker's host:port, and "
                "namesrvAddr Apache RocketMQ's name servers separated by ';'")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdecimal() or not 0 < int(port) < 65536:
        return "is not 'host:port' with a port in 1..65535"
    return None


def _read_secret(path: str, prefix: str) -> str:
    """The secret key in the first line of ``path`` (option ``secretKeyFile``); errors name the
    file, never what it holds."""
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.readline().strip()
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or "not UTF-8 text"
        raise ValueError(f"{prefix} secretKeyFile={path!r} cannot be read on the driver: {why}") from None
    if not secret:
        raise ValueError(f"{prefix} secretKeyFile={path!r} has no secret key on its first line")
    return secret


def parse_backend_options(get: Callable[[str], str | None], prefix: str) -> BackendConfig:
    """The backend named by Spark options ``endpoint`` / ``namesrvAddr`` (+ ``accessKey``, ``secretKey``
    or ``secretKeyFile``, ``tls``, ``tlsCaFile``, ``tlsCertFile``, ``tlsKeyFile``: both backends sign
    and encrypt).

    Exactly one of ``endpoint`` and ``namesrvAddr``; errors name the option and
    the value (never the secret key's).
    """
    endpoint, namesrv = get("endpoint") or None, get("namesrvAddr") or None
    if endpoint and namesrv:
        raise ValueError(
            f"{prefix}s endpoint={endpoint!r} and namesrvAddr={namesrv!r} are both set: use endpoint "
            "for a pymq broker or namesrvAddr for Apache RocketMQ's name servers, not both"
        )
    if not endpoint and not namesrv:
        raise ValueError(
            f"{prefix} endpoint is required: set .option('endpoint', 'host:port') to the address "
            "pymq-broker prints ('pymq broker listening on HOST:PORT'), or "
            ".option('namesrvAddr', 'host:9876') for Apache RocketMQ"
        )
    access_key, secret_key = get("accessKey") or None, get("secretKey") or None
    secret_file = get("secretKeyFile") or None
    if secret_file is not None:
        if secret_key is not None:
            raise ValueError(f"{prefix}s secretKey and secretKeyFile={secret_file!r} are both set: "
                             "give the secret key one way")
        secret_key = _read_secret(secret_file, prefix)
    if (access_key is None) != (secret_key is None):
        raise ValueError(
            f"{prefix} accessKey and secretKey go together (secretKey or secretKeyFile): set both "
            "(RocketMQ ACL credentials) or neither"
        )
    tls = parse_tls_options(get, prefix)
    try:
        if namesrv:
            return BackendConfig(None, check_namesrv_addr(namesrv), access_key, secret_key, tls)
        return BackendConfig(check_endpoint(endpoint), None, access_key, secret_key, tls)
    except ValueError as err:
        name, value = ("namesrvAddr", namesrv) if namesrv else ("endpoint", endpoint)
        raise ValueError(f"{prefix} {name}={value!r} is not valid: {err}") from None


_TLS_FILE_OPTIONS = {"ca_file": "tlsCaFile", "cert_file": "tlsCertFile", "key_file": "tlsKeyFile"}


def parse_tls_options(get: Callable[[str], str | None], prefix: str) -> TlsConfig | None:
    """Spark options ``tls`` (true/false) and ``tlsCaFile`` / ``tlsCertFile`` / ``tlsKeyFile``."""
    raw = (get("tls") or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{prefix} tls={get('tls')!r} is not valid: use true or false")
    files = {attr: get(name) or None for attr, name in _TLS_FILE_OPTIONS.items()}
    if raw == "false":
        given = [f"{_TLS_FILE_OPTIONS[a]}={v!r}" for a, v in files.items() if v]
        if given:
            raise ValueError(f"{prefix} {given[0]} is set but tls is not: add .option('tls', 'true')")
        return None
    try:
        config = TlsConfig(**files)
    except ValueError:
        raise ValueError(
            f"{prefix}s tlsCertFile and tlsKeyFile go together: set both (a client certificate for "
            "mutual TLS) or neither"
        ) from None
    try:
        config.check_files(_TLS_FILE_OPTIONS)
    except ValueError as err:
        raise ValueError(f"{prefix} {err}") from None
    return config


def first_queue_per_broker(queues: Iterable[MessageQueue]) -> dict[str, MessageQueue]:
    """Broker name -> the first of ``queues`` on it (in order): one request per broker."""
    first: dict[str, MessageQueue] = {}
    for mq in sorted(queues):
        first.setdefault(mq.broker_name, mq)
    return first


def check_subscription(config: BackendConfig, expression: str, expression_type: str) -> None:
    """ValueError naming ``expression`` when ``config``'s broker would refuse it.

    Both backends take RocketMQ's SQL92 grammar (the real broker needs
    ``enablePropertyFilter=true``) and tag expressions, checked here with the embedded broker's
    parsers.
    """
    if expression_type == "SQL92":
        from pymq_broker.filter.sql92 import compile_sql92

        compile_sql92(expression)
    else:
        # the broker's own rule, so an empty tag ('TagA ||') fails here and not in the first task
        # that meets a message
        check_tags(expression)


_backends: dict[tuple[int, BackendConfig, float], Backend] = {}
_backends_lock = threading.Lock()


def cached_backend(config: BackendConfig, timeout_s: float = 10.0) -> Backend:
    """This process's backend for ``config`` (Spark reuses Python workers across tasks).

    Keyed by pid too, so a forked process never uses its parent's connections.
    """
    import os

    key = (os.getpid(), config, timeout_s)
    backend = _backends.get(key)
    if backend is None:
        with _backends_lock:
            backend = _backends.get(key)
            if backend is None:
                backend = open_backend(config, timeout_s)
                _backends[key] = backend
    return backend


def open_backend(config: BackendConfig, timeout_s: float = 10.0) -> Backend:
    """A new backend: pymq's gRPC for ``endpoint``, RocketMQ's remoting for ``namesrv_addr``."""
    tune_malloc_once()
    if config.namesrv_addr:
        from .rocketmq import RocketMQBackend

        return RocketMQBackend(config, timeout_s)
    from .pymq import PymqBackend

    return PymqBackend(config, timeout_s)
