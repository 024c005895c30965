"""RocketMQ's remoting protocol: the frame every name server and broker speaks over TCP.

A frame (``org.apache.rocketmq.remoting.protocol.RemotingCommand``)::

    int32 length                  # of everything after this field
    int32 serialize type << 24 | header length
    header                        # JSON (type 0) or RocketMQ's binary form (type 1)
    body                          # the rest, raw bytes (messages, JSON documents...)

All integers are big-endian. The header carries ``code`` (a :class:`RequestCode` in a
request, a :class:`ResponseCode` in a response), ``language``, ``version``, ``opaque``
(the request id a response echoes), ``flag`` (bit 0: response, bit 1: one-way),
``remark`` (an error text) and ``extFields``: the request or response header fields
(``PullMessageRequestHeader``'s ``consumerGroup``, ``queueOffset``...), every value a
string.

pymq sends JSON headers, as RocketMQ's own clients do by default. It decodes both
forms: a name server or broker answers in the form its JVM was configured with
(``-Drocketmq.serialize.type=ROCKETMQ`` or the ``ROCKETMQ_SERIALIZE_TYPE`` environment
variable; JSON otherwise), whatever form the request used.

Example::

    cmd = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "0"})
    frame = cmd.encode()
    assert RemotingCommand.decode(frame).ext_fields["topic"] == "T"
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..errors import IllegalArgumentError, PymqError, SystemBusyError, error_for_code

__all__ = [
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "LANGUAGE_CODES",
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "VERSION_5_3_3",
    "FrameTemplate",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "decode_header",
    "loads_fastjson",
    "request_code_name",
    "response_code_name",
    "response_error",
]

SERIALIZE_JSON: Final = 0
SERIALIZE_ROCKETMQ: Final = 1
FLAG_RESPONSE: Final = 1  # RemotingCommand.RPC_TYPE bit
FLAG_ONEWAY: Final = 2  # RemotingCommand.RPC_ONEWAY bit
# MQVersion.Version.V5_3_3.ordinal(). A name server answers a client of V4_9_4 (401) or later
# with standard JSON routes (string map keys), and brokers gate some features on it.
VERSION_5_3_3: Final = 479
# A frame larger than this is refused as corrupt: RocketMQ's own decoder caps frames at 16 MiB
# by default (com.rocketmq.remoting.frameMaxLength); a broker's pull answers stay far below.
MAX_FRAME_LENGTH: Final = 256 * 1024 * 1024

# LanguageCode by its byte in the binary header.
LANGUAGE_CODES: Final[tuple[str, ...]] = (
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
    "RUST",
    "NODE_JS",
)
_LANGUAGE_BYTE = {name: i for i, name in enumerate(LANGUAGE_CODES)}

_INT2 = struct.Struct(">ii")
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag


class RequestCode:
    """The request codes pymq uses (``org.apache.rocketmq.remoting.protocol.RequestCode``)."""

    SEND_MESSAGE: Final = 10
    PULL_MESSAGE: Final = 11
    QUERY_MESSAGE: Final = 12
    QUERY_CONSUMER_OFFSET: Final = 14
    UPDATE_CONSUMER_OFFSET: Final = 15
    GET_ALL_TOPIC_CONFIG: Final = 21
    GET_BROKER_CONFIG: Final = 26
    GET_BROKER_RUNTIME_INFO: Final = 28
    SEARCH_OFFSET_BY_TIMESTAMP: Final = 29
    GET_MAX_OFFSET: Final = 30
    GET_MIN_OFFSET: Final = 31
    GET_EARLIEST_MSG_STORETIME: Final = 32
    VIEW_MESSAGE_BY_ID: Final = 33
    HEART_BEAT: Final = 34
    UNREGISTER_CLIENT: Final = 35
    CONSUMER_SEND_MSG_BACK: Final = 36
    END_TRANSACTION: Final = 37
    GET_CONSUMER_LIST_BY_GROUP: Final = 38
    CHECK_TRANSACTION_STATE: Final = 39
    NOTIFY_CONSUMER_IDS_CHANGED: Final = 40
    LOCK_BATCH_MQ: Final = 41
    UNLOCK_BATCH_MQ: Final = 42
    CHECK_CLIENT_CONFIG: Final = 46
    GET_ROUTEINFO_BY_TOPIC: Final = 105
    GET_TOPIC_STATS_INFO: Final = 202
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER: Final = 206
    GET_BROKER_CLUSTER_INFO: Final = 106
    GET_CONSUME_STATS: Final = 208
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG: Final = 201
    GET_TOPIC_CONFIG: Final = 351  # RocketMQ 5 (AdminBrokerProcessor.getTopicConfig)
    RESET_CONSUMER_CLIENT_OFFSET: Final = 220
    GET_CONSUMER_STATUS_FROM_CLIENT: Final = 221
    GET_CONSUMER_RUNNING_INFO: Final = 307
    CONSUME_MESSAGE_DIRECTLY: Final = 309
    SEND_MESSAGE_V2: Final = 310
    SEND_BATCH_MESSAGE: Final = 320


class ResponseCode:
    """Response codes (``ResponseCode`` and ``RemotingSysResponseCode``)."""

    SUCCESS: Final = 0
    SYSTEM_ERROR: Final = 1
    SYSTEM_BUSY: Final = 2
    REQUEST_CODE_NOT_SUPPORTED: Final = 3
    TRANSACTION_FAILED: Final = 4
    FLUSH_DISK_TIMEOUT: Final = 10
    SLAVE_NOT_AVAILABLE: Final = 11
    FLUSH_SLAVE_TIMEOUT: Final = 12
    MESSAGE_ILLEGAL: Final = 13
    SERVICE_NOT_AVAILABLE: Final = 14
    VERSION_NOT_SUPPORTED: Final = 15
    NO_PERMISSION: Final = 16
    TOPIC_NOT_EXIST: Final = 17
    TOPIC_EXIST_ALREADY: Final = 18
    PULL_NOT_FOUND: Final = 19
    PULL_RETRY_IMMEDIATELY: Final = 20
    PULL_OFFSET_MOVED: Final = 21
    QUERY_NOT_FOUND: Final = 22
    SUBSCRIPTION_PARSE_FAILED: Final = 23
    SUBSCRIPTION_NOT_EXIST: Final = 24
    SUBSCRIPTION_NOT_LATEST: Final = 25
    SUBSCRIPTION_GROUP_NOT_EXIST: Final = 26
    FILTER_DATA_NOT_EXIST: Final = 27
    FILTER_DATA_NOT_LATEST: Final = 28
    INVALID_PARAMETER: Final = 29
    TRANSACTION_SHOULD_COMMIT: Final = 200
    TRANSACTION_SHOULD_ROLLBACK: Final = 201
    TRANSACTION_STATE_UNKNOW: Final = 202
    TRANSACTION_STATE_GROUP_WRONG: Final = 203
    NO_BUYER_ID: Final = 204
    NOT_IN_CURRENT_UNIT: Final = 205
    CONSUMER_NOT_ONLINE: Final = 206
    CONSUME_MSG_TIMEOUT: Final = 207
    NO_MESSAGE: Final = 208
    POLLING_FULL: Final = 209
    POLLING_TIMEOUT: Final = 210
    BROKER_NOT_EXIST: Final = 211
    BROKER_DISPATCH_NOT_COMPLETE: Final = 212
    BROADCAST_CONSUMPTION: Final = 213
    FLOW_CONTROL: Final = 215
    NOT_LEADER_FOR_QUEUE: Final = 501
    ILLEGAL_OPERATION: Final = 604
    RPC_UNKNOWN: Final = -1000
    RPC_ADDR_IS_NULL: Final = -1002
    RPC_SEND_TO_CHANNEL_FAILED: Final = -1004
    RPC_TIME_OUT: Final = -1006
    GO_AWAY: Final = 1500
    USER_NOT_EXIST: Final = 3001
    POLICY_NOT_EXIST: Final = 3002


def _names(cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if k.isupper() and isinstance(v, int)}


_REQUEST_NAMES = _names(RequestCode)
_RESPONSE_NAMES = _names(ResponseCode)


def request_code_name(code: int) -> str:
    """RocketMQ's name of a request code (``"PULL_MESSAGE"``), or ``"request code N"``."""
    return _REQUEST_NAMES.get(code) or f"request code {code}"


