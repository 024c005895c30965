"""RocketMQ 5's gRPC signature, checked (DefaultAuthenticationProvider, AuthenticationHeader).

The official clients (rocketmq-clients: Java ``Signature.sign``, Python, Go...) send
two metadata entries with every RPC::

    x-mq-date-time: 20231227T194619Z                     (UTC, yyyyMMdd'T'HHmmss'Z')
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex of HMAC-SHA1(secret key, date-time)>

The access key is the username, the secret key its password. Go and C++ clients write
``Credential=<ak>//Rocketmq`` and some clients upper-case hex: both are taken.

What only the date-time is signed means: a captured header is valid until its date-time
is older than the allowed clock skew (``authentication_clock_skew_ms``, 5 minutes by
default, either way), so a replay is bounded by that window and not prevented within it;
TLS keeps headers from being captured. RocketMQ's own broker does not bound the
date-time at all.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from .metadata_provider import AuthenticationMetadataProvider
from .model import User, UserStatus

AUTHORIZATION_KEY = "authorization"
DATE_TIME_KEY = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"

_HINT = "give the client access_key= and secret_key= (Spark options accessKey / secretKey)"


@dataclass(frozen=True, slots=True)
class AuthenticationHeader:
    """The parsed ``authorization`` entry."""

    access_key: str
    signed_headers: str
    signature: str

    @classmethod
    def parse(cls, value: str) -> AuthenticationHeader:
        algorithm, _, rest = value.strip().partition(" ")
        if algorithm != ALGORITHM:
            raise ValueError(f"the authorization header's algorithm must be {ALGORITHM}")
        fields: dict[str, str] = {}
        for part in rest.split(","):
            key, sep, val = part.strip().partition("=")
            if sep:
                fields[key.strip()] = val.strip()
        credential = fields.get("Credential", "")
        access_key = credential.split("/", 1)[0]
        signature = fields.get("Signature", "")
        if not access_key or not signature:
            raise ValueError("the authorization header needs Credential=<access key> and Signature=<hex>")
        return cls(access_key, fields.get("SignedHeaders", DATE_TIME_KEY), signature.lower())


def sign(secret_key: str, date_time: str) -> str:
    """The signature a client sends: hex of HMAC-SHA1(secret key, date-time)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def parse_date_time(value: str) -> float:
    """Seconds since the epoch of an ``x-mq-date-time`` value (UTC)."""
    return float(calendar.timegm(time.strptime(value, DATE_TIME_FORMAT)))


class DefaultAuthenticationProvider:
    """Checks a request's signature against the stored users; answers the username."""

    def __init__(self, users: AuthenticationMetadataProvider, clock_skew_ms: int) -> None:
        self.users = users
        self.clock_skew_s = clock_skew_ms / 1000.0
        # (access key, date-time) -> (expected signature, date-time's epoch): one HMAC and one
        # strptime per client and second, not per request
        self._cache: dict[tuple[str, str], tuple[str, float]] = {}
        # (authorization, date-time) -> (user, epoch) of headers verified already: the clients
        # send the same two values with every request of a second
        self._verified: dict[tuple[str, str], tuple[User, float]] = {}

    def authenticate(self, metadata: Mapping[str, str]) -> User:
        """The signing user, or BrokerException(UNAUTHORIZED) saying what is wrong."""
        value = metadata.get(AUTHORIZATION_KEY)
        hit_user = self._verified.get((value or "", metadata.get(DATE_TIME_KEY, "")))
        if hit_user is not None:
            user, when = hit_user
            if (abs(time.time() - when) <= self.clock_skew_s and self.users.users.get(user.username) is user
                    and user.user_status == UserStatus.ENABLE):
                return user
        user = self._authenticate(metadata)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[(value or "", metadata.get(DATE_TIME_KEY, ""))] = (user, self._cache[
            (user.username, metadata.get(DATE_TIME_KEY, ""))][1])
        return user

    def _authenticate(self, metadata: Mapping[str, str]) -> User:
        value = metadata.get(AUTHORIZATION_KEY)
        if not value:
            raise BrokerException(
                pymq_pb2.UNAUTHORIZED,
                f"authentication is enabled on this broker and the request is not signed: {_HINT}",
            )
        try:
            header = AuthenticationHeader.parse(value)
        except ValueError as err:
            raise BrokerException(pymq_pb2.UNAUTHORIZED, f"{err}; {_HINT}") from None
        user = self.users.users.get(header.access_key)
        if user is None:
            raise BrokerException(pymq_pb2.UNAUTHORIZED,
                                  f"user {header.access_key!r} does not exist on this broker")
        if user.user_status != UserStatus.ENABLE:
            raise BrokerException(pymq_pb2.UNAUTHORIZED, f"user {header.access_key!r} is disabled")
        date_time = metadata.get(DATE_TIME_KEY, "")
        key = (header.access_key, date_time)
        hit = self._cache.get(key)
        if hit is None:
            try:
                when = parse_date_time(date_time)
            except ValueError:
                raise BrokerException(
                    pymq_pb2.UNAUTHORIZED,
                    f"{DATE_TIME_KEY} {date_time[:32]!r} is not yyyyMMdd'T'HHmmss'Z' (UTC)",
                ) from None
            hit = (sign(user.password, date_time), when)
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = hit
        skew = time.time() - hit[1]
        if abs(skew) > self.clock_skew_s:
            raise BrokerException(
                pymq_pb2.UNAUTHORIZED,
                f"{DATE_TIME_KEY} {date_time} is {abs(skew):.0f} s {'old' if skew > 0 else 'ahead'}: the "
                f"broker takes {self.clock_skew_s:.0f} s either way (a replayed request, or a clock "
                "to set right)",
            )
        if not hmac.compare_digest(hit[0], header.signature):
            raise BrokerException(
                pymq_pb2.UNAUTHORIZED,
                f"the signature of user {header.access_key!r} is wrong: check its secret key",
            )
        return user

    def forget(self, username: str) -> None:
        """Drop cached signatures of ``username`` (its password changed or it is gone)."""
        for key in [k for k in self._cache if k[0] == username]:
            del self._cache[key]
        for vkey in [k for k, (u, _w) in self._verified.items() if u.username == username]:
            del self._verified[vkey]
