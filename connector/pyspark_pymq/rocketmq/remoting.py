"""TCP connections to RocketMQ name servers and brokers, with many requests in flight each.

:class:`RemotingClient` is pymq's ``NettyRemotingClient``: one connection per address,
requests matched to their responses by ``opaque``, and requests from the broker
(``CHECK_TRANSACTION_STATE``...) handed to handlers registered per request code.

Usage::

    client = RemotingClient.shared()                      # this process's client
    cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"})
    response = client.invoke_sync("127.0.0.1:10911", cmd, timeout_s=3.0)
    future = client.invoke_async("127.0.0.1:10911", cmd2, timeout_s=3.0)   # many at once
    client.invoke_oneway("127.0.0.1:10911", cmd3)                            # no answer

Errors (``pyspark_pymq.errors``): a refused, failed or closed connection raises (or fails
the future with) :class:`BrokerUnavailableError` naming the address; no answer within
``timeout_s`` raises :class:`RequestTimeoutError` naming the address and the request. A
response is returned whatever its code: mapping codes to errors is the caller's job
(:mod:`pyspark_pymq.rocketmq.api`).

Connections are kept per (process id, address): Spark forks Python workers from a
daemon, and a forked worker opens its own connection instead of writing into its
parent's socket (an at-fork hook also drops the parent's sockets and locks in the
child). A closed connection fails every request waiting on it and is opened again by
the next request. Each connection has one reader thread; futures complete, and their
done-callbacks run, on that thread, so callbacks must be quick and must not block on
another request to the same address.

Requests from the broker (flag bit 0 clear) go to the handler registered for their code
with :meth:`RemotingClient.register_processor`, on a small thread pool; its returned
command is sent back as the response. A request without a handler is answered
``REQUEST_CODE_NOT_SUPPORTED`` unless it is one-way (e.g. ``NOTIFY_CONSUMER_IDS_CHANGED``),
as RocketMQ's Java client does.

Many requests at once without a Future each (a pull window: hundreds of ``PULL_MESSAGE``
of one queue): :meth:`RemotingClient.send_frames` writes pre-encoded frames
(:class:`~.protocol.FrameTemplate`) in one system call, and their answers go to one
:class:`ResponseWaiter`; a JSON answer reaches it unparsed (``on_json``), so the waiter
reads only the header fields it needs. Time-outs and closed connections fail its
requests as they fail futures.

Signing (RocketMQ ACL, ``AclClientRPCHook``): pass ``rpc_hook=AclClientRPCHook(
SessionCredentials(access_key, secret_key))`` and every request carries ``AccessKey``,
``Signature`` and optionally ``SecurityToken`` in its ext fields.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import hmac
import itertools
import logging
import math
import os
import re
import socket
import ssl
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import CONNECT_HINT, BrokerUnavailableError, PymqError, RequestTimeoutError
from ..tls import TlsConfig
from .protocol import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    MAX_FRAME_LENGTH,
    SERIALIZE_JSON,
    RemotingCommand,
    ResponseCode,
    decode_header,
    request_code_name,
)

log = logging.getLogger(__name__)

__all__ = [
    "AclClientRPCHook",
    "RPCHook",
    "RemotingClient",
    "RequestHandler",
    "ResponseWaiter",
    "SessionCredentials",
    "parse_address",
    "sign_request",
]

# A broker's pull answer is at most maxTransferBytesOnMessageInMemory (256 KiB by default) of
# messages: one buffer of this size takes most answers, or many small ones, in one recv.
READ_BUFFER = 512 * 1024
# A body at least this large is read straight into a buffer of its own (handed out as it is);
# smaller ones are copied out of the shared read buffer.
DIRECT_BODY = 64 * 1024
# When less than this is free behind the data, the partial frame moves to the buffer's start.
MIN_READ_SPACE = 64 * 1024
# Concatenating a small body to its header costs less than a second write.
JOIN_BODY_BELOW = 16 * 1024
# Ciphertext taken from the socket per recv when TLS is on (several 16 KiB TLS records).
TLS_READ_BUFFER = 256 * 1024
# Plaintext encrypted and sent at a time (several TLS records).
TLS_WRITE_SLICE = 256 * 1024
# How long the reader thread may wait to send what TLS itself has to answer (a KeyUpdate).
TLS_CONTROL_TIMEOUT_S = 10.0
# SO_SNDTIMEO's ceiling for writes whose time-out is "forever".
MAX_SEND_TIMEOUT_S = 86_400.0
# How often the sweeper fails asynchronous requests that outlived their time-out.
SWEEP_INTERVAL_S = 0.05
DEFAULT_CONNECT_TIMEOUT_S = 3.0
CONNECT_BACKOFF_S = 1.0
"""After a failed connection attempt, requests to that address fail at once for this long: 256
async send-backs to a host that went silent would each wait the connect time-out again."""

_INT2 = struct.Struct(">ii")
_TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds
# The top-level numbers of a JSON header (ext field values are quoted strings, so they never match).
_JSON_OPAQUE = re.compile(rb'"opaque":(-?[0-9]+)')
_JSON_FLAG = re.compile(rb'"flag":([0-9]+)')
_ADDRESS = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+)):([0-9]{1,5})")

RequestHandler = Callable[[str, RemotingCommand], RemotingCommand | None]
"""A handler of broker requests: ``(address, request) -> response or None``."""


class ResponseWaiter(Protocol):
    """Takes the answers to requests sent with :meth:`RemotingClient.send_frames`.

    Called on the connection's reader thread (``set_exception`` also on the time-out
    sweeper's or on a thread that closes the connection): quick, never blocking, never
    raising.
    """

    def on_json(self, opaque: int, header: memoryview | bytes, body: bytes | bytearray) -> None:
        """An answer with a JSON header, unparsed; ``header`` is valid during the call only."""

    def set_result(self, response: RemotingCommand) -> None:
        """An answer in RocketMQ's binary header form, decoded."""

    def set_exception(self, error: BaseException) -> None:
        """A request failed: no answer in time, or its connection closed."""