def response_code_name(code: int) -> str:
    """RocketMQ's name of a response code (``"TOPIC_NOT_EXIST"``), or ``"RESPONSE_CODE_N"``."""
    return _RESPONSE_NAMES.get(code) or f"RESPONSE_CODE_{code}"


@dataclass(slots=True)
class RemotingCommand:
    """One request or response of RocketMQ's remoting protocol.

    ``ext_fields`` holds the request/response header fields by their Java field names,
    every value a string (``{"topic": "T", "queueId": "0"}``). ``body`` is the raw body:
    ``bytes``, or for a large received frame the ``bytearray`` it was read into (no
    copy); both support slicing, ``find``, ``struct.unpack_from`` and ``memoryview``.
    ``serialize_type`` is the header form of a decoded frame, and the one
    :meth:`encode` writes (JSON unless changed).
    """

    code: int
    language: str = "PYTHON"
    version: int = VERSION_5_3_3
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes | bytearray = b""
    serialize_type: int = SERIALIZE_JSON

    @staticmethod
    def request(
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes | bytearray = b"",
    ) -> RemotingCommand:
        """A request (the opaque is set when it is sent)."""
        return RemotingCommand(code, ext_fields=dict(ext_fields) if ext_fields else {}, body=body)

    @staticmethod
    def response(
        code: int,
        opaque: int,
        remark: str | None = None,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes | bytearray = b"",
    ) -> RemotingCommand:
        """A response to the request with ``opaque``."""
        return RemotingCommand(
            code,
            opaque=opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=dict(ext_fields) if ext_fields else {},
            body=body,
        )

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    # -- encoding ---------------------------------------------------------------------------

    def header_bytes(self) -> bytes:
        """The header alone, in :attr:`serialize_type` form."""
        if self.serialize_type == SERIALIZE_ROCKETMQ:
            return self._binary_header()
        obj: dict[str, Any] = {
            "code": self.code,
            "flag": self.flag,
            "language": self.language,
            "opaque": self.opaque,
            "serializeTypeCurrentRPC": "JSON",
            "version": self.version,
        }
        if self.remark is not None:
            obj["remark"] = self.remark
        if self.ext_fields:
            obj["extFields"] = self.ext_fields
        return json.dumps(obj, separators=(",", ":")).encode()

    def encode_head(self) -> bytes:
        """Length, serialize type and header: the frame without its body."""
        header = self.header_bytes()
        return (
            _INT2.pack(4 + len(header) + len(self.body), (self.serialize_type << 24) | len(header)) + header
        )

    def encode(self) -> bytes:
        """The whole frame."""
        head = self.encode_head()
        return head + self.body if self.body else head

    def _binary_header(self) -> bytes:
        parts = [
            _BIN_FIXED.pack(
                self.code, _LANGUAGE_BYTE.get(self.language, 7), self.version, self.opaque, self.flag
            )
        ]
        remark = self.remark.encode() if self.remark else b""
        parts.append(struct.pack(">i", len(remark)))
        parts.append(remark)
        fields = bytearray()
        for k, v in self.ext_fields.items():
            kb, vb = k.encode(), v.encode()
            fields += struct.pack(">h", len(kb))
            fields += kb
            fields += struct.pack(">i", len(vb))
            fields += vb
        parts.append(struct.pack(">i", len(fields)))
        parts.append(bytes(fields))
        return b"".join(parts)

    # -- decoding ---------------------------------------------------------------------------

    @staticmethod
    def decode(frame: bytes | bytearray | memoryview) -> RemotingCommand:
        """A command from a whole frame (with its length field), as :meth:`encode` makes it."""
        if len(frame) < 8:
            raise ValueError(f"a remoting frame has at least 8 bytes, got {len(frame)}")
        length, type_and_len = _INT2.unpack_from(frame, 0)
        if length != len(frame) - 4:
            raise ValueError(f"frame length field says {length} bytes, {len(frame) - 4} follow it")
        header_len = type_and_len & 0xFFFFFF
        if header_len > length - 4:
            raise ValueError(f"bad header length {header_len} in a frame of {length} bytes")
        mv = memoryview(frame)
        cmd = decode_header(mv[8 : 8 + header_len], (type_and_len >> 24) & 0xFF)
        cmd.body = bytes(mv[8 + header_len :])
        return cmd


