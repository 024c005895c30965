"""pymq-admin against a real broker process."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Admin, Message, Producer, PullConsumer
from pyspark_pymq.admin_cli import main, render_table


def test_admin_cli_round_trip(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-e", endpoint, "create-topic", "cli", "--queues", "2"]) == 0
    assert main(["-e", endpoint, "send", "cli", "--count", "2500", "--size", "50"]) == 0
    out = capsys.readouterr()
    assert "2500 message(s) sent" in out.out and "2500/2500" in out.err  # progress bar
    assert main(["-e", endpoint, "topic-stats", "cli"]) == 0
    stats = capsys.readouterr().out
    assert "queue_id" in stats and "broker-a" in stats
    consumer = PullConsumer(endpoint, "gcli")
    for mq in consumer.queues("cli"):
        consumer.commit(mq, 100)
    assert main(["-e", endpoint, "progress", "gcli"]) == 0
    assert "total lag: 2300" in capsys.readouterr().out
    m = consumer.pull(consumer.queues("cli")[0], 0, 1).messages[0]
    consumer.send_back(m, delay_level=-1, reason="broken")
    assert main(["-e", endpoint, "dead-letters", "gcli"]) == 0
    assert "broken" in capsys.readouterr().out
    assert main(["-e", endpoint, "resend-dead-letters", "gcli"]) == 0
    assert "1 dead letter(s) of gcli re-sent" in capsys.readouterr().out
    # letters asked for by id that are not there: the script is told (exit 1)
    assert main(["-e", endpoint, "resend-dead-letters", "gcli", "--msg-id", "NOPE"]) == 1
    assert "no dead letter of gcli was re-sent for msg id(s) NOPE" in capsys.readouterr().err
    for flag in ("--size", "--count", "--batch"):
        with pytest.raises(SystemExit) as bad:  # argparse's own error: exit 2, nothing sent
            main(["-e", endpoint, "send", "cli", flag, "0"])
        assert bad.value.code == 2 and "is below 1" in capsys.readouterr().err
    assert main(["-e", endpoint, "topic-stats", "missing"]) == 1
    assert "'missing' does not exist" in capsys.readouterr().err
    r = Producer(endpoint).send(Message("cli", b"look at me", keys=["lk"]))
    assert main(["-e", endpoint, "view-message", r.offset_msg_id]) == 0
    assert "look at me" in capsys.readouterr().out
    assert main(["-e", endpoint, "query-message", "cli", "lk"]) == 0
    assert "look at me" in capsys.readouterr().out
    assert main(["-e", endpoint, "broker"]) == 0
    info = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert info["transactionsPending"] == "0" and int(info["commitLogMaxOffset"]) > 0


def test_render_table_aligns_columns() -> None:
    text = render_table([{"a": 1, "bb": "x"}, {"a": 100, "bb": "yyyy"}], ["a", "bb"])
    lines = text.splitlines()
    assert lines[0].index("bb") == lines[2].index("x") == lines[3].index("yyyy")
    assert render_table([], ["a"]) == "(none)"


def test_admin_cli_reads_an_apache_rocketmq_cluster(
    rocketmq_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-n`` as mqadmin takes it: the same tables from a real 2-broker cluster, its changes refused."""
    ns = rocketmq_cluster.namesrv_addr
    topic = unique("cli-rmq")
    rocketmq_cluster.create_topic(topic, 1)
    assert main(["-n", ns, "send", topic, "--count", "30", "--size", "20", "--batch", "10"]) == 0
    assert "30 message(s) sent" in capsys.readouterr().out
    assert main(["-n", ns, "topic-stats", topic]) == 0
    stats = capsys.readouterr().out
    assert "broker-a" in stats and "broker-b" in stats
    assert main(["-n", ns, "tail", topic, "--last", "2"]) == 0
    assert capsys.readouterr().out.count(f"{topic}@") == 4  # the last two of each broker's queue
    assert main(["-n", ns, "broker"]) == 0
    out = capsys.readouterr().out
    assert "[broker-a]" in out and "[broker-b]" in out and out.count("brokerVersionDesc") == 2
    assert main(["-n", ns, "broker", "--broker-name", "broker-b"]) == 0
    info = {k: v for k, _, v in (line.partition(" ") for line in capsys.readouterr().out.splitlines())}
    assert info["broker_name"].strip() == "broker-b" and info["brokerVersionDesc"].strip() == "V5_3_3"
    assert main(["-n", ns, "create-topic", "nope"]) == 1
    assert "changes an Apache RocketMQ cluster" in capsys.readouterr().err
    assert main(["-n", ns, "user", "create", "alice", "--password", "S3cr3t!"]) == 1
    err = capsys.readouterr().err
    assert "create_user('alice')" in err and "S3cr3t!" not in err  # a password is never echoed
    assert main(["-n", ns, "-e", "127.0.0.1:1", "topics"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["-n", ns, "--tls-ca-file", "ca.pem", "topics"]) == 2
    assert "not --namesrv-addr" in capsys.readouterr().err
    # a group's settings as the broker keeps them (mqadmin updateSubGroup), not the defaults
    group = unique("cli-group")
    rocketmq_cluster.mqadmin("updateSubGroup", "-c", rocketmq_cluster.cluster_name, "-g", group, "-r", "5")
    assert Admin(namesrv_addr=ns).group_config(group).retry_max_times == 5
    assert repr(Admin(namesrv_addr=ns)) == f"RocketMQAdmin(namesrv_addr={ns!r})"


def test_a_flag_wins_over_the_other_targets_environment_variable(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PYMQ_NAMESRV_ADDR", "127.0.0.1:1")
    assert main(["-e", endpoint, "topics"]) == 0  # -e: PYMQ_NAMESRV_ADDR (for Spark jobs, say) left alone
    monkeypatch.setenv("PYMQ_ENDPOINT", endpoint)
    assert main(["topics"]) == 2
    assert "PYMQ_ENDPOINT and PYMQ_NAMESRV_ADDR are both set" in capsys.readouterr().err
    monkeypatch.delenv("PYMQ_NAMESRV_ADDR")
    assert main(["topics"]) == 0
