"""pymq-admin against a real broker process."""

from __future__ import annotations

import pytest
from pyspark_pymq import Message, Producer, PullConsumer
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
