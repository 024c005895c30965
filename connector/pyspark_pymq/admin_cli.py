"""``pymq-admin``: topics, groups, lag and dead letters from a terminal.

    pymq-admin --endpoint 127.0.0.1:8081 topics
    pymq-admin -e 127.0.0.1:8081 create-topic orders --queues 4
    pymq-admin -e 127.0.0.1:8081 topic-stats orders
    pymq-admin -e 127.0.0.1:8081 progress analytics
    pymq-admin -e 127.0.0.1:8081 reset-offset analytics orders --timestamp 2026-11-28T09:00:00+00:00
    pymq-admin -e 127.0.0.1:8081 dead-letters analytics
    pymq-admin -e 127.0.0.1:8081 resend-dead-letters analytics [--msg-id ID ...]
    pymq-admin -e 127.0.0.1:8081 send orders --count 100000 --size 200
    PYMQ_USER_PASSWORD='...' pymq-admin -e 127.0.0.1:8081 user create alice [--type Super|Normal]
    pymq-admin -e 127.0.0.1:8081 user list | update alice --status disable | delete alice
    pymq-admin -e 127.0.0.1:8081 acl create User:alice --resource Topic:orders --action Pub,Sub
    pymq-admin -e 127.0.0.1:8081 acl list [--subject User:alice] | delete User:alice [--resource R]

An Apache RocketMQ cluster is read with ``-n host:9876`` (``--namesrv-addr``, or PYMQ_NAMESRV_ADDR),
as ``mqadmin`` takes it: topics, topic-stats, progress, dead-letters, tail, broker (every broker,
or ``--broker-name``), and send writes test messages; what changes the cluster stays with
``mqadmin``. (tail and dead-letters pull as RocketMQ's own group TOOLS_CONSUMER, as ``mqadmin``
does, which every broker has; tail's ``--group`` pulls as another.) A flag wins over the other
one's environment variable.

The endpoint can also come from PYMQ_ENDPOINT; a broker with authentication on takes
``--access-key`` (or PYMQ_ACCESS_KEY) and the secret key from PYMQ_SECRET_KEY (or
``--secret-key``, which other users of the machine can see in the process list); a TLS
broker takes ``--tls-ca-file`` (and ``--tls-cert-file`` / ``--tls-key-file`` for mutual TLS).
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from pymq_proto.topics import TOPIC_MESSAGE_TYPES, not_created_yet

from .backend.base import client_tls
from .client import Admin, Message, Producer, PullConsumer
from .client.admin import ADMIN_TAIL_GROUP, pull_messages
from .errors import PymqError, TopicNotExistError
from .spark.option_registry import TOOLS_CONSUMER_GROUP, browse_group
from .spark.source_offset import epoch_ms_problem

__all__ = ["ProgressBar", "main", "render_table"]


class ProgressBar:
    """A one-line progress bar for long operations (stderr, redrawn in place)."""

    def __init__(self, total: int, label: str, out: TextIO | None = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.label = label
        self.out = out or sys.stderr
        self.width = width
        self.started = time.monotonic()
        self.done = 0
        self.drawn = False

    def update(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = max(total, 1)
        self.done = done
        frac = min(done / self.total, 1.0)
        filled = int(frac * self.width)
        rate = done / max(time.monotonic() - self.started, 1e-9)
        self.out.write(
            f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
            f"{done}/{self.total} ({frac:4.0%}) {rate:,.0f}/s"
        )
        self.out.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line (nothing when it was never drawn: no empty line)."""
        if self.drawn:
            self.out.write("\n")
            self.out.flush()


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on or break a line at escaped, as Python's repr
    escapes it (ESC as ``\\x1b``, a newline as ``\\n``): a message body or property set by any
    producer cannot recolour, move the cursor or fake lines of the output."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _cell(value: Any) -> str:
    """One value as one line of printable text: bytes (a body) decoded as UTF-8 where they are,
    other bytes as ``\\xNN``, at most the first 40 bytes shown."""
    if isinstance(value, bytes):
        cut = len(value) > 40  # a character the cut splits is left out, not shown as broken bytes
        text = codecs.getincrementaldecoder("utf-8")("backslashreplace").decode(value[:40], final=not cut)
        return _printable(text) + ("..." if cut else "")
    return _printable(str(value))


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table (times, and timestamps in ms, shown as UTC times)."""
    if not rows:
        return "(none)"
    cells = []
    for row in rows:
        line = []
        for c in columns:
            v = row.get(c)
            if c.endswith("timestamp") and isinstance(v, int):
                v = datetime.fromtimestamp(v / 1000, tz=timezone.utc) if v else None
            if isinstance(v, datetime) or (c.endswith("timestamp") and v is None):  # (NaT is one)
                v = v.strftime("%Y-%m-%d %H:%M:%S") if v and v == v else "-"
            line.append(_cell(v))
        cells.append(line)
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    head = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([head, rule, *body])


def _print_frame(frame: Any) -> None:
    print(render_table(frame.to_dict("records"), list(frame.columns)))


def _cmd_topics(admin: Admin, a: argparse.Namespace) -> None:
    _print_frame(admin.topics(include_system=a.all))


def _cmd_groups(admin: Admin, a: argparse.Namespace) -> None:
    _print_frame(admin.groups(include_internal=a.all))


def _cmd_create(admin: Admin, a: argparse.Namespace) -> None:
    cfg = admin.create_topic(a.topic, a.queues, read_queues=a.read_queues, write_queues=a.write_queues,
                             dedup_window_ms=a.dedup_window_ms, message_type=a.message_type,
                             allow_shrink=a.allow_shrink)
    dedup = f", de-duplication window {cfg.dedup_window_ms} ms" if cfg.dedup_window_ms else ""
    print(f"topic {cfg.topic_name}: {cfg.read_queue_nums} read / {cfg.write_queue_nums} write queues, "
          f"{cfg.message_type} messages{dedup}")


def _cmd_update_group(admin: Admin, a: argparse.Namespace) -> None:
    cfg = admin.update_group(a.group, retry_max_times=a.retry_max_times, retry_queue_nums=a.retry_queue_nums,
                             consume_message_orderly=a.orderly, consume_enable=a.consume_enable)
    print(f"group {cfg.group_name}: retry_max_times {cfg.retry_max_times}, retry_queue_nums "
          f"{cfg.retry_queue_nums}, {'orderly (FIFO)' if cfg.consume_message_orderly else 'concurrently'}"
          f"{'' if cfg.consume_enable else ', consumption disabled'}")


def _cmd_delete(admin: Admin, a: argparse.Namespace) -> None:
    admin.delete_topic(a.topic)
    print(f"topic {a.topic} deleted")


def _cmd_stats(admin: Admin, a: argparse.Namespace) -> None:
    _print_frame(admin.topic_stats(a.topic))


def _cmd_progress(admin: Admin, a: argparse.Namespace) -> None:
    frame = admin.group_progress(a.group, a.topic)  # an unknown group fails naming it
    _print_frame(frame)
    if len(frame):
        print(f"total lag: {int(frame['lag'].sum())}")


def _reset_time(text: str) -> int:
    """argparse's type for reset-offset's --timestamp: ms since the epoch, an ISO 8601 date-time,
    earliest (each queue's first message) or latest / now (its end)."""
    named = {"earliest": 0, "latest": -1, "now": -1}
    if text.lower() in named:
        return named[text.lower()]
    if text.isdigit():
        problem = epoch_ms_problem(int(text))
        if problem:
            raise argparse.ArgumentTypeError(f"{text}: {problem}")
        return int(text)
    try:
        ms = int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give ms since the epoch, an ISO 8601 date-time such as "
            "2026-11-28T09:00:00+00:00 (without an offset: local time), earliest, latest or now") from None
    if ms < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is before 1970: no message was stored then "
                                         "(earliest: each queue's first message)")
    return ms


