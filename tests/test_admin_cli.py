"""pymq-admin against a real broker process."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.admin_cli import main, parser, render_table
from pyspark_pymq.errors import GROUP_NOT_EXIST, IllegalArgumentError, PymqError
from pyspark_pymq.spark.option_registry import DEFAULT_READER_GROUP


def test_create_topic_again_keeps_what_it_is_not_given(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provisioning script run twice switched the de-duplication window off, reset the queues to 4
    and the permission to read-write; cutting queues that hold messages hid them in silence."""
    admin, topic = Admin(endpoint), unique("again")
    assert main(["-e", endpoint, "create-topic", topic, "--queues", "2", "--dedup-window-ms", "600000"]) == 0
    assert main(["-e", endpoint, "create-topic", topic, "--queues", "2"]) == 0
    assert "de-duplication window 600000 ms" in capsys.readouterr().out
    admin.create_topic(topic, perm=4)  # read only
    kept = admin.create_topic(topic, message_type="FIFO")
    assert (kept.read_queue_nums, kept.write_queue_nums, kept.perm, kept.dedup_window_ms) == (2, 2, 4, 600000)
    new = admin.create_topic(unique("fresh"))
    assert (new.read_queue_nums, new.perm, new.dedup_window_ms, new.message_type) == (4, 6, 0, "NORMAL")

    full = unique("shrink")
    admin.create_topic(full, 4)
    with Producer(endpoint) as producer:
        for _ in range(4):  # round robin: one on each queue
            producer.send(Message(full, b"m"))
    unread = r"queue\(s\) \[2, 3\] hold messages no consumer group has read.*allow_shrink=True"
    with pytest.raises(IllegalArgumentError, match=unread):
        admin.create_topic(full, 2)
    assert main(["-e", endpoint, "create-topic", full, "--queues", "2"]) == 1
    err = capsys.readouterr().err
    assert "--allow-shrink" in err and "pymq-admin create-topic --write-queues 2" in err, err
    assert admin.topic_config(full).read_queue_nums == 4
    # RocketMQ's scale-in: write queues cut first, then read queues once every group has read them
    assert main(["-e", endpoint, "create-topic", full, "--write-queues", "2"]) == 0
    assert "4 read / 2 write queues" in capsys.readouterr().out
    assert admin.topic_config(full).write_queue_nums == 2
    late, done = PullConsumer(endpoint, unique("late")), PullConsumer(endpoint, unique("done"))
    late.commit(MessageQueue(full, "broker-a", 3), 1)
    for mq in done.queues(full):
        done.commit(mq, 1)
    with pytest.raises(IllegalArgumentError, match=rf"queue\(s\) \[2\] hold messages consumer group\(s\) "
                                                  rf"\['{late.group}'\] have not read"):
        admin.create_topic(full, read_queues=2, write_queues=2)
    late.commit(MessageQueue(full, "broker-a", 2), 1)
    assert admin.create_topic(full, read_queues=2, write_queues=2).read_queue_nums == 2
    admin.create_topic(full, 4)
    with Producer(endpoint) as producer:  # one more on each queue, which nobody reads
        for _ in range(4):
            producer.send(Message(full, b"n"))
    with pytest.raises(IllegalArgumentError, match="have not read"):
        admin.create_topic(full, read_queues=2, write_queues=2)
    assert admin.create_topic(full, 3, read_queues=2, write_queues=2, allow_shrink=True).read_queue_nums == 2
    assert admin.create_topic(full, 4).read_queue_nums == 4  # growing needs nothing
    empty = unique("empty")
    admin.create_topic(empty, 4)
    assert admin.create_topic(empty, 1).read_queue_nums == 1  # nothing to hide


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


