"""``pymq-admin``: topics, groups, lag and dead letters from a terminal.

    pymq-admin --endpoint 127.0.0.1:8081 topics
    pymq-admin -e 127.0.0.1:8081 create-topic orders --queues 4
    pymq-admin -e 127.0.0.1:8081 topic-stats orders
    pymq-admin -e 127.0.0.1:8081 progress analytics
    pymq-admin -e 127.0.0.1:8081 dead-letters analytics
    pymq-admin -e 127.0.0.1:8081 resend-dead-letters analytics [--msg-id ID ...]
    pymq-admin -e 127.0.0.1:8081 send orders --count 100000 --size 200

The endpoint can also come from PYMQ_ENDPOINT.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from .client import Admin, Message, Producer, PullConsumer
from .errors import PymqError

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

    def close(self) -> None:
        self.out.write("\n")
        self.out.flush()


def _cell(value: Any) -> str:
    if isinstance(value, bytes):
        text = value[:40].decode("utf-8", "replace")
        return text + ("..." if len(value) > 40 else "")
    return str(value)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned text table (timestamps in ms shown as UTC times)."""
    if not rows:
        return "(none)"
    cells = []
    for row in rows:
        line = []
        for c in columns:
            v = row.get(c)
            if c.endswith("timestamp") and isinstance(v, int):
                v = (
                    datetime.fromtimestamp(v / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
                    if v else "-"
                )
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


def _cmd_create(admin: Admin, a: argparse.Namespace) -> None:
    cfg = admin.create_topic(a.topic, a.queues, dedup_window_ms=a.dedup_window_ms)
    print(f"topic {cfg.topic_name}: {cfg.read_queue_nums} read / {cfg.write_queue_nums} write queues")


def _cmd_delete(admin: Admin, a: argparse.Namespace) -> None:
    admin.delete_topic(a.topic)
    print(f"topic {a.topic} deleted")


def _cmd_stats(admin: Admin, a: argparse.Namespace) -> None:
    _print_frame(admin.topic_stats(a.topic))


def _cmd_progress(admin: Admin, a: argparse.Namespace) -> None:
    frame = admin.group_progress(a.group, a.topic)
    _print_frame(frame)
    if len(frame):
        print(f"total lag: {int(frame['lag'].sum())}")


def _cmd_dead_letters(admin: Admin, a: argparse.Namespace) -> None:
    _print_frame(admin.dead_letters(a.group, a.max))


def _cmd_resend(admin: Admin, a: argparse.Namespace) -> None:
    bar = ProgressBar(0, "re-sending")
    sent = admin.resend_dead_letters(a.group, a.msg_id or None, progress=bar.update)
    bar.close()
    print(f"{sent} dead letter(s) of {a.group} re-sent to their original topics")


def _cmd_purge(admin: Admin, a: argparse.Namespace) -> None:
    admin.purge_dead_letters(a.group)
    print(f"dead letters of {a.group} purged")


def _cmd_view(admin: Admin, a: argparse.Namespace) -> None:
    m = admin.view_message(a.msg_id, a.topic)
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


def _cmd_send(admin: Admin, a: argparse.Namespace) -> None:
    body = b"x" * a.size
    bar = ProgressBar(a.count, f"sending to {a.topic}")
    done = 0
    with Producer(admin.endpoint) as producer:
        while done < a.count:
            n = min(a.batch, a.count - done)
            producer.send_batch([Message(a.topic, body, tags=a.tags) for _ in range(n)])
            done += n
            bar.update(done)
    bar.close()
    print(f"{done} message(s) sent to {a.topic}")


def _cmd_tail(admin: Admin, a: argparse.Namespace) -> None:
    consumer = PullConsumer(admin.endpoint, a.group)
    for mq in consumer.queues(a.topic):
        end = consumer.max_offset(mq)
        start = max(consumer.min_offset(mq), end - a.last)
        for m in consumer.pull(mq, start, a.last).messages if end > start else []:
            print(f"{mq} @{m.queue_offset} tags={m.tags} keys={' '.join(m.keys)} body={_cell(m.body)}")


def _cmd_broker(admin: Admin, a: argparse.Namespace) -> None:
    for name, value in sorted(admin.broker_info().items()):
        print(f"{name:24} {value}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pymq-admin", description="Administer a pymq broker.")
    p.add_argument("-e", "--endpoint", default=os.environ.get("PYMQ_ENDPOINT"),
                   help="broker host:port (default: $PYMQ_ENDPOINT)")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable[[Admin, argparse.Namespace], None], help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        sp.set_defaults(fn=fn)
        return sp

    add("broker", _cmd_broker, "the broker's runtime info (offsets, flush, pending transactions)")
    add("topics", _cmd_topics, "list topics").add_argument("--all", action="store_true",
                                                           help="include %%RETRY%%/%%DLQ%%/system topics")
    sp = add("create-topic", _cmd_create, "create or update a topic")
    sp.add_argument("topic")
    sp.add_argument("--queues", type=int, default=4)
    sp.add_argument("--dedup-window-ms", type=int, default=0)
    add("delete-topic", _cmd_delete, "delete a topic").add_argument("topic")
    add("topic-stats", _cmd_stats, "per-queue offsets of a topic").add_argument("topic")
    sp = add("progress", _cmd_progress, "a consumer group's progress and lag")
    sp.add_argument("group")
    sp.add_argument("--topic")
    sp = add("dead-letters", _cmd_dead_letters, "browse a group's dead letters")
    sp.add_argument("group")
    sp.add_argument("--max", type=int, default=100)
    sp = add("resend-dead-letters", _cmd_resend, "re-send dead letters to their original topic")
    sp.add_argument("group")
    sp.add_argument("--msg-id", action="append", help="only these (repeatable); default: all")
    add("purge-dead-letters", _cmd_purge, "drop a group's dead letters").add_argument("group")
    sp = add("view-message", _cmd_view, "a message by offsetMsgId (or msgId with --topic)")
    sp.add_argument("msg_id")
    sp.add_argument("--topic")
    sp = add("query-message", _cmd_query, "messages by key")
    sp.add_argument("topic")
    sp.add_argument("key")
    sp.add_argument("--max", type=int, default=32)
    sp = add("send", _cmd_send, "bulk-send test messages")
    sp.add_argument("topic")
    sp.add_argument("--count", type=int, default=1000)
    sp.add_argument("--size", type=int, default=200)
    sp.add_argument("--batch", type=int, default=1000)
    sp.add_argument("--tags")
    sp = add("tail", _cmd_tail, "the last messages of each queue")
    sp.add_argument("topic")
    sp.add_argument("--last", type=int, default=5)
    sp.add_argument("--group", default="PYMQ_ADMIN_TAIL")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.endpoint:
        print("pymq-admin: give --endpoint host:port (or set PYMQ_ENDPOINT)", file=sys.stderr)
        return 2
    try:
        args.fn(Admin(args.endpoint), args)
    except (PymqError, ValueError, TypeError) as err:
        print(f"pymq-admin: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