def _cmd_reset_offset(admin: Admin, a: argparse.Namespace) -> None:
    if (a.timestamp is None) == (a.offset is None):
        raise ValueError("give --timestamp (every queue, or --queue-id's) or --offset with --queue-id")
    if a.offset is not None and a.queue_id is None:
        raise ValueError(f"--offset {a.offset} needs --queue-id (the queue it is for); to move every queue, "
                         "give --timestamp")
    frame = admin.reset_offset(a.group, a.topic, a.timestamp, offset=a.offset, queue_id=a.queue_id)
    _print_frame(frame)
    print(f"offsets of {a.group} on {a.topic} reset ({len(frame)} queue(s)). A PullConsumer or Spark query "
          "of the group that ran meanwhile writes its own offsets over them: stop those first and reset "
          "again; a Spark query starts from the reset only with a new checkpointLocation")


def _cmd_dead_letters(admin: Admin, a: argparse.Namespace) -> None:
    _print_frame(admin.dead_letters(a.group, a.max))


def _cmd_resend(admin: Admin, a: argparse.Namespace) -> None:
    bar = ProgressBar(0, "re-sending")
    sent = admin.resend_dead_letters(a.group, a.msg_id or None, progress=bar.update)
    bar.close()
    print(f"{sent} dead letter(s) of {a.group} re-sent to their original topics")
    if a.msg_id and not sent:  # a script asked for these letters: none of them went
        raise ValueError(f"no dead letter of {a.group} was re-sent for msg id(s) {', '.join(a.msg_id)}: "
                         "check them with `pymq-admin dead-letters`")