def parse_address(addr: object) -> tuple[str, int]:
    """``(host, port)`` of ``"host:port"`` (``"[::1]:9876"`` for IPv6), or a ValueError."""
    if isinstance(addr, str):
        m = _ADDRESS.fullmatch(addr.strip())
        if m is not None and 0 < int(m.group(3)) < 65536:
            return m.group(1) or m.group(2), int(m.group(3))
    raise ValueError(f"address {addr!r} is not 'host:port' with a port in 1..65535 (e.g. '127.0.0.1:9876')")


# -- signing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionCredentials:
    """RocketMQ ACL credentials (``SessionCredentials``); the secret key is never shown."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)


class RPCHook(Protocol):
    """Called with every request before it is encoded (``RPCHook.doBeforeRequest``)."""

    def do_before_request(self, addr: str, request: RemotingCommand) -> None: ...


def sign_request(ext_fields: dict[str, str], body: bytes | bytearray, secret_key: str) -> str:
    """RocketMQ's request signature: Base64(HmacSHA1(secret, sorted field values + body)).

    As ``AclUtils.combineRequestContent``: the values (not names) of every ext field but
    ``Signature``, in the order of their sorted names, as UTF-8, then the body.
    """
    content = "".join(v for k, v in sorted(ext_fields.items()) if k != "Signature").encode()
    mac = hmac.new(secret_key.encode(), content, hashlib.sha1)
    if body:
        mac.update(body)
    return base64.b64encode(mac.digest()).decode("ascii")


class AclClientRPCHook:
    """Signs requests with access key / secret key, as RocketMQ's ``AclClientRPCHook``."""

    def __init__(self, credentials: SessionCredentials) -> None:
        self.credentials = credentials

    def do_before_request(self, addr: str, request: RemotingCommand) -> None:
        c = self.credentials
        request.ext_fields["AccessKey"] = c.access_key
        if c.security_token is not None:
            request.ext_fields["SecurityToken"] = c.security_token
        request.ext_fields["Signature"] = sign_request(request.ext_fields, request.body, c.secret_key)


# -- one connection --------------------------------------------------------------------------


class _ConnectionClosed(Exception):
    pass


class _NotWritten(Exception):
    """Nothing of a request was written by its deadline; the connection is fine."""


class _SendTimeout(TimeoutError):
    """The peer took ``sent`` of ``total`` bytes by the deadline."""

    def __init__(self, sent: int, total: int) -> None:
        super().__init__(f"{sent} of {total} bytes written")
        self.sent = sent
        self.total = total


