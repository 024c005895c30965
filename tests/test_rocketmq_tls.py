"""TLS to Apache RocketMQ: a real 5.3.3 name server and broker in TLS-only mode (enforcing).

The certificates are made here with openssl (tests/tls_certs.py); the Spark options
``tls`` / ``tlsCaFile`` carry them to the driver and the executors.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark_pymq.backend import BackendConfig, open_backend
from pyspark_pymq.backend.base import parse_backend_options
from pyspark_pymq.errors import PymqError
from pyspark_pymq.tls import TlsConfig
from rocketmq_cluster import RocketMQCluster
from tls_certs import Certificates, make_certificates


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RocketMQCluster, Certificates]]:
    base = tmp_path_factory.mktemp("rocketmq-tls")
    certs = make_certificates(base)
    with RocketMQCluster(base / "cluster", brokers=("broker-a",),
                         tls=(certs.server_cert, certs.server_key)) as cluster:
        yield cluster, certs


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


TlsCluster = tuple[RocketMQCluster, Certificates]


def test_spark_writes_and_reads_over_tls(spark: Any, tls_cluster: TlsCluster) -> None:
    cluster, certs = tls_cluster
    topic = _unique("tls")
    cluster.create_topic(topic, queues=2)
    tls = {"namesrvAddr": cluster.namesrv_addr, "tls": "true", "tlsCaFile": certs.ca}
    rows = [(f"k{i}", f"body-{i}".encode()) for i in range(40)]
    df = spark.createDataFrame(rows, "keys string, body binary")
    df.write.format("pymq").options(**tls).option("topic", topic).mode("append").save()

    backend = open_backend(BackendConfig(None, cluster.namesrv_addr, tls=TlsConfig(certs.ca)))
    deadline = time.monotonic() + 30
    while sum(b.max_offset for b in backend.queue_bounds(topic).values()) < len(rows):
        assert time.monotonic() < deadline, "the broker did not index the 40 messages in 30 s"
        time.sleep(0.2)

    got = (spark.read.format("pymq").options(**tls).option("topic", topic)
           .option("startingOffsets", "earliest").load().select("keys", "body").collect())
    assert sorted((r["keys"][0], bytes(r["body"])) for r in got) == sorted(rows)
    # the admin tables over TLS too: the Admin and the views built on it
    from pyspark_pymq import Admin

    stats = Admin(namesrv_addr=cluster.namesrv_addr, tls=True, tls_ca_file=certs.ca).topic_stats(topic)
    assert int(stats["max_offset"].sum()) == len(rows)
    queues = (spark.read.format("pymq").options(**tls).option("view", "queues").option("topic", topic)
              .load().collect())
    assert sum(r["max_offset"] for r in queues) == len(rows)


def test_a_plaintext_client_is_told_to_turn_tls_on(tls_cluster: TlsCluster) -> None:
    cluster, _ = tls_cluster
    t0 = time.monotonic()
    with pytest.raises(PymqError, match=r"set the option tls=true") as err:
        open_backend(BackendConfig(None, cluster.namesrv_addr), timeout_s=5).queue_bounds("TBW102")
    assert cluster.namesrv_addr in str(err.value)
    assert time.monotonic() - t0 < 10


def test_a_certificate_no_trusted_ca_signed_is_refused(tls_cluster: TlsCluster) -> None:
    cluster, certs = tls_cluster
    with pytest.raises(PymqError, match=r"certificate was refused .*tlsCaFile") as err:
        open_backend(BackendConfig(None, cluster.namesrv_addr, tls=TlsConfig(certs.other_ca)),
                     timeout_s=5).queue_bounds("TBW102")
    assert cluster.namesrv_addr in str(err.value)


def _parse(**options: str) -> BackendConfig:
    return parse_backend_options(options.get, "pymq source option")


def test_tls_options_are_checked_before_the_query(tls_cluster: TlsCluster, tmp_path: Path) -> None:
    cluster, certs = tls_cluster
    ns = cluster.namesrv_addr
    config = _parse(namesrvAddr=ns, tls="TRUE", tlsCaFile=certs.ca)
    assert config.tls == TlsConfig(certs.ca)
    assert _parse(namesrvAddr=ns).tls is None
    assert _parse(namesrvAddr=ns, tls="true").tls == TlsConfig()  # the system's trust store
    cases = {
        "tls='yes' is not valid: use true or false": {"tls": "yes"},
        "tlsCaFile=.* is set but tls is not: add .option\\('tls', 'true'\\)": {"tlsCaFile": certs.ca},
        "tlsCertFile and tlsKeyFile go together": {"tls": "true", "tlsCertFile": certs.client_cert},
        "tlsCaFile='.*missing.pem' is not a readable file": {"tls": "true",
                                                            "tlsCaFile": str(tmp_path / "missing.pem")},
    }
    for message, options in cases.items():
        with pytest.raises(ValueError, match=message):
            _parse(namesrvAddr=ns, **options)