def _cmd_purge(admin: Admin, a: argparse.Namespace) -> None:
    admin.purge_dead_letters(a.group)
    print(f"dead letters of {a.group} purged")


def _cmd_view(admin: Admin, a: argparse.Namespace) -> None:
    try:
        m = admin.view_message(a.msg_id, a.topic)
    except PymqError as err:
        if a.topic is not None or err.code != "QUERY_NOT_FOUND":
            raise
        raise type(err)(f"no message at that offset; if {a.msg_id} is a msgId (UNIQ_KEY, as query-message "
                        "and the source's msg_id column show), add --topic TOPIC", code=err.code) from None
    rows = [{"field": k, "value": getattr(m, k)} for k in (
        "topic", "queue_id", "queue_offset", "msg_id", "offset_msg_id", "tags", "keys",
        "reconsume_times", "born_timestamp", "store_timestamp", "properties", "body")]
    print(render_table(rows, ["field", "value"]))


def _cmd_query(admin: Admin, a: argparse.Namespace) -> None:
    found = admin.query_message(a.topic, a.key, a.max)
    rows = [{"queue_id": m.queue_id, "queue_offset": m.queue_offset, "msg_id": m.msg_id,
             "keys": " ".join(m.keys), "store_timestamp": m.store_timestamp, "body": m.body}
            for m in found]
    print(render_table(rows, ["queue_id", "queue_offset", "msg_id", "keys", "store_timestamp", "body"]))