class _Wire:
    """The sending side of a socket: every write done by a deadline, or :class:`_SendTimeout`.

    ``SO_SNDTIMEO`` bounds each blocking system call and leaves the reader thread's ``recv``
    unbounded, which ``socket.settimeout`` (one time-out for both directions) would not; it
    is lowered to what is left before each call, so a peer that reads a little at a time
    cannot stretch a write past its deadline. Callers serialize their writes.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._timeout = -1.0  # what SO_SNDTIMEO is set to, in seconds

    def send_all(self, parts: Sequence[bytes | bytearray | memoryview], deadline: float) -> None:
        views = [memoryview(p) for p in parts if len(p)]
        total = sum(len(v) for v in views)
        sent = 0
        while views:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _SendTimeout(sent, total)
            self._set_timeout(left)
            try:
                # sendmsg gathers header and body in one system call without joining them
                n = self.sock.send(views[0]) if len(views) == 1 else self.sock.sendmsg(views)
            except BlockingIOError:  # what was left of the time passed with nothing taken
                raise _SendTimeout(sent, total) from None
            sent += n
            while n and views:
                if n >= len(views[0]):
                    n -= len(views.pop(0))
                else:
                    views[0] = views[0][n:]
                    n = 0

    def _set_timeout(self, left: float) -> None:
        # A system call per frame costs more than it buys: keep a value between half of what
        # is left and what is left (a hair over is a few ms past the deadline at worst).
        if left / 2 <= self._timeout <= left + 0.005:
            return
        seconds = min(max(left, 0.001), MAX_SEND_TIMEOUT_S)
        if sys.platform == "win32":  # a DWORD of milliseconds there
            value = struct.pack("<I", math.ceil(seconds * 1000))
        else:
            micros = math.ceil(seconds * 1e6)
            value = _TIMEVAL.pack(micros // 1_000_000, micros % 1_000_000)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._timeout = seconds


class _TlsSession:
    """TLS over a connected socket through memory BIOs: the SSL object is never in two threads at once.

    An ``ssl.SSLSocket`` would have the reader thread inside ``SSL_read`` while writers are in
    ``SSL_write`` on the same SSL object; OpenSSL does not allow that (seen under load: writes
    failing with "EOF occurred in violation of protocol", requests never answered, heap
    corruption). Here the reader takes ciphertext off the socket itself and only decrypts under
    ``lock``; a writer encrypts under ``lock`` and sends what the outgoing BIO holds under
    ``wire_lock``, which keeps the records on the wire in the order they were sealed.
    """

    def __init__(self, sock: socket.socket, ssl_object: ssl.SSLObject, incoming: ssl.MemoryBIO,
                 outgoing: ssl.MemoryBIO) -> None:
        self.sock = sock
        self.ssl_object = ssl_object
        self.incoming = incoming
        self.outgoing = outgoing
        self.lock = threading.Lock()  # the SSL object and both BIOs
        self.wire_lock = threading.Lock()  # taken before ``lock``: ciphertext leaves in order
        self.wire = _Wire(sock)  # used under ``wire_lock``
        self._raw = memoryview(bytearray(TLS_READ_BUFFER))

    @classmethod
    def handshake(cls, context: ssl.SSLContext, sock: socket.socket, host: str,
                  deadline: float, timeout_s: float) -> _TlsSession:
        """Run the client handshake by the monotonic ``deadline`` (the end of a connect time-out
        of ``timeout_s``, which errors name); ssl.SSLError or OSError when it fails."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        ssl_object = context.wrap_bio(incoming, outgoing, server_hostname=host)
        while True:
            try:
                ssl_object.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                # the alert OpenSSL wrote (unknown CA, bad certificate...) tells the server why
                with contextlib.suppress(OSError):
                    sock.sendall(outgoing.read())
                raise
            if outgoing.pending:
                sock.sendall(outgoing.read())
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(TLS_READ_BUFFER)
            except TimeoutError:
                raise TimeoutError(f"no answer to the TLS handshake within {timeout_s:g} s") from None
            if not data:
                raise ConnectionResetError("the server closed the connection during the TLS handshake")
            incoming.write(data)
        if outgoing.pending:  # the client's Finished message
            sock.sendall(outgoing.read())
        return cls(sock, ssl_object, incoming, outgoing)

    def send(self, parts: Sequence[bytes | bytearray], deadline: float) -> None:
        """Encrypt and send ``parts`` by ``deadline`` (:class:`_SendTimeout`: the session is
        then unusable, the records' sequence numbers being spent)."""
        # In slices: the outgoing BIO (which never shrinks) stays small, and the reader waits
        # for ``lock`` one slice's encryption at a time, not a 4 MiB body's.
        with self.wire_lock:
            for part in parts:
                view = memoryview(part)
                for at in range(0, len(view), TLS_WRITE_SLICE):
                    with self.lock:
                        self.ssl_object.write(view[at : at + TLS_WRITE_SLICE])
                        sealed = self.outgoing.read()
                    self.wire.send_all((sealed,), deadline)

    def recv_into(self, buffer: memoryview) -> int:
        """Plaintext into ``buffer``, as ``socket.recv_into``: 0 once the peer closed."""
        while True:
            with self.lock:
                got: int
                try:
                    # with a buffer, read returns a count (typeshed says bytes)
                    got = self.ssl_object.read(len(buffer), buffer)  # type: ignore[assignment]
                except ssl.SSLWantReadError:
                    got = -1
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):  # close_notify, or a bare close
                    got = 0
                answer = self.outgoing.pending  # what reading produced (a KeyUpdate's answer)
            if answer:
                self._send_pending()
            if got >= 0:
                return got
            n = self.sock.recv_into(self._raw)
            with self.lock:
                if n:
                    self.incoming.write(self._raw[:n])
                else:
                    self.incoming.write_eof()
            if not n:
                return 0

    def _send_pending(self) -> None:
        with self.wire_lock:
            with self.lock:
                sealed = self.outgoing.read()
            if sealed:
                self.wire.send_all((sealed,), time.monotonic() + TLS_CONTROL_TIMEOUT_S)


