#!/usr/bin/env python
"""The cost of authentication, authorization and TLS on send and pull (issue 17).

Four brokers configurations, each its own broker process on loopback, alternating in every
round so that the machine's noise falls on all alike:

* ``plain``: no security (the default);
* ``auth``: ``--authentication-enabled --authorization-enabled``; the client is a Normal
  user whose ACL allows Pub and Sub (every request signed and checked against the ACL);
* ``tls``: ``--tls-cert-file/--tls-key-file`` (a certificate made with openssl), the client
  verifying it;
* ``tls+auth``: both.

Figures per configuration, the median over ``--repeats`` rounds: batched send
(``Producer.send_batch`` of ``--batch`` messages of ``--body`` bytes, sync, one producer in
this process, ``--duration`` seconds) and pull (``PullConsumer.pull_raw`` passes over the
messages sent, ``--max-nums`` per pull, ``--duration`` seconds), in msgs/s, with the CPU µs
per message of the client and of the broker. ``--batch 1`` measures one message per request,
where a per-request cost shows most.

``--floor``: the same loops against a bare gRPC server (``bench_broker.py``'s: its own process,
one bytes-in/bytes-out method, nothing else), plaintext and TLS, with requests and answers of
the sizes pymq's send and pull carry, taking turns with the brokers in every round: what TLS
costs gRPC itself on the same bytes, the floor under pymq's figures.

``--spark ROWS``: the same four configurations as a user meets them, through the Spark
connector (options ``tls``/``tlsCaFile``, ``accessKey``/``secretKey``): the async sink, a
``readStream`` -> ``noop`` and a ``spark.read`` -> ``noop`` of ``ROWS`` rows (4 queues), the
four brokers taking turns for ``--repeats`` rounds after a warm-up (``side_by_side.py``'s
rounds, with the CPU µs per row of every process).

Usage::

    python benchmarks/bench_security.py             # 3 rounds of 4 s sends (~2 min)
    python benchmarks/bench_security.py --quick     # 1 round of 1 s (~20 s)
    python benchmarks/bench_security.py --configs plain,tls --floor --repeats 5   # with gRPC's own
    python benchmarks/bench_security.py --spark 1000000 --configs plain,tls   # Spark (~6 min)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _sub in ("proto", "broker_stub", "connector", "tests", "benchmarks"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

from bench_broker import bare_payload, bare_stub, pull_request_size, running_echo, wire_sizes  # noqa: E402
from broker_process import BrokerProcess  # noqa: E402
from pyspark_pymq.client import Admin, Message, MessageQueue, Producer, PullConsumer  # noqa: E402
from tls_certs import make_certificates  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROOT_USER, ROOT_PW = "root", "bench-root"
USER, USER_PW = "bench", "bench-secret"
CONFIGS = ("plain", "auth", "tls", "tls+auth")


def broker_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def broker_args(config: str, certs: Any) -> list[str]:
    args: list[str] = []
    if "auth" in config:
        args += ["--authentication-enabled", "--authorization-enabled",
                 "--init-authentication-user", f"{ROOT_USER}:{ROOT_PW}"]
    if "tls" in config:
        args += ["--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key]
    return args


def client_kwargs(config: str, certs: Any, user: str = USER,
                  password: str = USER_PW) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if "auth" in config:
        kw.update(access_key=user, secret_key=password)
    if "tls" in config:
        kw["tls_ca_file"] = certs.ca
    return kw


def prepare(endpoint: str, config: str, certs: Any, topic: str) -> None:
    admin = Admin(endpoint, **client_kwargs(config, certs, ROOT_USER, ROOT_PW))
    admin.create_topic(topic, 1)
    if "auth" in config:
        admin.create_user(USER, USER_PW)
        admin.create_acl(f"User:{USER}", [f"Topic:{topic}", "Group:bench-g"], ["Pub", "Sub", "Get"])


def run_one(proc: BrokerProcess, config: str, certs: Any, topic: str,
            a: argparse.Namespace) -> dict[str, float]:
    kw = client_kwargs(config, certs)
    body = b"x" * a.body
    batch = [Message(topic, body) for _ in range(a.batch)]
    with Producer(proc.endpoint, **kw) as producer:
        producer.send_batch(batch)  # warm-up: channel, route
        sent, c0, b0, t0 = 0, time.process_time(), broker_cpu(proc.pid), time.perf_counter()
        while time.perf_counter() - t0 < a.duration:
            producer.send_batch(batch)
            sent += a.batch
        send_s, send_c, send_b = time.perf_counter() - t0, time.process_time() - c0, broker_cpu(proc.pid) - b0
    consumer = PullConsumer(proc.endpoint, "bench-g", **kw)
    mq = MessageQueue(topic, "broker-a", 0)
    start, end = consumer.min_offset(mq), consumer.max_offset(mq)
    consumer.pull_raw(mq, start, 1)  # warm-up
    pulled, answers, answer_bytes = 0, 0, 0
    offset, c0, b0, t0 = start, time.process_time(), broker_cpu(proc.pid), time.perf_counter()
    while time.perf_counter() - t0 < a.duration:  # passes over the queue, as long as the sends ran
        batch_ = consumer.pull_raw(mq, offset, a.max_nums)
        pulled += batch_.message_count
        answers += 1
        answer_bytes += len(batch_.records) + len(batch_.record_sizes)
        offset = batch_.next_begin_offset if batch_.next_begin_offset < end else start
    pull_s, pull_c, pull_b = time.perf_counter() - t0, time.process_time() - c0, broker_cpu(proc.pid) - b0
    return {
        "send": sent / send_s, "send_client_us": send_c / sent * 1e6,
        "send_broker_us": send_b / sent * 1e6,
        "pull": pulled / pull_s, "pull_client_us": pull_c / pulled * 1e6,
        "pull_broker_us": pull_b / pulled * 1e6,
        "pull_answer_bytes": answer_bytes / answers,
    }


def run_floor(tls: bool, certs: Any, a: argparse.Namespace, pull_answer: int) -> dict[str, float]:
    """:func:`run_one`'s two loops against the bare gRPC server, with pymq's request and answer sizes."""
    send_req, send_resp = wire_sizes(a.body, a.batch)
    out: dict[str, float] = {}
    with running_echo((certs.server_cert, certs.server_key) if tls else None) as (endpoint, pid):
        call = bare_stub(endpoint, certs.ca if tls else None)
        for what, per_call, payload in (
            ("send", a.batch, bare_payload(send_req, send_resp)),
            ("pull", a.max_nums, bare_payload(pull_request_size(), pull_answer)),
        ):
            call(payload)  # warm-up: the channel (and the TLS handshake)
            calls, c0, b0, t0 = 0, time.process_time(), broker_cpu(pid), time.perf_counter()
            while time.perf_counter() - t0 < a.duration:
                call(payload)
                calls += 1
            n = calls * per_call
            out[what] = n / (time.perf_counter() - t0)
            out[f"{what}_client_us"] = (time.process_time() - c0) / n * 1e6
            out[f"{what}_broker_us"] = (broker_cpu(pid) - b0) / n * 1e6
    return out


def _name(config: str) -> str:
    """The configuration as a name that may be part of a topic name ("tls+auth" -> "tls-auth")."""
    return config.replace("+", "-")


def spark_rounds(certs: Any, work: Path, configs: list[str], rows: int, runs: int) -> None:
    """The Spark connector on a broker of each configuration, taking turns; prints the table."""
    import contextlib

    import side_by_side as sbs
    from pyspark.sql import SparkSession

    sbs.use_repository()
    spark = (SparkSession.builder.master("local[2]").appName("pymq-bench-security")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sbs.SPARK_JVM[0] = spark.sparkContext._gateway.proc.pid
    df = spark.range(rows, numPartitions=2).selectExpr("CAST(repeat('x', 200) AS BINARY) AS body").cache()
    df.count()
    try:
        with contextlib.ExitStack() as brokers:
            targets = []
            for config in configs:
                proc = brokers.enter_context(
                    BrokerProcess(work / f"spark-{config}", broker_args(config, certs)))
                root = Admin(proc.endpoint, **client_kwargs(config, certs, ROOT_USER, ROOT_PW))
                options: dict[str, str] = {}
                if "auth" in config:
                    root.create_user(USER, USER_PW)
                    # spark.read without consumerGroup pulls as PYMQ_SPARK_READER
                    resources = ["Topic:bench-*", "Group:bench-*", "Group:PYMQ_SPARK_READER"]
                    root.create_acl(f"User:{USER}", resources, ["Pub", "Sub", "Get"])
                    options.update(accessKey=USER, secretKey=USER_PW)
                if "tls" in config:
                    options.update(tls="true", tlsCaFile=certs.ca)

                def make_topic(topic: str, root: Admin = root) -> None:
                    root.create_topic(topic, 4)

                targets.append(sbs.PymqTarget(_name(config), "endpoint", proc.endpoint, {proc.pid},
                                              make_topic, df, options=options))
            results = sbs.run_rounds(spark, targets, rows, work, runs=runs, warmups=1, wait_quiet_s=0)
    finally:
        spark.stop()
    print(f"\nThe Spark connector, {rows:,} rows of 200 B, 4 queues; medians of {runs} rounds: rows/s, the "
          f"change against {configs[0]}, CPU µs per row of all processes\n")
    print("| figure | " + " | ".join(configs) + " |")
    print("|---|" + "---|" * len(configs))
    for figure in sbs.FIGURES:
        base = results.median(figure, _name(configs[0])) or 0.0
        cells = []
        for config in configs:
            rate = results.median(figure, _name(config)) or 0.0
            cpu_s = (results.cpu_median(figure, _name(config)) or {}).get("all", 0.0)
            vs = f", **{rate / base - 1:+.1%}**" if config != configs[0] and base else ""
            cells.append(f"{sbs.kilo(rate)}{vs}; {cpu_s * 1e6 / rows:.2f} µs")
        print(f"| {sbs.FIGURE_NAMES[figure]} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 1 s sends")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of sends per run (default 4)")
    ap.add_argument("--body", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--max-nums", type=int, default=1000)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--floor", action="store_true",
                    help="also the bare gRPC server, plaintext and TLS, with pymq's request and answer sizes")
    ap.add_argument("--spark", type=int, default=0, metavar="ROWS",
                    help="the Spark connector's sink and reads of ROWS rows instead of the client loops")
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.duration = 1, 1.0
    configs = [c for c in a.configs.split(",") if c]
    print(f"`python benchmarks/bench_security.py {' '.join(argv if argv is not None else sys.argv[1:])}`, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, {platform.platform()}")
    floors = [c for c in ("plain", "tls") if a.floor]
    names = [*configs, *(f"bare gRPC {f}" for f in floors)]
    results: dict[str, list[dict[str, float]]] = {c: [] for c in names}
    with tempfile.TemporaryDirectory(prefix="pymq-bench-security-") as tmp:
        certs = make_certificates(Path(tmp))
        if a.spark:
            spark_rounds(certs, Path(tmp), configs, a.spark, a.repeats)
            return 0
        for r in range(a.repeats):
            for config in configs:
                topic = f"bench-sec-{r}"
                with BrokerProcess(Path(tmp) / f"{config}-{r}", broker_args(config, certs)) as proc:
                    prepare(proc.endpoint, config, certs, topic)
                    results[config].append(run_one(proc, config, certs, topic, a))
            answer = int(statistics.median(x["pull_answer_bytes"] for x in results[configs[0]]))
            for floor in floors:
                results[f"bare gRPC {floor}"].append(run_floor(floor == "tls", certs, a, answer))
    base = {k: statistics.median(x[k] for x in results[configs[0]]) for k in results[configs[0]][0]}
    print(f"\n{a.batch} x {a.body} B per send_batch (sync), pull_raw of {a.max_nums}; "
          f"median of {a.repeats} (min-max)\n")
    print("| config | send msgs/s | vs plain | client / broker CPU µs/msg | pull msgs/s | vs plain "
          "| client / broker CPU µs/msg |")
    print("|---|---|---|---|---|---|---|")
    for config in results:
        rs = results[config]
        if config == "bare gRPC plain":
            base = {k: statistics.median(x[k] for x in rs) for k in rs[0]}

        def med(k: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(x[k] for x in rs)

        def span(k: str, rs: list[dict[str, float]] = rs) -> str:
            return f"{min(x[k] for x in rs) / 1000:.0f}k-{max(x[k] for x in rs) / 1000:.0f}k"

        print(f"| {config} | {med('send') / 1000:.1f}k ({span('send')}) "
              f"| {med('send') / base['send'] - 1:+.1%} "
              f"| {med('send_client_us'):.2f} / {med('send_broker_us'):.2f} "
              f"| {med('pull') / 1000:.0f}k ({span('pull')}) | {med('pull') / base['pull'] - 1:+.1%} "
              f"| {med('pull_client_us'):.2f} / {med('pull_broker_us'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