def _at_least(least: int) -> Callable[[str], int]:
    """argparse's type for counts, sizes and offsets: an int of ``least`` or more, else argparse's own
    error naming the flag (exit 2), before anything is asked of a broker."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return check


_at_least_one, _at_least_zero = _at_least(1), _at_least(0)


def _cmd_send(admin: Admin, a: argparse.Namespace) -> None:
    body = b"x" * a.size
    bar = ProgressBar(a.count, f"sending to {a.topic}")
    done = 0
    with Producer(**a.target, **a.security) as producer:
        while done < a.count:
            n = min(a.batch, a.count - done)
            producer.send_batch([Message(a.topic, body, tags=a.tags) for _ in range(n)])
            done += n
            bar.update(done)
    bar.close()
    print(f"{done} message(s) sent to {a.topic}")


def _cmd_tail(admin: Admin, a: argparse.Namespace) -> None:
    group = a.group or browse_group("rocketmq" if a.namesrv_addr else "pymq", ADMIN_TAIL_GROUP)
    consumer = PullConsumer(group=group, **a.target, **a.security)
    for mq in consumer.queues(a.topic):
        end = consumer.max_offset(mq)
        start = max(consumer.min_offset(mq), end - a.last)
        # pulled until the end: an Apache RocketMQ broker answers at most 32 messages a pull
        for m in pull_messages(consumer, mq, start, end - start):
            print(f"{mq} @{m.queue_offset} tags={_cell(m.tags or '')} keys={_cell(' '.join(m.keys))} "
                  f"body={_cell(m.body)}")


def _cmd_broker(admin: Admin, a: argparse.Namespace) -> None:
    names = [a.broker_name] if a.broker_name else admin.broker_names()
    if not names:
        raise ValueError(f"no broker is registered with the name servers at {admin.endpoint}")
    failed = []
    for i, broker in enumerate(names):
        if len(names) > 1:
            print(("\n" if i else "") + f"[{broker}]")
        try:  # as mqadmin brokerStatus: a broker that does not answer does not hide the others
            info = admin.broker_info(broker)
        except PymqError as err:
            print(f"pymq-admin: {err}", file=sys.stderr)
            failed.append(broker)
            continue
        for name, value in sorted(info.items()):
            print(f"{name:24} {value}")
    if failed:
        raise PymqError(f"broker(s) {', '.join(failed)} did not answer", code="BROKER_UNAVAILABLE")


# the commands that read a topic: a group's missing %DLQ% / %RETRY% topic is nothing to read yet
_READS_TOPIC = frozenset({"topic-stats", "tail", "query-message", "view-message", "progress"})


def _explain(err: PymqError, a: argparse.Namespace) -> PymqError:
    """``err``, or for a read of a group's %DLQ% / %RETRY% topic that does not exist, what that means
    (the broker creates it at the group's first dead letter or retry, as RocketMQ's)."""
    topic = getattr(a, "topic", None)
    if not (isinstance(err, TopicNotExistError) and topic and a.command in _READS_TOPIC):
        return err
    why = not_created_yet(topic)
    return err if why is None else TopicNotExistError(f"topic {topic!r} does not exist: {why}")


# The Python API's messages name its keywords (``offset=0 needs queue_id=``), right for a Python caller;
# pymq-admin's user gave flags: each command's keywords as its flags, then the connection's.
_COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "reset-offset": {"timestamp": "--timestamp", "offset": "--offset", "queue_id": "--queue-id"},
    "create-topic": {"queues": "--queues", "read_queues": "--read-queues", "write_queues": "--write-queues",
                     "dedup_window_ms": "--dedup-window-ms",
                     "message_type": "--message-type"},  # the broker's allow_shrink= names the flag too
    "update-group": {"retry_max_times": "--retry-max-times", "retry_queue_nums": "--retry-queue-nums"},
    "query-message": {"max_num": "--max"},
    "dead-letters": {"max_num": "--max"},
}
_CONNECTION_WORDING = (
    (re.compile(r"\bTLS (ca|cert|key)_file is set without (ca|cert|key)_file\b"),
     r"--tls-\1-file is set without --tls-\2-file"),
    (re.compile(r"(?<![\w-])(?:tls_)?(ca|cert|key)_file=(?=\S)"), r"--tls-\1-file "),
    (re.compile(r"\(TLS is the tls option\)"), "(TLS: --tls-ca-file)"),
    (re.compile(r"^namesrvAddr\b"), "--namesrv-addr"),
    (re.compile(r"\bgive both access_key and secret_key\b"), "give both --access-key and its secret key"),
)


def _cli_wording(text: str, command: str | None) -> str:
    """``text``, an error of the Python API, with its keyword names as pymq-admin's flags: ``offset=0
    needs queue_id=`` as ``--offset 0 needs --queue-id``, ``queues must be`` as ``--queues must be``."""
    for name, flag in _COMMAND_FLAGS.get(command or "", {}).items():
        text = re.sub(rf"(?<![\w-]){name}=(?=[\w'\"/.-])", f"{flag} ", text)  # name=value
        text = re.sub(rf"(?<![\w-]){name}=", flag, text)  # a bare name=
        text = re.sub(rf"(^|\] ){name}(?= must\b| -?\d+ (?:must|is)\b)", rf"\g<1>{flag}", text)
    for pattern, replacement in _CONNECTION_WORDING:
        text = pattern.sub(replacement, text)
    return text


def _split(values: Sequence[str] | None) -> list[str]:
    """Repeatable, comma-separated values: ``--action Pub,Sub --action Get``."""
    return [v.strip() for value in values or () for v in value.split(",") if v.strip()]


def _new_user_password(a: argparse.Namespace) -> str:
    """--password, else $PYMQ_USER_PASSWORD (out of the process list and the shell history), else a
    prompt on a terminal. (An update takes --password only: a variable exported for a create must
    not change the password of every user updated after it.)"""
    if a.password is not None:
        return str(a.password)
    from_env = os.environ.get("PYMQ_USER_PASSWORD")
    if from_env:
        return from_env
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"password of {a.username}: ")
    raise ValueError(f"user {a.username!r} needs a password: set PYMQ_USER_PASSWORD (or --password, which "
                     "other users of the machine can see in the process list)")


def _cmd_user(admin: Admin, a: argparse.Namespace) -> None:
    if a.user_command == "create":
        admin.create_user(a.username, _new_user_password(a), a.type or "Normal")
        print(f"user {a.username} created ({a.type or 'Normal'})")
    elif a.user_command == "update":
        admin.update_user(a.username, a.password, a.type, a.status)
        print(f"user {a.username} updated")
    elif a.user_command == "delete":
        admin.delete_user(a.username)
        print(f"user {a.username} deleted (with its ACL)")
    else:
        _print_frame(admin.list_users(a.filter or ""))


def _cmd_acl(admin: Admin, a: argparse.Namespace) -> None:
    if a.acl_command == "create":
        admin.create_acl(a.subject, _split(a.resource), _split(a.action), a.decision, _split(a.source_ip))
        actions, resources = ",".join(_split(a.action)), ", ".join(_split(a.resource))
        print(f"ACL of {a.subject}: {a.decision} {actions} on {resources}")
    elif a.acl_command == "delete":
        admin.delete_acl(a.subject, _split(a.resource))
        print(f"ACL of {a.subject}: {', '.join(_split(a.resource)) or 'every entry'} deleted")
    else:
        _print_frame(admin.list_acls(a.subject, _split(a.resource), _split(a.action), a.decision))


def _add_user_and_acl(sub: Any) -> None:
    sp = sub.add_parser("user", help="users of a broker with authentication (Super users only)")
    sp.set_defaults(fn=_cmd_user)
    users = sp.add_subparsers(dest="user_command", required=True)
    u = users.add_parser("create", help="create a user")
    u.add_argument("username", help="the user's name (a client's access key)")
    u.add_argument("--password", help="its secret key (default: $PYMQ_USER_PASSWORD, else asked on a "
                                       "terminal; a flag is visible in the process list)")
    u.add_argument("--type", choices=["Super", "Normal"], help="default Normal")
    u = users.add_parser("update", help="change a user's password, type or status")
    u.add_argument("username", help="the user to change")
    u.add_argument("--password", help="its new secret key (default: unchanged)")
    u.add_argument("--type", choices=["Super", "Normal"], help="its new type (default: unchanged)")
    u.add_argument("--status", choices=["enable", "disable"],
                   help="disable: its requests are refused (default: unchanged)")
    users.add_parser("delete", help="delete a user and its ACL") \
        .add_argument("username", help="the user to delete")
    users.add_parser("list", help="list users").add_argument("--filter", help="a part of the username")

    sp = sub.add_parser("acl", help="access control lists (ACL 2.0; Super users only)")
    sp.set_defaults(fn=_cmd_acl)
    acls = sp.add_subparsers(dest="acl_command", required=True)
    c = acls.add_parser("create", help="grant or deny a user actions on resources")
    c.add_argument("subject", help="User:<name>")
    c.add_argument("--resource", action="append", required=True,
                   help="Topic:<name>, Group:<name>, Cluster:<name>; a name may end in * or be *")
    c.add_argument("--action", action="append", required=True,
                   help="Pub, Sub, Create, Update, Delete, Get, List, All "
                        "(comma-separated, repeatable)")
    c.add_argument("--decision", choices=["Allow", "Deny"], default="Allow",
                   help="grant or deny the actions (default Allow; a Deny wins)")
    c.add_argument("--source-ip", action="append", help="CIDR range the entry holds for (repeatable)")
    d = acls.add_parser("delete", help="delete a user's ACL entries (all without --resource)")
    d.add_argument("subject", help="User:<name>")
    d.add_argument("--resource", action="append", help="only the entry of this resource (repeatable)")
    ls = acls.add_parser("list", help="list ACL entries")
    ls.add_argument("--subject", help="only this User:<name>'s entries")
    ls.add_argument("--resource", action="append", help="only the entries of this resource (repeatable)")
    ls.add_argument("--action", action="append", help="only entries with any of these actions (repeatable)")
    ls.add_argument("--decision", choices=["Allow", "Deny"], help="only Allow or only Deny entries")


def _connection_flags(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """Where to connect and as whom; without ``defaults`` a flag not given leaves the value alone."""
    def default(value: str | None) -> str | None:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("-e", "--endpoint", default=default(None),
                   help="broker host:port (default: $PYMQ_ENDPOINT)")
    p.add_argument("-n", "--namesrv-addr", default=default(None),
                   help="an Apache RocketMQ cluster's name servers, host:9876[;host2:9876]: the commands "
                        "that read it, send and tail (default: $PYMQ_NAMESRV_ADDR)")
    p.add_argument("--access-key", default=default(os.environ.get("PYMQ_ACCESS_KEY")),
                   help="user of a broker with authentication (default: $PYMQ_ACCESS_KEY)")
    p.add_argument("--secret-key", default=default(os.environ.get("PYMQ_SECRET_KEY")),
                   help="its secret key (default: $PYMQ_SECRET_KEY, which keeps it out of the process list)")
    p.add_argument("--tls-ca-file", default=default(None), help="connect with TLS, trusting this CA (PEM)")
    p.add_argument("--tls-cert-file", default=default(None),
                   help="client certificate for mutual TLS (PEM, with --tls-key-file)")
    p.add_argument("--tls-key-file", default=default(None), help="its private key (PEM)")


class _Command(argparse.ArgumentParser):
    """A command's parser (and its commands', ``user create``): it takes the connection flags too,
    after the command's name, as mqadmin's commands take ``-n`` (``pymq-admin topics -n host:9876``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _connection_flags(self, defaults=False)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pymq-admin", description="Administer a pymq broker.")
    _connection_flags(p, defaults=True)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Command)
    _add_user_and_acl(sub)

    def add(name: str, fn: Callable[[Admin, argparse.Namespace], None], help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        sp.set_defaults(fn=fn)
        return sp

    add("broker", _cmd_broker, "the broker's runtime info (offsets, flush, disk, pending transactions)") \
        .add_argument("--broker-name", help="one broker of a RocketMQ cluster (default: every one)")
    add("topics", _cmd_topics, "list topics (min_offset / max_offset: the lowest / highest of the topic's "
        "queues; each queue's: topic-stats)").add_argument("--all", action="store_true",
                                                           help="include %%RETRY%%/%%DLQ%%/system topics")
    add("groups", _cmd_groups, "list consumer groups and their retry settings").add_argument(
        "--all", action="store_true", help="include pymq's and RocketMQ's own groups")
    sp = add("create-topic", _cmd_create, "create or update a topic")
    sp.add_argument("topic", help="the topic's name")
    sp.add_argument("--queues", type=_at_least_one,
                    help="read and write queues (default: 4 for a new topic, unchanged for an existing one)")
    sp.add_argument("--read-queues", type=_at_least_one,
                    help="read queues only (RocketMQ's readQueueNums; default: --queues)")
    sp.add_argument("--write-queues", type=_at_least_one,
                    help="write queues only (RocketMQ's writeQueueNums; default: --queues): cut these "
                         "first to take queues away, once consumers have read what they hold")
    sp.add_argument("--dedup-window-ms", type=_at_least_zero,
                    help="drop a message whose msgId (UNIQ_KEY) the topic stored within this window "
                         "(default: 0, off, for a new topic; unchanged for an existing one)")
    sp.add_argument("--allow-shrink", action="store_true",
                    help="allow fewer queues than the topic has although the queues cut hold messages "
                         "a consumer group has not read, or no group has (they can no longer be read)")
    sp.add_argument("--message-type", type=str.upper, choices=TOPIC_MESSAGE_TYPES,
                    help="RocketMQ 5's TopicMessageType, what the official clients may send "
                         "(default: NORMAL for a new topic, unchanged for an existing one)")
    add("delete-topic", _cmd_delete, "delete a topic").add_argument("topic", help="the topic to delete")
    sp = add("update-group", _cmd_update_group, "change a consumer group's settings (mqadmin updateSubGroup)")
    sp.add_argument("group", help="the consumer group")
    sp.add_argument("--retry-max-times", type=_at_least_zero,
                    help="times a message is sent back before it goes to %%DLQ%%<group> (default: unchanged)")
    sp.add_argument("--retry-queue-nums", type=_at_least_one,
                    help="queues of %%RETRY%%<group> (default: unchanged)")
    sp.add_argument("--orderly", action=argparse.BooleanOptionalAction, default=None,
                    help="consumeMessageOrderly: a FIFO group for RocketMQ 5's clients")
    sp.add_argument("--consume-enable", action=argparse.BooleanOptionalAction, default=None,
                    help="consumeEnable: --no-consume-enable pauses the group (its pulls are refused)")
    add("topic-stats", _cmd_stats, "per-queue offsets of a topic").add_argument("topic", help="the topic")
    sp = add("progress", _cmd_progress, "a consumer group's progress and lag")
    sp.add_argument("group", help="the consumer group")
    sp.add_argument("--topic", help="only this topic, every read queue of it (default: the topics the group "
                                    "has progress on)")
    sp = add("reset-offset", _cmd_reset_offset,
             "move a consumer group's offsets on a topic, by time or to an offset "
             "(mqadmin resetOffsetByTime)")
    sp.add_argument("group", help="the consumer group")
    sp.add_argument("topic", help="the topic whose queues move")
    sp.add_argument("--timestamp", type=_reset_time,
                    help="to the first message stored at or after this time: ms since the epoch, an ISO "
                         "8601 date-time (without an offset: local time), earliest, latest or now")
    sp.add_argument("--offset", type=_at_least_zero, help="to this queue offset (with --queue-id)")
    sp.add_argument("--queue-id", type=_at_least_zero,
                    help="only this queue (default: every queue of the topic)")
    sp = add("dead-letters", _cmd_dead_letters, "browse a group's dead letters")
    sp.add_argument("group", help="the consumer group (its %%DLQ%%<group> topic)")
    sp.add_argument("--max", type=_at_least_one, default=100, help="at most this many (default 100)")
    sp = add("resend-dead-letters", _cmd_resend, "re-send dead letters to their original topic")
    sp.add_argument("group", help="the consumer group (its %%DLQ%%<group> topic)")
    sp.add_argument("--msg-id", action="append", help="only these (repeatable); default: all")
    add("purge-dead-letters", _cmd_purge, "drop a group's dead letters") \
        .add_argument("group", help="the consumer group (its %%DLQ%%<group> topic)")
    sp = add("view-message", _cmd_view, "a message by offsetMsgId (or msgId with --topic)")
    sp.add_argument("msg_id", metavar="ID",
                    help="an offsetMsgId (store host and commit log offset: a send result's offset_msg_id, "
                         "dead-letters' origin_msg_id), or a msgId (UNIQ_KEY, what query-message prints) "
                         "with --topic")
    sp.add_argument("--topic", help="the msgId's topic: ID is a msgId (without it, an offsetMsgId)")
    sp = add("query-message", _cmd_query, "messages by key")
    sp.add_argument("topic", help="the topic to search")
    sp.add_argument("key", help="a key of the message's KEYS, or its msgId (UNIQ_KEY)")
    sp.add_argument("--max", type=_at_least_one, default=32, help="at most this many (default 32)")
    sp = add("send", _cmd_send, "bulk-send test messages")
    sp.add_argument("topic", help="the topic to send to")
    sp.add_argument("--count", type=_at_least_one, default=1000, help="messages (default 1000)")
    sp.add_argument("--size", type=_at_least_one, default=200, help="body bytes (default 200)")
    sp.add_argument("--batch", type=_at_least_one, default=1000, help="messages per request (default 1000)")
    sp.add_argument("--tags", help="the messages' tag")
    sp = add("tail", _cmd_tail, "the last messages of each queue of a topic")
    sp.add_argument("topic", help="the topic")
    sp.add_argument("--last", type=_at_least_one, default=5,
                    help="how many of EACH queue (default 5): a topic of 4 queues shows up to 4 x N")
    sp.add_argument("--group", help=(
        f"the group to pull as; nothing is committed (default {ADMIN_TAIL_GROUP}; on RocketMQ "
        f"{TOOLS_CONSUMER_GROUP}, which every broker has)"))
    return p


def _pick_target(args: argparse.Namespace) -> str | None:
    """A pymq broker (``-e``) or a RocketMQ cluster (``-n``): a flag wins over the other's
    environment variable. What is wrong, or None."""
    if args.endpoint and args.namesrv_addr:
        return "give --endpoint (a pymq broker) or --namesrv-addr (an Apache RocketMQ cluster), not both"
    if not args.endpoint and not args.namesrv_addr:
        env_endpoint, env_namesrv = os.environ.get("PYMQ_ENDPOINT"), os.environ.get("PYMQ_NAMESRV_ADDR")
        if env_endpoint and env_namesrv:
            return ("PYMQ_ENDPOINT and PYMQ_NAMESRV_ADDR are both set: say which with --endpoint or "
                    "--namesrv-addr")
        args.endpoint, args.namesrv_addr = env_endpoint, env_namesrv
    if not args.endpoint and not args.namesrv_addr:
        return ("give --endpoint host:port of a pymq broker (or set PYMQ_ENDPOINT), or --namesrv-addr "
                "host:9876 of an Apache RocketMQ cluster (or PYMQ_NAMESRV_ADDR)")
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = _pick_target(args)
    if problem:
        print(f"pymq-admin: {problem}", file=sys.stderr)
        return 2
    if bool(args.access_key) != bool(args.secret_key):
        print("pymq-admin: --access-key and its secret key go together: set PYMQ_SECRET_KEY (or "
              "--secret-key, which other users can see in the process list) with --access-key "
              "(or PYMQ_ACCESS_KEY)", file=sys.stderr)
        return 2
    if args.namesrv_addr and (args.tls_ca_file or args.tls_cert_file or args.tls_key_file):
        print("pymq-admin: the --tls-* options are for a pymq broker (--endpoint), not --namesrv-addr",
              file=sys.stderr)
        return 2
    try:
        args.security = {"access_key": args.access_key, "secret_key": args.secret_key}
        if args.namesrv_addr:
            args.target = {"namesrv_addr": args.namesrv_addr}
        else:
            args.target = {"endpoint": args.endpoint}
            args.security["tls"] = client_tls(None, args.tls_ca_file, args.tls_cert_file, args.tls_key_file)
        args.fn(Admin(**args.target, **args.security), args)
        # here, not at the interpreter's exit: an output shorter than stdout's buffer (a pipe's is
        # block-buffered) meets a reader gone only then ("Exception ignored ... BrokenPipeError", 120)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`pymq-admin tail orders | head`): stop quietly, as other tools do;
        # stdout to /dev/null so that the interpreter's final flush does not fail once more
        with contextlib.suppress(OSError, ValueError):  # a stdout without a file (io.UnsupportedOperation)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except PymqError as err:
        print(f"pymq-admin: {_cli_wording(str(_explain(err, args)), args.command)}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as err:
        print(f"pymq-admin: {_cli_wording(str(err), args.command)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