class FrameTemplate:
    """The frames of one request whose header differs only in its opaque and a few ext fields.

    A pull window sends the same ``PULL_MESSAGE`` header hundreds of times with another
    ``queueOffset`` each: the JSON header is encoded once, with placeholders, and each
    frame is one ``%`` formatting of integers into it. :meth:`frame` returns exactly the
    bytes of :meth:`RemotingCommand.encode` for the same command (JSON headers only, no
    body)::

        t = FrameTemplate(RemotingCommand.request(RequestCode.PULL_MESSAGE, ext), ["queueOffset"])
        frame = t.frame(opaque, 4096)   # ext["queueOffset"] = "4096", the opaque set
    """

    __slots__ = ("_format", "_order", "variable")

    def __init__(self, command: RemotingCommand, variable: tuple[str, ...] | list[str]) -> None:
        if command.serialize_type != SERIALIZE_JSON or command.body:
            raise ValueError("a FrameTemplate takes a JSON-header command without a body")
        missing = [name for name in variable if name not in command.ext_fields]
        if missing:
            raise ValueError(f"{missing} are not ext fields of the command")
        self.variable = tuple(variable)
        marks = {name: f"\x00pymq-template-{i}\x00" for i, name in enumerate(self.variable)}
        opaque_mark = -0x7A5E1D0C  # an opaque no request has (they are >= 0)
        cmd = RemotingCommand(
            command.code, command.language, command.version, opaque_mark, command.flag, command.remark,
            {k: marks.get(k, v) for k, v in command.ext_fields.items()},
        )
        header = cmd.header_bytes().replace(b"%", b"%%")
        opaque_field = b'"opaque":%d' % opaque_mark
        if header.count(opaque_field) != 1:
            raise ValueError("the command's header cannot be made a template")
        at = header.index(opaque_field)
        header = header.replace(opaque_field, b'"opaque":%d')
        where = []
        for name in self.variable:
            placeholder = json.dumps(marks[name]).encode()  # the marks are escaped as JSON writes them
            if header.count(placeholder) != 1 or header.index(placeholder) < at:
                raise ValueError(f"ext field {name!r} cannot be made a template")
            where.append(header.index(placeholder))
            header = header.replace(placeholder, b'"%d"')
        # the values fill the header in its own order, which may not be the order they come in
        order = tuple(sorted(range(len(where)), key=where.__getitem__))
        self._order = None if order == tuple(range(len(order))) else order
        self._format = header

    def frame(self, opaque: int, *values: int) -> bytes:
        """The whole frame with ``opaque`` and the ``variable`` ext fields set to ``values``, in order."""
        if self._order is not None:
            values = tuple(values[i] for i in self._order)
        header = self._format % (opaque, *values)
        return _INT2.pack(4 + len(header), len(header)) + header