def test_admin_cli_tail_on_rocketmq_pulls_past_one_pull(
    rocketmq_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A RocketMQ broker answers a pull with 32 messages at most: tail --last 50 pulls until the end."""
    ns = rocketmq_cluster.namesrv_addr
    topic = unique("cli-tail")
    rocketmq_cluster.create_topic(topic, 1, brokers=["broker-a"])
    Producer(namesrv_addr=ns).send_batch([Message(topic, f"m{i:03d}") for i in range(100)])
    deadline = time.monotonic() + 30
    while True:
        assert main(["-n", ns, "tail", topic, "--last", "50"]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if f"{topic}@" in line]
        # the consume queue follows the commit log: until all 100 are in it, the last 50 end earlier
        if (lines and "body=m099" in lines[-1]) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert [line.split()[1] for line in lines] == [f"@{i}" for i in range(50, 100)]
    assert "body=m099" in lines[-1]


def test_admin_cli_progress_on_rocketmq_of_an_unknown_group_exits_1(
    rocketmq_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """As mqadmin consumerProgress fails: not "(none)", which reads as a group without lag."""
    ns = rocketmq_cluster.namesrv_addr
    group = unique("no-such-group")
    assert main(["-n", ns, "progress", group]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"group {group!r} is unknown to every broker registered with the name servers at {ns}" in (
        captured.err)


def test_connection_flags_after_the_command_as_mqadmin_takes_them(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = unique("cli-after")
    Admin(endpoint).create_topic(topic, queues=1)
    assert main(["create-topic", topic, "-e", endpoint, "--queues", "2"]) == 0  # mqadmin updateTopic -n ...
    assert main(["topic-stats", topic, "--endpoint", endpoint]) == 0
    assert capsys.readouterr().out.count(topic) == 2 + 1  # the two queues' rows, and create-topic's line
    assert main(["user", "list", "-e", endpoint]) == 0  # a command's command too
    # one given on both sides: the one after the command, nearest to it, counts
    assert main(["-e", "127.0.0.1:1", "topics", "-e", endpoint]) == 0 and topic in capsys.readouterr().out
    assert main(["topics"]) == 2 and "give --endpoint" in capsys.readouterr().err
    assert parser().parse_args(["tail", "t", "-n", "h:9876"]).namesrv_addr == "h:9876"


def test_a_reader_that_goes_away_ends_the_output_quietly(endpoint: str) -> None:
    topic = unique("cli-pipe")
    Admin(endpoint).create_topic(topic, queues=1)
    Producer(endpoint).send_batch([Message(topic, b"x" * 100) for _ in range(3000)])
    # `pymq-admin tail t --last 3000 | head -1`: ~500 KB for a pipe of 64 KB, closed after one line
    cli = subprocess.Popen([sys.executable, "-m", "pyspark_pymq.admin_cli", "-e", endpoint, "tail", topic,
                            "--last", "3000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cli.stdout is not None and cli.stderr is not None
    first = cli.stdout.readline().decode()
    cli.stdout.close()
    assert cli.wait(timeout=60) == 0
    assert cli.stderr.read() == b""  # no BrokenPipeError traceback
    assert first.startswith(f"{topic}@broker-a#0 @0 tags= keys= body=xxx")


def test_a_short_output_to_a_reader_gone_ends_quietly_too(endpoint: str) -> None:
    # a few lines stay in stdout's buffer (block-buffered on a pipe) until the interpreter's exit,
    # where a reader gone (`| true`) made it print "Exception ignored ... BrokenPipeError", exit 120
    import os

    topic = unique("cli-short")
    Admin(endpoint).create_topic(topic, queues=1)
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        cli = subprocess.run([sys.executable, "-m", "pyspark_pymq.admin_cli", "-e", endpoint, "topic-stats",
                              topic], stdout=write, stderr=subprocess.PIPE, env=env, timeout=60)
    finally:
        os.close(write)
    assert (cli.returncode, cli.stderr) == (0, b"")


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


def test_view_message_of_a_msg_id_without_topic_says_to_add_topic(
    shared_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A msgId (UNIQ_KEY) and an offsetMsgId are both 32 hex digits: without --topic the id is read
    as an offsetMsgId, whose commit log offset holds nothing; the error says to add --topic."""
    endpoint, topic = shared_broker.endpoint, unique("view")
    admin = Admin(endpoint)
    admin.create_topic(topic, 1)
    r = Producer(endpoint).send(Message(topic, b"found by msgId"))
    # a msgId's last 8 bytes read as an offset: past the log's end, or negative (refused as such)
    for msg_id in (r.msg_id, "7F000001000022B87755AABB00112233", "7F000001000022B8F755AABB00112233"):
        assert main(["-e", endpoint, "view-message", msg_id]) == 1
        err = capsys.readouterr().err
        assert "[QUERY_NOT_FOUND] no message at that offset" in err, err
        assert f"if {msg_id} is a msgId (UNIQ_KEY" in err and "add --topic TOPIC" in err
        with pytest.raises(PymqError, match=r"give its topic: view_message\(.*, topic=\.\.\.\)") as caught:
            admin.view_message(msg_id)
        assert caught.value.code == "QUERY_NOT_FOUND"
    assert main(["-e", endpoint, "view-message", r.msg_id, "--topic", topic]) == 0
    assert "found by msgId" in capsys.readouterr().out
    # a msgId not in the topic given: the broker's own answer, no advice to add --topic
    assert main(["-e", endpoint, "view-message", "7F000001000022B87755AABB00112233", "--topic", topic]) == 1
    assert "--topic" not in capsys.readouterr().err


def _subparsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                yield name, sp
                for sub_name, sub in _subparsers(sp):
                    yield f"{name} {sub_name}", sub


def test_every_argument_has_a_help_text(capsys: pytest.CaptureFixture[str]) -> None:
    missing = [f"{name}: {a.dest}" for name, sp in _subparsers(parser()) for a in sp._actions
               if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not missing
    with pytest.raises(SystemExit):
        main(["tail", "--help"])
    assert "how many of EACH queue" in " ".join(capsys.readouterr().out.split())


def test_progress_of_an_unknown_group_exits_1(shared_broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint, group = shared_broker.endpoint, unique("nosuchgroup")
    assert main(["-e", endpoint, "progress", group]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and f"consumer group {group!r} is unknown to the broker" in captured.err
    assert "`pymq-admin groups`) lists the groups" in captured.err
    assert group not in set(Admin(endpoint).groups()["group"])  # asking did not create it
    with pytest.raises(PymqError, match=f"consumer group {group!r} is unknown to the broker") as info:
        Admin(endpoint).group_progress(group)  # the Admin too: not an empty table ("no lag")
    assert info.value.code == GROUP_NOT_EXIST
    # a group the broker knows (its settings), without progress: (none), exit 0
    Admin(endpoint).update_group(group, retry_max_times=3)
    assert main(["-e", endpoint, "progress", group]) == 0
    assert capsys.readouterr().out.strip() == "(none)"


_INTERNAL = {"PYMQ_SPARK_READER", "PYMQ_ADMIN_TAIL", "PYMQ_DLQ_BROWSER", "PYMQ_DLQ_RESEND"}


def test_groups_leave_out_pymqs_internal_groups(
    shared_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """pymq's own groups (batch reads, tail, dead-letter browsing and re-sending) are not the user's."""
    endpoint, topic, group = shared_broker.endpoint, unique("internal"), unique("user-group")
    admin = Admin(endpoint)
    admin.create_topic(topic, 1)
    Producer(endpoint).send(Message(topic, b"x"))
    consumer = PullConsumer(endpoint, group)
    mq = consumer.queues(topic)[0]
    consumer.send_back(consumer.pull(mq, 0, 1).messages[0], delay_level=-1)  # a dead letter
    PullConsumer(endpoint, DEFAULT_READER_GROUP).pull(mq, 0, 1)  # as a batch read
    assert main(["-e", endpoint, "tail", topic]) == 0
    assert len(admin.dead_letters(group)) == 1
    assert admin.resend_dead_letters(group) == 1
    names = set(admin.groups()["group"])
    assert group in names and not names & _INTERNAL, names
    assert set(admin.groups(include_internal=True)["group"]) >= _INTERNAL
    capsys.readouterr()
    assert main(["-e", endpoint, "groups"]) == 0
    listed = capsys.readouterr().out
    assert group in listed and "PYMQ_ADMIN_TAIL" not in listed
    assert main(["-e", endpoint, "groups", "--all"]) == 0
    assert "PYMQ_ADMIN_TAIL" in capsys.readouterr().out
    from pyspark_pymq.client.admin import INTERNAL_GROUPS

    assert set(INTERNAL_GROUPS) == _INTERNAL
    # they are still read by name (PYMQ_DLQ_RESEND keeps its progress on %DLQ%<group>)
    assert main(["-e", endpoint, "progress", "PYMQ_DLQ_RESEND"]) == 0
    assert f"%DLQ%{group}" in capsys.readouterr().out


def test_a_group_without_dead_letters_has_nothing_to_read(
    shared_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint, group = shared_broker.endpoint, unique("analytics")
    admin = Admin(endpoint)
    # a misspelt group: not "no dead letters", "purged" or "0 re-sent"
    for call in (admin.dead_letters, admin.dead_letter_messages, admin.resend_dead_letters,
                 admin.purge_dead_letters):
        with pytest.raises(PymqError, match=f"consumer group {group!r} is unknown") as info:
            call(group)
        assert info.value.code == GROUP_NOT_EXIST
    for command in ("dead-letters", "resend-dead-letters", "purge-dead-letters"):
        assert main(["-e", endpoint, command, group]) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and f"consumer group {group!r} is unknown" in captured.err, command
    admin.update_group(group, retry_max_times=3)  # known, without dead letters
    assert admin.dead_letter_messages(group) == [] and admin.dead_letters(group).empty
    assert main(["-e", endpoint, "resend-dead-letters", group]) == 0
    captured = capsys.readouterr()  # the progress bar never drawn leaves no empty line
    assert captured.out == f"0 dead letter(s) of {group} re-sent to their original topics\n"
    assert captured.err == ""
    assert main(["-e", endpoint, "dead-letters", group]) == 0
    assert capsys.readouterr().out.strip() == "(none)"
    for command, topic, what in (("tail", f"%DLQ%{group}", "dead letters"),
                                 ("topic-stats", f"%DLQ%{group}", "dead letters"),
                                 ("tail", f"%RETRY%{group}", "retries")):
        assert main(["-e", endpoint, command, topic]) == 1
        err = capsys.readouterr().err
        assert f"group {group!r} has no {what} yet" in err and "nothing to read" in err, err
        assert "create" not in err.replace(f"creates {topic}", "")
    assert f"%DLQ%{group}" not in admin.topic_names(include_system=True)  # nothing was created


def test_an_access_key_without_its_secret_says_where_the_secret_goes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PYMQ_SECRET_KEY", raising=False)
    monkeypatch.delenv("PYMQ_ACCESS_KEY", raising=False)
    assert main(["-e", "127.0.0.1:1", "--access-key", "alice", "topics"]) == 2
    err = capsys.readouterr().err
    assert "set PYMQ_SECRET_KEY (or --secret-key" in err and "alice" not in err
    # the client classes name which one is missing or empty, never its value
    with pytest.raises(ValueError, match="secret_key is missing"):
        Admin("127.0.0.1:1", access_key="alice")
    with pytest.raises(ValueError, match="access_key is empty"):
        Producer("127.0.0.1:1", access_key="", secret_key="s3cret")
    with pytest.raises(ValueError, match="secret_key is empty") as info:
        PullConsumer("127.0.0.1:1", "g", access_key="alice", secret_key="")
    assert "alice" not in str(info.value)


def test_bodies_and_properties_are_printed_escaped_one_line_each(
    shared_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A producer's bytes reach the operator's terminal: an ESC sequence recoloured it (or worse) and a
    newline in a body broke tail's one line per message. Printable UTF-8 is shown as it is."""
    endpoint, topic, group = shared_broker.endpoint, unique("escape"), unique("escape-group")
    Admin(endpoint).create_topic(topic, 1)
    hostile = b"\x1b[31mred\x1b[0m\nfake line\r\x07\xff\xfe end"
    with Producer(endpoint) as producer:
        r = producer.send(Message(topic, hostile, tags="t", keys=["k1"], properties={"note": "a\nb\x1b[2J"}))
        producer.send(Message(topic, "héllo wörld ✓".encode(), keys=["k2"]))
    consumer = PullConsumer(endpoint, group)
    first = consumer.pull(consumer.queues(topic)[0], 0, 1).messages[0]
    consumer.send_back(first, delay_level=-1, reason="bad\x1b[1m\nreason")

    def check(out: str) -> None:
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out, repr(out)
        assert r"\x1b[31mred\x1b[0m\nfake line\r\x07\xff\xfe end" in out, out

    assert main(["-e", endpoint, "tail", topic]) == 0
    out = capsys.readouterr().out
    check(out)
    assert len(out.splitlines()) == 2 and "body=héllo wörld ✓" in out, out  # one line per message
    assert main(["-e", endpoint, "query-message", topic, "k1"]) == 0
    out = capsys.readouterr().out
    check(out)
    assert len(out.splitlines()) == 3, out  # header, rule, the message
    assert main(["-e", endpoint, "view-message", r.offset_msg_id]) == 0
    out = capsys.readouterr().out
    check(out)
    assert r"a\nb\x1b[2J" in out and "fake line\n" not in out
    assert main(["-e", endpoint, "dead-letters", group]) == 0
    out = capsys.readouterr().out
    check(out)
    assert r"bad\x1b[1m\nreason" in out and len(out.splitlines()) == 3, out


def test_a_long_body_is_cut_between_characters() -> None:
    """Only the first 40 bytes are shown: a character cut there is left out, not shown as broken bytes."""
    table = render_table([{"body": "é".encode() * 30}], ["body"])
    assert table.splitlines()[2] == "é" * 20 + "..."
    assert render_table([{"body": b"\x00\x1b\x7f\xc3"}], ["body"]).splitlines()[2] == r"\x00\x1b\x7f\xc3"


def test_errors_name_the_clis_flags_not_the_python_keywords(
    shared_broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`reset-offset ... --offset 0` answered "offset=0 needs queue_id= ... give timestamp=": the Python
    API's keywords, which a pymq-admin user never typed. The API keeps its wording for Python callers."""
    endpoint, topic, group = shared_broker.endpoint, unique("flags"), unique("flags-group")
    admin = Admin(endpoint)
    admin.create_topic(topic, 2)
    admin.update_group(group, retry_max_times=3)

    def error_of(*argv: str) -> str:
        assert main(["-e", endpoint, *argv]) == 1
        return capsys.readouterr().err

    err = error_of("reset-offset", group, topic, "--offset", "0")
    assert "--offset 0 needs --queue-id" in err and "give --timestamp" in err, err
    assert "=" not in err and "queue_id" not in err, err
    with pytest.raises(ValueError, match=r"offset=0 needs queue_id= .* give timestamp="):
        admin.reset_offset(group, topic, offset=0)  # the Python API's own words
    err = error_of("reset-offset", group, topic, "--offset", "5", "--queue-id", "0")
    assert "--offset 5 is outside" in err, err  # the broker's answer, worded with the flag too
    # values no broker takes: argparse's error naming the flag (exit 2), nothing asked of the broker
    for argv, expected in ((["reset-offset", group, topic, "--offset", "-1", "--queue-id", "0"],
                            "argument --offset: -1 is below 0"),
                           (["reset-offset", group, topic, "--offset", "0", "--queue-id", "-1"],
                            "argument --queue-id: -1 is below 0"),
                           (["reset-offset", group, topic, "--timestamp", "1900-01-01T00:00:00+00:00"],
                            "is before 1970"),
                           (["reset-offset", group, topic, "--timestamp", "1795962000"],  # seconds
                            "argument --timestamp: 1795962000: that is 1970-01-21 18:52:42 UTC in "
                            "milliseconds since the epoch, as pymq reads it; if it is seconds give "
                            "1795962000000"),
                           (["create-topic", topic, "--queues", "0"], "argument --queues: 0 is below 1"),
                           (["update-group", group, "--retry-max-times", "-1"],
                            "argument --retry-max-times: -1 is below 0"),
                           (["query-message", topic, "k", "--max", "-1"], "argument --max: -1 is below 1"),
                           (["tail", topic, "--last", "0"], "argument --last: 0 is below 1")):
        with pytest.raises(SystemExit) as bad:
            main(["-e", endpoint, *argv])
        assert bad.value.code == 2 and expected in capsys.readouterr().err, argv
    # the connection's settings, checked by the client classes
    assert main(["-n", "bad", "topics"]) == 1
    assert capsys.readouterr().err.startswith("pymq-admin: --namesrv-addr 'bad' is not")
    assert main(["-e", "127.0.0.1:1", "--tls-cert-file", "/nonexistent.pem", "topics"]) == 1
    assert "--tls-cert-file is set without --tls-key-file" in capsys.readouterr().err
    assert main(["-e", "127.0.0.1:1", "--tls-ca-file", "/nonexistent.pem", "topics"]) == 1
    assert "--tls-ca-file '/nonexistent.pem' is not a readable file" in capsys.readouterr().err


def test_cli_wording_of_the_python_apis_messages() -> None:
    """What no check of the CLI catches first still reaches its user in its flags."""
    from pyspark_pymq.admin_cli import _cli_wording

    api = "offset=0 needs queue_id= (the queue it is for); to move every queue, give timestamp="
    assert _cli_wording(api, "reset-offset") == ("--offset 0 needs --queue-id (the queue it is for); to move "
                                                 "every queue, give --timestamp")
    assert _cli_wording("queue_id must be an int >= 0 (a queue of 'orders'), got -1", "reset-offset") \
        == "--queue-id must be an int >= 0 (a queue of 'orders'), got -1"
    assert _cli_wording("[ILLEGAL_ARGUMENT] max_num 20000 is out of range 1..10000", "query-message") \
        == "[ILLEGAL_ARGUMENT] --max 20000 is out of range 1..10000"
    assert _cli_wording("retry_queue_nums must be an int >= 1, got 0", "update-group") \
        == "--retry-queue-nums must be an int >= 1, got 0"
    # another command's words, and words that are not a keyword, stay as they are
    assert _cli_wording("offset=0 needs queue_id=", "tail") == "offset=0 needs queue_id="
    other = "the queue offset 5 is past the end"
    assert _cli_wording(other, "reset-offset") == other
