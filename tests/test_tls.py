"""TLS and mutual TLS on the embedded broker, with certificates made at test time by openssl;
and the Spark source, sink and views over TLS with credentials."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from pyspark_pymq.admin_cli import main as admin_main
from pyspark_pymq.client import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.errors import AccessDeniedError, TlsRequiredError
from tls_certs import Certificates, make_certificates

ROOT, ROOT_PW = "root", "root-secret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_broker(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    args = ["--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key]
    with BrokerProcess(tmp_path_factory.mktemp("tls-broker"), args) as proc:
        yield proc


def test_tls_broker_serves_tls_clients(tls_broker: BrokerProcess, certs: Certificates) -> None:
    ep = tls_broker.endpoint
    admin = Admin(ep, tls_ca_file=certs.ca)
    admin.create_topic("tls-t", 1)
    with Producer(ep, tls_ca_file=certs.ca) as producer:
        producer.send(Message("tls-t", b"encrypted"))
    consumer = PullConsumer(ep, "tls-g", tls_ca_file=certs.ca)
    mq = MessageQueue("tls-t", "broker-a", 0)
    assert [m.body for m in consumer.pull(mq, 0).messages] == [b"encrypted"]
    consumer.commit(mq, 1)
    assert consumer.committed(mq) == 1


def test_a_tls_broker_on_every_interface_serves_sends_and_pulls(
    certs: Certificates, tmp_path: Path
) -> None:
    """Bound to 0.0.0.0 (the README's deployment with TLS), the broker's routes name 0.0.0.0: a
    client sent its sends and pulls there, and the certificate's host check failed every one."""
    args = ["--host", "0.0.0.0", "--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key]
    with BrokerProcess(tmp_path / "any", args) as proc:
        ep = "127.0.0.1:" + proc.endpoint.rpartition(":")[2]
        assert proc.endpoint.startswith("0.0.0.0:")
        Admin(ep, tls_ca_file=certs.ca).create_topic("any-t", 1)
        with Producer(ep, tls_ca_file=certs.ca) as producer:
            producer.send(Message("any-t", b"reached"))
        consumer = PullConsumer(ep, "any-g", tls_ca_file=certs.ca)
        pulled = consumer.pull(MessageQueue("any-t", "broker-a", 0), 0).messages
        assert [m.body for m in pulled] == [b"reached"]


def test_plaintext_client_fails_fast_saying_to_enable_tls(tls_broker: BrokerProcess) -> None:
    ep = tls_broker.endpoint
    for call in (lambda: Admin(ep).topics(),
                 lambda: Producer(ep).send(Message("tls-t", b"plain")),
                 lambda: PullConsumer(ep, "g").pull(MessageQueue("tls-t", "broker-a", 0), 0)):
        started = time.monotonic()
        with pytest.raises(TlsRequiredError, match="serves TLS and this client connects in") as info:
            call()
        assert time.monotonic() - started < 3.0
        assert "enable TLS on the client" in str(info.value) and "tlsCaFile" in str(info.value)
        assert not info.value.retriable
    assert PullConsumer(ep, "tls-g", tls_ca_file=None, tls=False).backend.config.tls is None


def test_untrusted_certificate_and_tls_to_a_plaintext_broker(
    tls_broker: BrokerProcess, certs: Certificates, broker: BrokerProcess
) -> None:
    with pytest.raises(TlsRequiredError, match=r"CERTIFICATE_VERIFY_FAILED.*tls_ca_file / tlsCaFile holds"):
        Admin(tls_broker.endpoint, tls_ca_file=certs.other_ca).topics()
    with pytest.raises(TlsRequiredError, match="Check that the broker serves TLS"):
        Admin(broker.endpoint, tls_ca_file=certs.ca).topics()
    with pytest.raises(ValueError, match=r"tls_ca_file='/nonexistent\.pem' is not a readable file"):
        Admin(tls_broker.endpoint, tls_ca_file="/nonexistent.pem")
    with pytest.raises(ValueError, match="cert_file is set without key_file"):
        Producer(tls_broker.endpoint, tls_ca_file=certs.ca, tls_cert_file=certs.client_cert)


def test_mutual_tls(certs: Certificates, tmp_path: Path) -> None:
    args = ["--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key,
            "--tls-client-ca-file", certs.ca]
    with BrokerProcess(tmp_path / "mtls", args) as proc:
        ep = proc.endpoint
        with pytest.raises(TlsRequiredError, match=r"may require a client certificate \(mutual TLS"):
            Admin(ep, tls_ca_file=certs.ca).topics()
        with pytest.raises(TlsRequiredError, match="enable TLS"):
            Admin(ep).topics()
        admin = Admin(ep, tls_ca_file=certs.ca, tls_cert_file=certs.client_cert,
                      tls_key_file=certs.client_key)
        admin.create_topic("mtls-t", 1)
        assert "mtls-t" in admin.topic_names()
        assert admin_main(["-e", ep, "--tls-ca-file", certs.ca, "--tls-cert-file", certs.client_cert,
                           "--tls-key-file", certs.client_key, "topics"]) == 0
        # a stopped query's progress, written over mutual TLS; only the topics asked for
        import json
        from types import SimpleNamespace

        from pyspark_pymq.spark.progress import commit_group_progress

        admin.create_topic("mtls-other", 1)
        query = SimpleNamespace(lastProgress={"sources": [
            {"endOffset": json.dumps({"mtls-t": {"broker-a:0": 0}})},
            {"endOffset": json.dumps({"mtls-other": {"broker-a:0": 0}})},
        ]})
        tls = {"tls_ca_file": certs.ca, "tls_cert_file": certs.client_cert, "tls_key_file": certs.client_key}
        assert commit_group_progress(query, ep, "mtls-g", topics=["mtls-t"], **tls) == 1
        assert commit_group_progress(query, ep, "mtls-g", topics="mtls-t", **tls) == 1  # not its letters


def test_broker_tls_settings_are_checked(certs: Certificates, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="tls_cert_file and tls_key_file go together"):
        BrokerProcess(tmp_path / "a", ["--tls-cert-file", certs.server_cert], startup_timeout=20).start()
    with pytest.raises(RuntimeError, match=r"--tls-key-file '/nonexistent\.key' cannot be read"):
        BrokerProcess(tmp_path / "b", ["--tls-cert-file", certs.server_cert, "--tls-key-file",
                                       "/nonexistent.key"], startup_timeout=20).start()


def test_spark_over_tls_with_credentials(spark: Any, certs: Certificates, tmp_path: Path) -> None:
    """Source, sink and views against a TLS broker with authentication and authorization, the
    secret key in no plan, log or error message."""
    args = ["--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key,
            "--authentication-enabled", "--authorization-enabled",
            "--init-authentication-user", f"{ROOT}:{ROOT_PW}"]
    with BrokerProcess(tmp_path / "spark-tls", args) as proc:
        ep = proc.endpoint
        admin = Admin(ep, access_key=ROOT, secret_key=ROOT_PW, tls_ca_file=certs.ca)
        admin.create_topic("spark-tls", 2)
        admin.create_user("sparky", "sparky-very-secret")
        admin.create_acl("User:sparky", ["Topic:spark-tls", "Group:spark-g"], ["Pub", "Sub", "Get"])

        def options(secret: str) -> dict[str, str]:
            return {"endpoint": ep, "topic": "spark-tls", "accessKey": "sparky", "secretKey": secret,
                    "tls": "true", "tlsCaFile": certs.ca}

        df = spark.createDataFrame([(f"row-{i}",) for i in range(50)], "body string")
        df.write.format("pymq").options(**options("sparky-very-secret")).mode("append").save()
        read = spark.read.format("pymq").options(**options("sparky-very-secret")).option(
            "consumerGroup", "spark-g").load()
        assert sorted(r.body.decode() for r in read.collect()) == sorted(f"row-{i}" for i in range(50))
        plan = read._jdf.queryExecution().toString()
        assert "sparky-very-secret" not in plan

        stream = (spark.readStream.format("pymq").options(**options("sparky-very-secret"))
                  .option("consumerGroup", "spark-g").option("startingOffsets", "earliest").load())
        query = (stream.writeStream.format("memory").queryName("tls_stream")
                 .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert spark.sql("select count(*) from tls_stream").collect()[0][0] == 50
        assert "sparky-very-secret" not in str(query.lastProgress)

        # the secret from a file (secretKeyFile): in no option, so in no plan of a Connect server
        (tmp_path / "secret").write_text("sparky-very-secret\n")
        from_file = {k: v for k, v in options("").items() if k != "secretKey"}
        read = spark.read.format("pymq").options(**from_file, secretKeyFile=str(tmp_path / "secret")).option(
            "consumerGroup", "spark-g").load()
        assert read.count() == 50

        queues = spark.read.format("pymq").options(**options("sparky-very-secret")).option(
            "view", "queues").load().collect()
        assert {r["queue_id"] for r in queues} == {0, 1}

        bad = spark.read.format("pymq").options(**options("not-the-secret-xyz")).option(
            "consumerGroup", "spark-g").load()
        with pytest.raises(Exception, match="signature of user 'sparky' is wrong") as info:
            bad.collect()
        assert "not-the-secret-xyz" not in str(info.value)
        denied = spark.read.format("pymq").options(**options("sparky-very-secret")).option(
            "topic", "other-topic").load()
        with pytest.raises(Exception, match=r"user 'sparky' may not .* on Topic:other-topic"):
            denied.collect()
        # no consumerGroup: the pulls carry pymq's reader group, which sparky's ACL does not name
        no_group = spark.read.format("pymq").options(**options("sparky-very-secret")).load()
        with pytest.raises(Exception, match=r"may not Sub on Group:PYMQ_SPARK_READER.*\. Set option "
                                            r"consumerGroup to a group this user may Sub on"):
            no_group.collect()
        plaintext = {k: v for k, v in options("sparky-very-secret").items() if not k.startswith("tls")}
        with pytest.raises(Exception, match="enable TLS"):
            spark.read.format("pymq").options(**plaintext).load().collect()
    assert AccessDeniedError.code == "FORBIDDEN"