def decode_header(header: bytes | bytearray | memoryview, serialize_type: int) -> RemotingCommand:
    """A command (without body) from its header bytes in either form."""
    if serialize_type == SERIALIZE_JSON:
        obj = json.loads(bytes(header))
        ext = obj.get("extFields")
        return RemotingCommand(
            code=int(obj.get("code", 0)),
            language=str(obj.get("language", "JAVA")),
            version=int(obj.get("version", 0)),
            opaque=int(obj.get("opaque", 0)),
            flag=int(obj.get("flag", 0)),
            remark=obj.get("remark"),
            # fastjson writes the strings of a HashMap<String,String>; None marks a null value
            ext_fields={str(k): "" if v is None else str(v) for k, v in ext.items()} if ext else {},
            serialize_type=SERIALIZE_JSON,
        )
    if serialize_type == SERIALIZE_ROCKETMQ:
        return _decode_binary_header(memoryview(header))
    raise ValueError(f"unknown serialize type {serialize_type} (0 is JSON, 1 ROCKETMQ)")


def _decode_binary_header(h: memoryview) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(h, 0)
        pos = _BIN_FIXED.size
        (rlen,) = struct.unpack_from(">i", h, pos)
        pos += 4
        remark = bytes(h[pos : pos + rlen]).decode() if rlen > 0 else None
        pos += max(rlen, 0)
        (flen,) = struct.unpack_from(">i", h, pos)
        pos += 4
        end = pos + flen
        if flen < 0 or end > len(h):
            raise ValueError(f"extFields length {flen} exceeds the header's {len(h)} bytes")
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = struct.unpack_from(">h", h, pos)
            pos += 2
            key = bytes(h[pos : pos + klen]).decode()
            pos += klen
            (vlen,) = struct.unpack_from(">i", h, pos)
            pos += 4
            ext[key] = bytes(h[pos : pos + vlen]).decode()
            pos += vlen
    except struct.error as err:
        raise ValueError(f"truncated ROCKETMQ binary header of {len(h)} bytes: {err}") from None
    language = LANGUAGE_CODES[lang] if 0 <= lang < len(LANGUAGE_CODES) else "OTHER"
    return RemotingCommand(
        code=code,
        language=language,
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        serialize_type=SERIALIZE_ROCKETMQ,
    )


