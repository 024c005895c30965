"""Shared fixtures: a real broker process on loopback, and one local Spark session.

Tests import the working tree (connector/, broker_stub/, proto/) rather than an
installed copy, and Spark's Python workers get the same path through
PYTHONPATH, so ``format("pymq")`` is found by Spark's own look-up of
``pyspark_*`` modules, not through an editable install.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from source_tree import compile_bytecode, use_source_tree

use_source_tree()
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
compile_bytecode()

from broker_process import BrokerProcess  # noqa: E402
from rocketmq_cluster import RocketMQCluster  # noqa: E402

# Short delay levels so that retry ladders run in seconds in tests.
FAST_DELAY_LEVELS = (
    "100ms 200ms 300ms 300ms 300ms 300ms 300ms 300ms 300ms "
    "300ms 300ms 300ms 300ms 300ms 300ms 300ms 300ms 300ms"
)


@pytest.fixture(scope="session", autouse=True)
def java_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``java.io.tmpdir`` of every JVM the tests start (Spark drivers, RocketMQ, the Java client).

    JVMs keep files there that only a clean exit removes, and some not even then: Spark's block
    and artifact directories and the native libraries it unpacks (lz4, snappy), RocketMQ's
    RocksDB library and self-signed certificates. The drivers and brokers the tests kill -9 left
    them in /tmp, ~30 MB a run; here they go with the session's other temporary files.
    """
    path = tmp_path_factory.mktemp("java-tmp")
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{before or ''} -Djava.io.tmpdir={path}".strip()
    yield path
    if before is None:
        os.environ.pop("JAVA_TOOL_OPTIONS", None)
    else:
        os.environ["JAVA_TOOL_OPTIONS"] = before


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh broker process with its own data dir, on a free loopback port."""
    with BrokerProcess(tmp_path / "broker") as proc:
        yield proc


@pytest.fixture
def endpoint(broker: BrokerProcess) -> str:
    return broker.endpoint


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole session (fast delay levels); use distinct topic names."""
    data = tmp_path_factory.mktemp("shared-broker")
    with BrokerProcess(data, extra_args=["--message-delay-level", FAST_DELAY_LEVELS]) as proc:
        yield proc


@pytest.fixture(scope="session")
def rocketmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQCluster]:
    """A real Apache RocketMQ 5.3.3 cluster for the session: a name server, broker-a and broker-b.

    Shared by every test that asks for it: use distinct topic and group names. Tests that
    kill or restart a broker must leave it running again.
    """
    cluster = RocketMQCluster(tmp_path_factory.mktemp("rocketmq"))
    cluster.start()
    yield cluster
    # The session is over and nothing reads the stores again: no need to wait out the
    # brokers' ~10 s shutdown hooks.
    cluster.stop(grace=3.0)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The one Spark session of the test run (local[2])."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pymq-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.driver.memory", "2g")
        # C1 only, as the crash tests' drivers and the RocketMQ fixture's JVMs: small data, many
        # short queries, and C2's compiler threads compete with the tests for the two cores
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


# Fixtures that start a broker, a RocketMQ cluster or Spark: a test using one is an integration
# test. `make unit` runs the others (no Spark, no broker process), in well under a minute.
_INTEGRATION_FIXTURES = {"broker", "endpoint", "shared_broker", "rocketmq_cluster", "spark", "target"}
# Modules whose tests start (and kill -9) broker processes or example scripts of their own.
_INTEGRATION_MODULES = {"test_broker", "test_broker_parity", "test_durability", "test_examples", "test_retry",
                        "test_transactions", "test_rocketmq_tls", "test_v2_clients", "test_hardening",
                        "test_auth", "test_tls", "test_v2_java_client", "test_fuzz", "test_rocketmq_slave",
                        "test_delete_topic_crash"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        module = item.module.__name__ if getattr(item, "module", None) else ""
        if (fixtures & _INTEGRATION_FIXTURES or item.get_closest_marker("spark")
                or module in _INTEGRATION_MODULES):
            item.add_marker(pytest.mark.integration)
