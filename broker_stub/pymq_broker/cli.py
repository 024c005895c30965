"""``pymq-broker``: run a broker process.

    pymq-broker --data-dir DIR --host 127.0.0.1 --port PORT \
        [--flush-disk-type ASYNC_FLUSH|SYNC_FLUSH] [--auto-create-topic-enable]
        [--authentication-enabled [--authorization-enabled] --init-authentication-user USER:PASSWORD]
        [--tls-cert-file PEM --tls-key-file PEM [--tls-client-ca-file PEM]]

``--port 0`` picks a free port. The broker prints ``pymq broker listening on
HOST:PORT`` once it serves, and shuts down cleanly on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from pymq_proto.malloc import tune_malloc

from .controller import BrokerController, build_configs
from .store.config import DEFAULT_MESSAGE_DELAY_LEVEL, FLUSH_DISK_TYPES, parse_delay_levels


def _delay_levels(text: str) -> str:
    try:
        parse_delay_levels(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pymq-broker", description="Run a pymq broker.")
    p.add_argument("--data-dir", required=True, help="where the store and configs live")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8081, help="port; 0 picks a free one (default 8081)")
    p.add_argument("--broker-name", default="broker-a")
    p.add_argument("--flush-disk-type", choices=FLUSH_DISK_TYPES, default="ASYNC_FLUSH")
    p.add_argument("--auto-create-topic-enable", action="store_true",
                   help="create unknown topics on first send (4 queues); off by default")
    p.add_argument("--enable-property-filter", action="store_true",
                   help="allow SQL92 property filters in subscriptions (off by default)")
    p.add_argument("--message-delay-level", type=_delay_levels, default=DEFAULT_MESSAGE_DELAY_LEVEL,
                   help=f"delay of each level, units ms s m h d (default {DEFAULT_MESSAGE_DELAY_LEVEL!r})")
    p.add_argument("--file-reserved-time", type=float, default=72.0,
                   help="hours a commit log segment is kept (default 72)")
    p.add_argument("--mapped-file-size-commit-log", type=int, default=256 * 1024 * 1024,
                   help="bytes per commit log segment (default 256 MiB)")
    p.add_argument("--max-message-size", type=int, default=4 * 1024 * 1024,
                   help="largest message body, and batch, a send may carry, bytes (default 4 MiB, "
                        "RocketMQ's maxMessageSize; a commit log segment holds at least two)")
    p.add_argument("--warm-mapped-file-enable", action=argparse.BooleanOptionalAction, default=True,
                   help="allocate the commit log's disk blocks ahead of its writer in a service thread "
                        "(faster appends; default on)")
    p.add_argument("--disk-space-warning-level-ratio", type=int, default=90,
                   help="percent of the store's disk used above which sends are refused "
                        "(SERVICE_NOT_AVAILABLE, disk full) until there is room; 1..100 (default 90)")
    p.add_argument("--clean-resource-interval", type=int, default=10_000,
                   help="ms between retention checks (default 10000)")
    p.add_argument("--sync-flush-timeout", type=int, default=5_000, help="ms (default 5000)")
    p.add_argument("--access-message-in-memory-max-ratio", type=int, default=40,
                   help="percent of physical memory of the newest commit log counted as in memory "
                        "(a never-committed group reads 0 on a queue whose first message is; default 40)")
    p.add_argument("--transaction-timeout", type=int, default=6_000,
                   help="ms before an unresolved transaction is first checked back (default 6000)")
    p.add_argument("--transaction-check-interval", type=int, default=60_000,
                   help="ms between check-backs (default 60000)")
    p.add_argument("--transaction-check-max", type=int, default=15,
                   help="check-backs before a transaction is given up (default 15)")
    p.add_argument("--authentication-enabled", action="store_true",
                   help="every request must be signed by a user (access key / secret key); off by default: "
                        "an open broker must stay on loopback")
    p.add_argument("--authorization-enabled", action="store_true",
                   help="check every request against the users' ACLs (needs --authentication-enabled)")
    p.add_argument("--init-authentication-user", metavar="USER:PASSWORD",
                   default=os.environ.get("PYMQ_INIT_AUTHENTICATION_USER"),
                   help="create this Super user if it does not exist (default: "
                        "$PYMQ_INIT_AUTHENTICATION_USER, which keeps the password out of the process list)")
    p.add_argument("--authentication-clock-skew-ms", type=int, default=300_000,
                   help="ms a request's signed date-time may be from the broker's clock (default 300000)")
    p.add_argument("--tls-cert-file", help="PEM certificate chain: serve TLS only (with --tls-key-file)")
    p.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    p.add_argument("--tls-client-ca-file",
                   help="PEM CA certificates: clients must present a certificate they signed (mutual TLS)")
    p.add_argument("--min-invisible-time-mills-for-recv", type=int, default=10_000,
                   help="RocketMQ 5 clients: shortest invisible duration of a receive, ms (default 10000)")
    p.add_argument("--max-pull-bytes-in-flight-per-client", type=int, default=256 * 1024 * 1024,
                   help="bytes of pull answers one connection may leave unread before its pulls are "
                        "answered SYSTEM_BUSY (default 256 MiB)")
    p.add_argument("--log-level", default="INFO")
    return p


async def _serve(args: argparse.Namespace) -> int:
    broker_config, store_config = build_configs(
        args.data_dir,
        host=args.host,
        port=args.port,
        broker_name=args.broker_name,
        auto_create_topic_enable=args.auto_create_topic_enable,
        enable_property_filter=args.enable_property_filter,
        flush_disk_type=args.flush_disk_type,
        message_delay_level=args.message_delay_level,
        file_reserved_time=args.file_reserved_time,
        mapped_file_size_commit_log=args.mapped_file_size_commit_log,
        max_message_size=args.max_message_size,
        warm_mapped_file_enable=args.warm_mapped_file_enable,
        clean_resource_interval=args.clean_resource_interval,
        disk_space_warning_level_ratio=args.disk_space_warning_level_ratio,
        sync_flush_timeout=args.sync_flush_timeout,
        access_message_in_memory_max_ratio=args.access_message_in_memory_max_ratio,
        transaction_timeout=args.transaction_timeout,
        transaction_check_interval=args.transaction_check_interval,
        transaction_check_max=args.transaction_check_max,
        min_invisible_time_mills_for_recv=args.min_invisible_time_mills_for_recv,
        max_pull_bytes_in_flight_per_client=args.max_pull_bytes_in_flight_per_client,
        authentication_enabled=args.authentication_enabled,
        authorization_enabled=args.authorization_enabled,
        init_authentication_user=args.init_authentication_user,
        authentication_clock_skew_ms=args.authentication_clock_skew_ms,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        tls_client_ca_file=args.tls_client_ca_file,
    )
    controller = BrokerController(broker_config, store_config)
    endpoint = await controller.start()
    print(f"pymq broker listening on {endpoint}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await controller.shutdown()
    print("pymq broker stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tune_malloc(64 << 20, 256 << 20)  # requests and pull answers of up to tens of MB stay in the heap
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(_serve(args))
    except (ValueError, OSError) as err:
        print(f"pymq-broker: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