# -- answers as errors -----------------------------------------------------------------------

# Codes error_for_code does not know by name, mapped to the error a caller would catch.
_ERROR_CLASSES: dict[int, type[PymqError]] = {
    ResponseCode.INVALID_PARAMETER: IllegalArgumentError,
    ResponseCode.FLOW_CONTROL: SystemBusyError,
    ResponseCode.POLLING_FULL: SystemBusyError,
}
# RocketMQ appends one of these to many remarks (FAQUrl.suggestTodo, FAQUrl.attachDefaultURL), most
# after a ", " ("subscription group [g] does not exist, \nSee ..."); they say nothing about the failure.
_FAQ_SUFFIX = re.compile(
    r"[\s,;]*(?:See https?://rocketmq\.apache\.org/\S*\s+for further details\.?"
    r"|For more information, please visit the url, https?://\S*)\s*$"
)


# what RocketMQ 5's authentication answers for a missing, unknown or wrongly signing user
_CREDENTIALS_REFUSED = re.compile(r"signature|username cannot be null|User:\S* is not found|accessKey",
                                  re.IGNORECASE)


_GET_CALLS = ("GET_TOPIC_STATS_INFO", "GET_MAX_OFFSET", "GET_MIN_OFFSET", "SEARCH_OFFSET_BY_TIMESTAMP",
              "QUERY_CONSUMER_OFFSET")


