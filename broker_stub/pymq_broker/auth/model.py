"""ACL 2.0's value objects, RocketMQ's names: User, Subject, Resource, Action, Decision, PolicyEntry, Acl.

A resource is ``Topic:<name>`` or ``Group:<name>`` (or ``Cluster:<name>`` for broker-wide
administration); its name is a literal, a prefix (``orders-*``) or ``*`` (any). A
pattern (prefix or ``*``) never covers a system topic (``RMQ_SYS_*``,
``SCHEDULE_TOPIC_XXXX``...): those take a literal grant.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Any


class UserType(enum.Enum):
    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(enum.Enum):
    ENABLE = "enable"
    DISABLE = "disable"


class Action(enum.Enum):
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"
    ALL = "All"


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


class ResourceType(enum.Enum):
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class ResourcePattern(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"
    ANY = "ANY"


def _parse_enum(kind: type[enum.Enum], text: str, what: str) -> Any:
    for member in kind:
        if member.value.lower() == text.strip().lower():
            return member
    raise ValueError(f"{what} {text!r} is not one of {', '.join(m.value for m in kind)}")


def parse_action(text: str) -> Action:
    return _parse_enum(Action, text, "action")  # type: ignore[no-any-return]


def parse_decision(text: str) -> Decision:
    return _parse_enum(Decision, text, "decision")  # type: ignore[no-any-return]


def parse_user_type(text: str) -> UserType:
    return _parse_enum(UserType, text, "user type")  # type: ignore[no-any-return]


def parse_user_status(text: str) -> UserStatus:
    return _parse_enum(UserStatus, text, "user status")  # type: ignore[no-any-return]


@dataclass
class User:
    """A user: its name is the access key, its password the secret key (kept as given:
    the HMAC is computed with it, as RocketMQ's DefaultAuthenticationHandler does)."""

    username: str
    password: str = field(repr=False)
    user_type: UserType = UserType.NORMAL
    user_status: UserStatus = UserStatus.ENABLE

    def to_json(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password,
                "userType": self.user_type.value, "userStatus": self.user_status.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> User:
        return cls(str(data["username"]), str(data["password"]), parse_user_type(data["userType"]),
                   parse_user_status(data.get("userStatus", "enable")))


def check_username(name: object) -> str:
    """A username as RocketMQ takes it: letters, digits, ``_``, ``-`` and ``.``."""
    if (not isinstance(name, str) or not name or len(name) > 64
            or not all(c.isalnum() or c in "_-." for c in name)):
        raise ValueError(f"username {name!r} must be 1..64 letters, digits, '_', '-' or '.'")
    return name


@dataclass(frozen=True)
class Subject:
    """``User:<name>`` (the only subject type of ACL 2.0)."""

    username: str

    @classmethod
    def parse(cls, text: str) -> Subject:
        kind, sep, name = text.partition(":")
        if not sep or kind.strip().lower() != "user":
            raise ValueError(f"subject {text!r} must be 'User:<name>'")
        return cls(check_username(name.strip()))

    def __str__(self) -> str:
        return f"User:{self.username}"


@dataclass(frozen=True)
class Resource:
    """``Topic:orders``, ``Group:g-*`` (prefix), ``Topic:*`` (any)."""

    resource_type: ResourceType
    name: str
    pattern: ResourcePattern = ResourcePattern.LITERAL

    @classmethod
    def parse(cls, text: str) -> Resource:
        kind, sep, name = text.strip().partition(":")
        if not sep or not name:
            raise ValueError(
                f"resource {text!r} must be 'Topic:<name>', 'Group:<name>' or 'Cluster:<name>'; "
                "a name may end in '*' (prefix) or be '*' (any)"
            )
        rtype = _parse_enum(ResourceType, kind, "resource type")
        if name == "*":
            return cls(rtype, "*", ResourcePattern.ANY)
        if name.endswith("*"):
            return cls(rtype, name[:-1], ResourcePattern.PREFIXED)
        if "*" in name:
            raise ValueError(f"resource {text!r}: '*' may only end a name")
        return cls(rtype, name)

    @classmethod
    def of(cls, rtype: ResourceType, name: str) -> Resource:
        return cls(rtype, name)

    def matches(self, other: Resource, *, system_topic: bool = False) -> bool:
        """Whether this (pattern) resource covers the literal ``other``."""
        if self.resource_type != other.resource_type:
            return False
        if self.pattern == ResourcePattern.LITERAL:
            return self.name == other.name
        if system_topic:
            return False
        return self.pattern == ResourcePattern.ANY or other.name.startswith(self.name)

    def __str__(self) -> str:
        suffix = "*" if self.pattern == ResourcePattern.PREFIXED else ""
        return f"{self.resource_type.value}:{self.name}{suffix}"


def parse_source_ip(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"source IP {text!r} is not an address or a CIDR range (e.g. 10.0.0.0/8)") from None


@dataclass(frozen=True)
class PolicyEntry:
    """One resource's actions, source IP ranges (none: any) and decision."""

    resource: Resource
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[str, ...] = ()

    def covers(self, action: Action, ip: str | None) -> bool:
        if action not in self.actions and Action.ALL not in self.actions:
            return False
        if not self.source_ips:
            return True
        if ip is None:
            return False
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(addr in parse_source_ip(net) for net in self.source_ips)

    def to_json(self) -> dict[str, Any]:
        return {"resource": str(self.resource), "actions": sorted(a.value for a in self.actions),
                "sourceIps": list(self.source_ips), "decision": self.decision.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PolicyEntry:
        return cls.build(str(data["resource"]), data["actions"], str(data.get("decision", "Allow")),
                         data.get("sourceIps") or ())

    @classmethod
    def build(cls, resource: str, actions: Any, decision: str = "Allow", source_ips: Any = ()) -> PolicyEntry:
        """An entry from its text form; ValueError names a bad resource, action, IP or decision."""
        acts = frozenset(parse_action(a) for a in actions)
        if not acts:
            raise ValueError(f"the entry for {resource!r} names no action")
        ips = tuple(str(parse_source_ip(ip)) for ip in source_ips)
        return cls(Resource.parse(resource), acts, parse_decision(decision), ips)


@dataclass
class Acl:
    """A subject's policy entries, at most one per resource."""

    subject: Subject
    entries: dict[str, PolicyEntry] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"subject": str(self.subject), "entries": [e.to_json() for e in self.entries.values()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Acl:
        entries = [PolicyEntry.from_json(e) for e in data.get("entries", [])]
        return cls(Subject.parse(data["subject"]), {str(e.resource): e for e in entries})