class _Connection:
    """One socket, its reader thread, and the requests waiting for an answer on it."""

    # ``id()`` of a closed connection is often the next one's: a number of its own tells them apart
    _numbers = itertools.count(1)

    def __init__(self, client: RemotingClient, addr: str, sock: socket.socket,
                 tls: _TlsSession | None = None) -> None:
        self.number = next(self._numbers)
        self.client = client
        self.addr = addr
        self.sock = sock
        self.tls = tls
        self.recv_into: Callable[[memoryview], int] = sock.recv_into if tls is None else tls.recv_into
        self.pid = os.getpid()
        # opaque -> (future, monotonic deadline, request code, time-out)
        self.pending: dict[int, tuple[Future[RemotingCommand], float, int, float]] = {}
        # the same for requests of send_frames, answered to a ResponseWaiter
        self.waiting: dict[int, tuple[ResponseWaiter, float, int, float]] = {}
        self.send_lock = threading.Lock()
        self.wire = _Wire(sock)  # plaintext writes, under ``send_lock``
        self.broken = ""  # why a failed write left the stream unusable (set under ``send_lock``)
        self._close_lock = threading.Lock()
        self.closed = False
        self.close_reason = ""
        self.received = False  # any bytes from the peer yet
        self.reader = threading.Thread(
            target=self._read_loop, name=f"pymq-remoting-reader-{addr}", daemon=True
        )

    # writing

    def send(self, head: bytes, body: bytes | bytearray, deadline: float) -> None:
        """Write one frame by the monotonic ``deadline``.

        Raises :class:`_NotWritten` when nothing of it was written (other writers held the
        connection, or the peer took none of it): the connection is fine. Raises OSError
        when the socket failed or took only part of the frame: the connection is marked
        broken before any other writer can add to the stream, and the caller closes it.
        """
        wait = min(max(deadline - time.monotonic(), 0.001), threading.TIMEOUT_MAX)
        if not self.send_lock.acquire(timeout=wait):
            raise _NotWritten("earlier requests on the connection were still being written "
                              "(the peer reads slowly)")
        try:
            if self.closed or self.broken:
                raise OSError(f"connection closed ({self.close_reason or self.broken})")
            try:
                if self.tls is not None:
                    self.tls.send((head, body) if body else (head,), deadline)
                elif len(body) < JOIN_BODY_BELOW:
                    self.wire.send_all((head + body if body else head,), deadline)
                else:
                    self.wire.send_all((head, body), deadline)
            except _SendTimeout as err:
                if err.sent == 0 and self.tls is None:
                    raise _NotWritten("the peer took none of it (it reads slowly or stopped reading)") \
                        from None
                self.broken = (f"{self.addr} stopped reading: a request was written only in part "
                               "by its time-out")
                raise TimeoutError(self.broken) from None
            except OSError as err:
                self.broken = f"write failed: {err}"
                raise
        finally:
            self.send_lock.release()

    # reading

    def _read_loop(self) -> None:
        reason = "closed by the peer"
        try:
            self._read_frames()
        except _ConnectionClosed:
            if not self.received and self.client.tls is None:
                # What a server in TLS-only mode (RocketMQ's tls.server.mode=enforcing) does to
                # a plaintext client: it closes the connection without a word.
                reason += (" before answering anything: if it requires TLS, set the option tls=true "
                           "(tlsCaFile for a private CA)")
        except (OSError, ValueError, UnicodeDecodeError) as err:
            reason = f"{type(err).__name__}: {err}"
        self.close(reason)

    def _read_frames(self) -> None:
        recv_into = self.recv_into
        buf = bytearray(READ_BUFFER)
        view = memoryview(buf)
        start = end = 0
        unpack = _INT2.unpack_from
        dispatch = self._dispatch
        framed = False  # a whole frame came: the peer speaks the protocol
        while True:
            need = 0  # the size of the incomplete frame at `start`, once known
            while end - start >= 8:
                length, type_len = unpack(buf, start)
                header_len = type_len & 0xFFFFFF
                if not 4 <= length <= MAX_FRAME_LENGTH or header_len > length - 4:
                    if not framed:  # its first bytes: not a RocketMQ server at all
                        said = bytes(buf[start : min(end, start + 16)])
                        raise ValueError(
                            f"the server does not speak RocketMQ's remoting protocol (it answered "
                            f"{said!r}): is this the name server's port (9876) or a broker's? A pymq "
                            "broker is given as endpoint, not namesrvAddr")
                    raise ValueError(f"corrupt frame: length {length}, header length {header_len}")
                total = 4 + length
                if end - start >= total:
                    h0 = start + 8
                    b0 = h0 + header_len
                    start += total
                    framed = True
                    dispatch(view[h0:b0], type_len >> 24, bytes(view[b0:start]) if start > b0 else b"")
                    continue
                body_len = length - 4 - header_len
                if body_len >= DIRECT_BODY and end - start >= 8 + header_len:
                    # A large body goes straight into its own buffer: no copy out of ours.
                    b0 = start + 8 + header_len
                    header = bytes(view[start + 8 : b0])
                    body = bytearray(body_len)
                    have = end - b0
                    body[:have] = view[b0:end]
                    _recv_exactly(recv_into, memoryview(body)[have:])
                    start = end = 0
                    framed = True
                    dispatch(header, type_len >> 24, body)
                    continue
                need = total if body_len < DIRECT_BODY else 8 + header_len
                break
            if start == end:
                start = end = 0
            elif len(buf) - end < MIN_READ_SPACE or start + need > len(buf):
                n = end - start
                if need > len(buf):  # a header larger than the buffer: grow it
                    view.release()
                    grown = bytearray(need + MIN_READ_SPACE)
                    grown[:n] = buf[start:end]
                    buf = grown
                    view = memoryview(buf)
                else:
                    buf[:n] = buf[start:end]
                start, end = 0, n
            got = recv_into(view[end:])
            if not got:
                raise _ConnectionClosed()
            self.received = True
            end += got

    def _dispatch(self, header: memoryview | bytes, serialize_type: int, body: bytes | bytearray) -> None:
        waiting = self.waiting
        if waiting and serialize_type == SERIALIZE_JSON:
            # an answer to send_frames goes to its waiter with the header unparsed
            m = _JSON_OPAQUE.search(header)
            if m is not None:
                opaque = int(m.group(1))
                if opaque in waiting:
                    f = _JSON_FLAG.search(header)
                    if f is not None and int(f.group(1)) & FLAG_RESPONSE:
                        waiter = waiting.pop(opaque, None)
                        if waiter is not None:
                            waiter[0].on_json(opaque, header, body)
                        return
        cmd = decode_header(header, serialize_type)
        cmd.body = body
        if cmd.flag & FLAG_RESPONSE:
            entry = self.pending.pop(cmd.opaque, None)
            # An answer nobody waits for any more (timed out) is dropped, as the Java client does.
            if entry is not None:
                entry[0].set_result(cmd)
            elif waiting:
                waited = waiting.pop(cmd.opaque, None)
                if waited is not None:
                    waited[0].set_result(cmd)
        else:
            self.client._on_request(self, cmd)

    # closing

    def close(self, reason: str) -> None:
        """Close the socket and fail every pending request (idempotent; never waits for a
        writer that is stuck: the shutdown fails its write first)."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
            self.close_reason = reason
        if self.pid == os.getpid():
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked writer and the reader
            # no writer is inside a system call on the descriptor it closes
            with self.send_lock, self.tls.wire_lock if self.tls is not None else contextlib.nullcontext():
                self.sock.close()
        else:
            self.sock.close()
        self.client._forget(self)
        for table in (self.pending, self.waiting):
            while table:
                try:
                    opaque, (fut, _, code, _) = table.popitem()
                except KeyError:
                    break
                fut.set_exception(
                    BrokerUnavailableError(
                        f"connection to {self.addr} closed while waiting for the answer to "
                        f"{request_code_name(code)} (opaque {opaque}): {reason}"
                    )
                )


def _recv_exactly(recv_into: Callable[[memoryview], int], mv: memoryview) -> None:
    while mv:
        got = recv_into(mv)
        if not got:
            raise _ConnectionClosed()
        mv = mv[got:]


# -- the client ------------------------------------------------------------------------------

_CLIENTS: weakref.WeakSet[RemotingClient] = weakref.WeakSet()
_SHARED: dict[tuple[SessionCredentials | None, TlsConfig | None], RemotingClient] = {}
_SHARED_LOCK = threading.Lock()


class RemotingClient:
    """Requests to RocketMQ name servers and brokers over pooled TCP connections.

    Args:
        rpc_hook: called with every request before it is sent (e.g. :class:`AclClientRPCHook`).
        connect_timeout_s: the longest a connection attempt may take (at most the
            request's own time-out), TLS handshake included.
        tls: connect with TLS (RocketMQ's ``tls.server.mode=enforcing`` or ``permissive``
            servers); ``None``: plaintext.

    Thread-safe. Prefer :meth:`shared` (one client, hence one connection per address, for
    the whole process) over new instances: brokers tie consumer registrations
    (``HEART_BEAT``) to the connection they came in on.
    """

    def __init__(
        self,
        *,
        rpc_hook: RPCHook | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        tls: TlsConfig | None = None,
    ) -> None:
        self.rpc_hook = rpc_hook
        self.connect_timeout_s = connect_timeout_s
        self.tls = tls
        self._ssl_context: ssl.SSLContext | None = None
        self._processors: dict[int, RequestHandler] = {}
        self._opaque = itertools.count(1)
        self._closed = False
        self._reset()
        _CLIENTS.add(self)

    def _reset(self) -> None:
        # Also the at-fork hook's work: a child starts with no sockets, threads or held locks.
        self._conns: dict[tuple[int, str], _Connection] = {}
        self._lock = threading.Lock()
        self._connect_locks: dict[str, threading.Lock] = {}
        self._connect_failures: dict[str, tuple[float, str]] = {}  # addr -> (when, why)
        self._sweeper: threading.Thread | None = None
        self._wake = threading.Event()
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def shared(
        cls, credentials: SessionCredentials | None = None, tls: TlsConfig | None = None
    ) -> RemotingClient:
        """The process-wide client (one per credentials and TLS settings), made on first use."""
        key = (credentials, tls)
        client = _SHARED.get(key)
        if client is None or client._closed:
            with _SHARED_LOCK:
                client = _SHARED.get(key)
                if client is None or client._closed:
                    hook = AclClientRPCHook(credentials) if credentials is not None else None
                    client = cls(rpc_hook=hook, tls=tls)
                    _SHARED[key] = client
        return client

    def register_processor(self, request_code: int, handler: RequestHandler) -> None:
        """Handle broker requests with ``request_code`` (e.g. ``CHECK_TRANSACTION_STATE``).

        The handler gets ``(address, request)`` on a pool thread; a command it returns is
        sent back as the response (its opaque and response flag are set here); an
        exception is answered ``SYSTEM_ERROR`` with its text.
        """
        self._processors[request_code] = handler

    # -- requests ---------------------------------------------------------------------------

    def invoke_sync(self, addr: str, request: RemotingCommand, timeout_s: float) -> RemotingCommand:
        """Send ``request`` and wait for its response (any code) at most ``timeout_s``."""
        conn, opaque, fut = self._start(addr, request, timeout_s)
        try:
            return fut.result(timeout_s)
        except concurrent.futures.TimeoutError:
            if conn is None or conn.pending.pop(opaque, None) is not None:
                raise self._timeout_error(addr, request.code, opaque, timeout_s) from None
        # the reader, the sweeper or a close took it from the table just now: it is being completed
        return fut.result()

    def invoke_async(self, addr: str, request: RemotingCommand, timeout_s: float) -> Future[RemotingCommand]:
        """Send ``request``; the future gets its response, or the error (never raises itself)."""
        return self._start(addr, request, timeout_s)[2]

    def invoke_oneway(self, addr: str, request: RemotingCommand, timeout_s: float | None = None) -> None:
        """Send ``request`` marked one-way: the broker does not answer it.

        Raises :class:`BrokerUnavailableError` if it cannot be written (or was written in part:
        the connection is closed then), :class:`RequestTimeoutError` if nothing of it could be
        written within ``timeout_s``; that it was written says nothing about whether the broker
        processed it.
        """
        request.flag = (request.flag | FLAG_ONEWAY) & ~FLAG_RESPONSE
        request.opaque = self._next_opaque()
        timeout = self.connect_timeout_s if timeout_s is None else timeout_s
        conn = self._connection(addr, timeout)
        if self.rpc_hook is not None:
            self.rpc_hook.do_before_request(addr, request)
        try:
            conn.send(request.encode_head(), request.body, time.monotonic() + timeout)
        except _NotWritten as err:
            raise self._unsent_error(addr, request.code, timeout, err) from None
        except OSError as err:
            conn.close(f"write failed: {err}")
            raise self._write_error(addr, request.code, err) from None

    def _start(
        self, addr: str, request: RemotingCommand, timeout_s: float
    ) -> tuple[_Connection | None, int, Future[RemotingCommand]]:
        fut: Future[RemotingCommand] = Future()
        # running futures cannot be cancelled: only the reader, the sweeper or a close completes them
        fut.set_running_or_notify_cancel()
        request.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        opaque = request.opaque = self._next_opaque()
        try:
            conn = self._connection(addr, timeout_s)
        except PymqError as err:
            fut.set_exception(err)
            return None, opaque, fut
        if self.rpc_hook is not None:
            self.rpc_hook.do_before_request(addr, request)
        head = request.encode_head()
        deadline = time.monotonic() + timeout_s
        conn.pending[opaque] = (fut, deadline, request.code, timeout_s)
        if self._sweeper is None:
            self._start_sweeper()
        try:
            conn.send(head, request.body, deadline)
        except _NotWritten as err:
            if conn.pending.pop(opaque, None) is not None:
                fut.set_exception(self._unsent_error(addr, request.code, timeout_s, err))
        except OSError as err:
            if conn.pending.pop(opaque, None) is not None:
                fut.set_exception(self._write_error(addr, request.code, err))
            conn.close(f"write failed: {err}")
        return conn, opaque, fut

    def _next_opaque(self) -> int:
        return next(self._opaque) & 0x7FFFFFFF

    def next_opaque(self) -> int:
        """A fresh request id, for a frame that :meth:`send_frames` sends."""
        return next(self._opaque) & 0x7FFFFFFF

    def encode_request(self, addr: str, request: RemotingCommand) -> tuple[int, bytes]:
        """``(opaque, frame)`` of ``request`` for :meth:`send_frames`: a fresh opaque, signed
        by the RPC hook if there is one."""
        request.flag &= ~(FLAG_RESPONSE | FLAG_ONEWAY)
        opaque = request.opaque = self.next_opaque()
        if self.rpc_hook is not None:
            self.rpc_hook.do_before_request(addr, request)
        return opaque, request.encode()

    def send_frames(
        self, addr: str, frames: Sequence[tuple[int, bytes]], waiter: ResponseWaiter, code: int,
        timeout_s: float,
    ) -> None:
        """Write whole request frames, ``(opaque, frame)`` each, in one write; answers go to ``waiter``.

        The frames are the caller's (:meth:`encode_request`, or a
        :class:`~.protocol.FrameTemplate` when there is no RPC hook to sign them), each with a
        fresh :meth:`next_opaque`; ``code`` names them in errors. Each request fails on
        ``waiter`` (``set_exception``) if no answer comes within ``timeout_s`` or its
        connection closes. Raises :class:`BrokerUnavailableError` when no connection can be
        made, or the write fails (the connection is closed then: its requests fail too).
        """
        conn = self._connection(addr, timeout_s)
        deadline = time.monotonic() + timeout_s
        entry = (waiter, deadline, code, timeout_s)
        waiting = conn.waiting
        for opaque, _ in frames:
            waiting[opaque] = entry
        if self._sweeper is None:
            self._start_sweeper()
        try:
            conn.send(b"".join([frame for _, frame in frames]), b"", deadline)
        except (_NotWritten, OSError) as err:
            for opaque, _ in frames:
                waiting.pop(opaque, None)
            if isinstance(err, _NotWritten):
                raise self._unsent_error(addr, code, timeout_s, err) from None
            conn.close(f"write failed: {err}")
            raise self._write_error(addr, code, err) from None

    def discard(self, addr: str, opaques: Sequence[int]) -> None:
        """Forget requests of :meth:`send_frames` whose answers are no longer wanted (dropped on arrival)."""
        conn = self._conns.get((os.getpid(), addr))
        if conn is not None:
            for opaque in opaques:
                conn.waiting.pop(opaque, None)

    @staticmethod
    def _timeout_error(addr: str, code: int, opaque: int, timeout_s: float) -> RequestTimeoutError:
        return RequestTimeoutError(
            f"{addr} did not answer {request_code_name(code)} (opaque {opaque}) within {timeout_s:g} s"
        )

    @staticmethod
    def _unsent_error(addr: str, code: int, timeout_s: float, why: _NotWritten) -> RequestTimeoutError:
        return RequestTimeoutError(
            f"could not send {request_code_name(code)} to {addr} within {timeout_s:g} s: {why}"
        )

    @staticmethod
    def _write_error(addr: str, code: int, err: OSError) -> BrokerUnavailableError:
        why = ("The connection was closed: the rest of a half-written request cannot follow."
               if isinstance(err, TimeoutError)
               else "The broker or name server closed the connection or went away.")
        return BrokerUnavailableError(f"could not send {request_code_name(code)} to {addr}: {err}. {why}")

    # -- connections ------------------------------------------------------------------------

    def _connection(self, addr: str, timeout_s: float) -> _Connection:
        key = (os.getpid(), addr)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise BrokerUnavailableError(f"the remoting client is closed; cannot reach {addr}")
        self._raise_if_failed_just_now(addr)
        with self._lock:
            lock = self._connect_locks.setdefault(addr, threading.Lock())
        timeout = max(0.001, min(self.connect_timeout_s, timeout_s))
        # one connection attempt per address at a time; the others wait for it within their own
        # time-out, and take its connection (or its failure)
        if not lock.acquire(timeout=timeout):
            raise BrokerUnavailableError(
                f"cannot connect to {addr}: another attempt to connect there did not end within "
                f"{timeout:g} s. {CONNECT_HINT}."
            )
        try:
            conn = self._conns.get(key)
            if conn is not None and not conn.closed:
                return conn
            self._raise_if_failed_just_now(addr)  # the attempt this caller waited for
            try:
                conn = self._connect(addr, timeout)
            except BrokerUnavailableError as err:
                self._connect_failures[addr] = (time.monotonic(), err.remark)
                raise
            self._connect_failures.pop(addr, None)
            self._conns[key] = conn
            conn.reader.start()
            return conn
        finally:
            lock.release()

    def _raise_if_failed_just_now(self, addr: str) -> None:
        failed = self._connect_failures.get(addr)
        if failed is not None and time.monotonic() - failed[0] < CONNECT_BACKOFF_S:
            raise BrokerUnavailableError(f"{failed[1]} (an attempt just now; the next after "
                                         f"{CONNECT_BACKOFF_S:g} s)")

    def _connect(self, addr: str, timeout: float) -> _Connection:
        """A new connection to ``addr`` (TCP, and TLS when set) within ``timeout``."""
        host, port = parse_address(addr)
        deadline = time.monotonic() + timeout  # for the TCP connect and the TLS handshake together
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError:
            raise BrokerUnavailableError(
                f"cannot connect to {addr}: no answer within {timeout:g} s. {CONNECT_HINT}."
            ) from None
        except OSError as err:
            raise BrokerUnavailableError(
                f"cannot connect to {addr}: {err.strerror or err}. {CONNECT_HINT}."
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        tls = None if self.tls is None else self._handshake(addr, host, sock, deadline, timeout)
        sock.settimeout(None)
        return _Connection(self, addr, sock, tls)

    def _handshake(
        self, addr: str, host: str, sock: socket.socket, deadline: float, timeout: float
    ) -> _TlsSession:
        """The TLS handshake within the connect time-out; errors name the address and the cause."""
        assert self.tls is not None
        if self._ssl_context is None:
            try:
                self._ssl_context = self.tls.ssl_context()
            except (OSError, ssl.SSLError) as err:
                sock.close()
                raise BrokerUnavailableError(f"cannot set up TLS for {addr}: {err}") from None
        try:
            return _TlsSession.handshake(self._ssl_context, sock, host, deadline, timeout)
        except ssl.SSLCertVerificationError as err:
            sock.close()
            raise BrokerUnavailableError(
                f"TLS to {addr}: the server's certificate was refused ({err.verify_message}). "
                "Set tlsCaFile to the CA that signed it; its certificate must name this host or IP."
            ) from None
        except (OSError, ssl.SSLError) as err:
            sock.close()
            raise BrokerUnavailableError(
                f"TLS handshake with {addr} failed: {err}. Is TLS on there (tls.server.mode "
                "enforcing or permissive)? Without TLS, leave the tls option unset."
            ) from None

    def _forget(self, conn: _Connection) -> None:
        key = (conn.pid, conn.addr)
        with self._lock:
            if self._conns.get(key) is conn:
                del self._conns[key]

    def connection_id(self, addr: str) -> int | None:
        """An id of this process's open connection to ``addr``, None when there is none.

        It changes when the connection is made again: what a broker ties to a connection
        (a producer group's registration, to which it sends check-backs) must then be
        registered again.
        """
        conn = self._conns.get((os.getpid(), addr))
        return None if conn is None or conn.closed else conn.number

    def close_connection(self, addr: str) -> None:
        """Close this process's connection to ``addr`` (the next request opens a new one)."""
        conn = self._conns.get((os.getpid(), addr))
        if conn is not None:
            conn.close("closed by the client")

    def close(self) -> None:
        """Close every connection; pending requests fail with BrokerUnavailableError."""
        self._closed = True
        self._wake.set()
        for conn in list(self._conns.values()):
            conn.close("the remoting client was closed")
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def __enter__(self) -> RemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- time-outs of asynchronous requests -------------------------------------------------

    def _start_sweeper(self) -> None:
        with self._lock:
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep_loop, name="pymq-remoting-sweeper", daemon=True
                )
                self._sweeper.start()

    def _sweep_loop(self) -> None:
        wake = self._wake
        while not self._closed:
            wake.wait(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                for opaque, (fut, deadline, code, timeout_s) in list(conn.pending.items()):
                    if deadline <= now and conn.pending.pop(opaque, None) is not None:
                        fut.set_exception(self._timeout_error(conn.addr, code, opaque, timeout_s))
                for opaque, (waiter, deadline, code, timeout_s) in list(conn.waiting.items()):
                    if deadline <= now and conn.waiting.pop(opaque, None) is not None:
                        waiter.set_exception(self._timeout_error(conn.addr, code, opaque, timeout_s))

    # -- requests from the broker -----------------------------------------------------------

    def _on_request(self, conn: _Connection, request: RemotingCommand) -> None:
        handler = self._processors.get(request.code)
        if handler is None:
            if not request.is_oneway:
                self._reply(
                    conn,
                    request,
                    RemotingCommand.response(
                        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        request.opaque,
                        f" request type {request.code} not supported",
                    ),
                )
            return
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(4, thread_name_prefix="pymq-remoting-handler")
        self._executor.submit(self._handle, conn, request, handler)

    def _handle(self, conn: _Connection, request: RemotingCommand, handler: RequestHandler) -> None:
        try:
            response = handler(conn.addr, request)
        except Exception as err:  # the broker gets the error, as from a Java processor
            # a one-way request (CHECK_TRANSACTION_STATE) has nobody to tell but the log
            log.exception("handling request code %d from %s failed", request.code, conn.addr)
            response = RemotingCommand.response(
                ResponseCode.SYSTEM_ERROR, request.opaque, f"{type(err).__name__}: {err}"
            )
        if response is not None and not request.is_oneway:
            self._reply(conn, request, response)

    def _reply(self, conn: _Connection, request: RemotingCommand, response: RemotingCommand) -> None:
        response.opaque = request.opaque
        response.flag |= FLAG_RESPONSE
        try:
            conn.send(response.encode_head(), response.body, time.monotonic() + self.connect_timeout_s)
        except _NotWritten:  # the broker stops waiting for this answer on its own time-out
            pass
        except OSError as err:
            conn.close(f"write failed: {err}")

    # -- fork -------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        for conn in list(self._conns.values()):
            # only our copy of the descriptor: shutdown() would cut the parent's connection
            with contextlib.suppress(OSError):
                conn.sock.close()
        self._reset()


def _after_fork_in_child() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for client in list(_CLIENTS):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