def response_error(response: RemotingCommand, addr: str, call: str) -> PymqError:
    """The typed error for a failed answer: its ResponseCode's class, naming ``call`` and ``addr``.

    ``error.code`` is RocketMQ's ResponseCode name; the message has the remark.
    """
    name = response_code_name(response.code)
    remark = _FAQ_SUFFIX.sub("", (response.remark or "").strip())
    text = f"{call} to {addr} failed with {name}" + (f": {remark}" if remark else "")
    if response.code == ResponseCode.NO_PERMISSION and _CREDENTIALS_REFUSED.search(remark):
        text += (". The brokers check ACL credentials: give the user's access key and secret key (Spark "
                 "options accessKey / secretKey, access_key= / secret_key=, pymq-admin --access-key)")
    elif response.code == ResponseCode.NO_PERMISSION and call.startswith(_GET_CALLS):
        # RocketMQ's push consumer reads with Sub alone; pymq reads queue bounds itself
        text += (". RocketMQ authorizes this request as Get: grant the user Get on the topic and the "
                 "group, besides Sub")
    cls = _ERROR_CLASSES.get(response.code)
    return cls(text, code=name) if cls is not None else error_for_code(name, text)


# -- fastjson bodies -------------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_SPACE = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_LITERALS = {"true": True, "false": False, "null": None}


def _skip(s: str, i: int) -> int:
    m = _SPACE.match(s, i)
    return m.end() if m else i


def loads_fastjson(data: bytes | bytearray | memoryview | str) -> Any:
    """A JSON body as RocketMQ's fastjson writes it.

    Standard JSON, except that fastjson writes maps with non-string keys as they are:
    ``{0:"127.0.0.1:10911"}`` (a ``HashMap<Long,String>``: a name server's routes for
    clients older than 4.9.4) or ``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``
    (a ``Map<MessageQueue,...>``: ``GET_TOPIC_STATS_INFO`` always). Number keys become
    ``int``/``float``; object keys a tuple of their sorted ``(name, value)`` pairs.
    """
    text = data if isinstance(data, str) else bytes(data).decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass  # the lenient parser below; slower, and needed only for these maps
    try:
        value, end = _parse_value(text, _skip(text, 0))
    except (IndexError, KeyError, ValueError) as err:
        raise ValueError(f"not a fastjson document ({err}): {text[:200]!r}") from None
    end = _skip(text, end)
    if end != len(text):
        raise ValueError(f"extra data at {end} in fastjson document: {text[:200]!r}")
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _parse_value(s: str, i: int) -> tuple[Any, int]:
    c = s[i]
    if c == '"':
        m = _STRING.match(s, i)
        if m is None:
            raise ValueError(f"unterminated string at {i}")
        text: str = json.loads(m.group())
        return text, m.end()
    if c == "{":
        obj: dict[Any, Any] = {}
        i = _skip(s, i + 1)
        if s[i] == "}":
            return obj, i + 1
        while True:
            key, i = _parse_value(s, i)
            i = _skip(s, i)
            if s[i] != ":":
                raise ValueError(f"expected ':' at {i}")
            value, i = _parse_value(s, _SPACE.match(s, i + 1).end())  # type: ignore[union-attr]
            obj[_hashable(key)] = value
            i = _skip(s, i)
            if s[i] == "}":
                return obj, i + 1
            if s[i] != ",":
                raise ValueError(f"expected ',' or '}}' at {i}")
            i = _skip(s, i + 1)
    if c == "[":
        arr: list[Any] = []
        i = _skip(s, i + 1)
        if s[i] == "]":
            return arr, i + 1
        while True:
            value, i = _parse_value(s, i)
            arr.append(value)
            i = _skip(s, i)
            if s[i] == "]":
                return arr, i + 1
            if s[i] != ",":
                raise ValueError(f"expected ',' or ']' at {i}")
            i = _skip(s, i + 1)
    for word, literal in _LITERALS.items():
        if s.startswith(word, i):
            return literal, i + len(word)
    m = _NUMBER.match(s, i)
    if m is None:
        raise ValueError(f"unexpected {c!r} at {i}")
    number = m.group()
    return (float(number) if m.group(1) or m.group(2) else int(number)), m.end()
