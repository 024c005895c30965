"""The broker's config files (topics, offsets, groups, delay progress...): a full disk never cuts
one, a damaged one is read from its backup, and without a good backup the broker does not start
with an empty table."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from pymq_broker import EmbeddedBroker
from pymq_broker.common import config_manager
from pymq_broker.common.config_manager import ConfigFileDamagedError, ConfigManager
from pymq_broker.manager.consumer_offset_manager import ConsumerOffsetManager
from pymq_broker.manager.subscription_group_manager import SubscriptionGroupManager
from pymq_broker.manager.topic_config_manager import TopicConfigManager
from pyspark_pymq import Admin
from pyspark_pymq.errors import PymqError


class Doc(ConfigManager):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.table: dict[str, int] = {}

    def encode(self) -> dict[str, Any]:
        return {"table": self.table}

    def decode(self, data: dict[str, Any]) -> None:
        self.table = {k: int(v) for k, v in data["table"].items()}


class FullDisk:
    """``os.write`` of the config module, taking ``room`` bytes of a file under ``root`` and then
    raising ENOSPC, as a disk filling up does."""

    def __init__(self, root: Path, room: int) -> None:
        self.root, self.room, self.real = str(root), room, os.write

    def __call__(self, fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(self.root):
            return self.real(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.real(fd, bytes(data)[: self.room])
        self.room -= n
        return n


def _texts(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(root.iterdir())}


def _saved(path: Path, *tables: dict[str, int]) -> Doc:
    """A document saved once per table (the last one in the file, the one before in its backup)."""
    doc = Doc(path)
    for table in tables:
        doc.table = table
        doc.persist()
    return doc


def test_a_write_that_runs_out_of_space_leaves_the_file_and_its_backup_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _saved(tmp_path / "doc.json", {"a": 1}, {"a": 2})
    before = _texts(tmp_path)  # doc.json {"a": 2}, doc.json.bak {"a": 1}
    doc.table = {f"k{i}": i for i in range(100)}
    with monkeypatch.context() as patch:
        patch.setattr(config_manager.os, "write", FullDisk(tmp_path, 50))
        with pytest.raises(OSError, match="No space left on device") as full:
            doc.persist()
    assert full.value.filename == str(tmp_path / "doc.json")
    assert _texts(tmp_path) == before  # nothing cut, no .tmp left, the backup not replaced
    assert doc.dirty  # written again by the next periodic write
    with monkeypatch.context() as patch:  # the same through persist_if_dirty (a shutdown's write)
        patch.setattr(config_manager.os, "write", FullDisk(tmp_path, 50))
        with pytest.raises(OSError, match="No space left on device"):
            doc.persist_if_dirty()
    assert _texts(tmp_path) == before and doc.dirty
    doc.persist_if_dirty()  # room again
    assert json.loads((tmp_path / "doc.json").read_text())["table"] == doc.table
    again = Doc(tmp_path / "doc.json")
    again.load()
    assert again.table == doc.table


def test_an_offset_commit_whose_write_failed_is_written_at_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    offsets.commit_offset("g", "t", 0, 10)
    offsets.persist_if_dirty()
    offsets.commit_offset("g", "t", 0, 20)
    with monkeypatch.context() as patch:
        patch.setattr(config_manager.os, "write", FullDisk(tmp_path, 0))
        with pytest.raises(OSError):
            offsets.persist_if_dirty()
    offsets.persist_if_dirty()  # it was marked clean before the write and never written after
    restarted = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    restarted.load()
    assert restarted.query_offset("g", "t", 0) == 20


@pytest.mark.parametrize("damage", ["cut", "null", "list", "wrong value"])
def test_a_damaged_file_is_read_from_its_backup_and_said_so(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    _saved(tmp_path / "doc.json", {"a": 1}, {"a": 1, "b": 2})
    text = (tmp_path / "doc.json").read_text()
    damaged = {"cut": text[: len(text) // 2], "null": "null", "list": "[]",
               "wrong value": '{"table": {"a": "x"}}'}[damage]
    (tmp_path / "doc.json").write_text(damaged)
    again = Doc(tmp_path / "doc.json")
    with caplog.at_level(logging.WARNING, logger=config_manager.__name__):
        again.load()
    assert again.table == {"a": 1}  # the version before the last write
    assert f"config file {tmp_path / 'doc.json'} (" in caplog.text and "trying its backup" in caplog.text
    assert f"loaded from its backup {tmp_path / 'doc.json.bak'}" in caplog.text


def test_a_damaged_files_first_entries_do_not_stay_when_its_backup_is_read(tmp_path: Path) -> None:
    """decode fills the group table entry by entry: the damaged file's good first entries stayed
    next to the backup's (review helper-90)."""
    path = tmp_path / "subscriptionGroup.json"
    groups = SubscriptionGroupManager(path)
    groups.find_subscription_group_config("old")
    groups.persist()
    groups.find_subscription_group_config("newer")
    groups.persist()
    doc = json.loads(path.read_text())
    doc["subscriptionGroupTable"]["zz-bad"] = {"groupName": "zz-bad", "noSuchField": 1}
    path.write_text(json.dumps(doc))
    again = SubscriptionGroupManager(path)
    again.load()
    assert "old" in again.subscription_group_table and "newer" not in again.subscription_group_table


def test_an_empty_file_and_a_damaged_backup_are_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text("")
    (tmp_path / "doc.json.bak").write_text("{")
    with pytest.raises(ConfigFileDamagedError, match=rf"^config file {path} is empty and {path}.bak "
                                                     r"\(JSONDecodeError: .*\) cannot be loaded: the broker"):
        Doc(path).load()


def test_a_failed_rename_leaves_no_temporary_file_and_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _saved(tmp_path / "doc.json", {"a": 1})
    real = os.replace

    def refused(src: Any, dst: Any) -> None:
        if str(src).endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(src, dst)

    doc.table = {"a": 2}
    with monkeypatch.context() as patch:
        patch.setattr(config_manager.os, "replace", refused)
        with pytest.raises(OSError) as failed:
            doc.persist()
    assert failed.value.filename == str(tmp_path / "doc.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json.bak"]
    again = Doc(tmp_path / "doc.json")
    again.load()  # the last document saved, from its backup
    assert again.table == {"a": 1}
    doc.persist_if_dirty()
    again.load()
    assert again.table == {"a": 2}


def test_a_damaged_file_without_a_good_backup_stops_the_load(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('{"table": {"a": 1')
    with pytest.raises(ConfigFileDamagedError, match=rf"config file {path} \(JSONDecodeError: .*\) cannot be "
                                                     rf"loaded and there is no backup {path}.bak"):
        Doc(path).load()
    (tmp_path / "doc.json.bak").write_text("[]")
    with pytest.raises(ConfigFileDamagedError, match=r"and .*doc.json.bak \(TypeError: a JSON list, "
                                                     r"not an object\) cannot be loaded.*move it away"):
        Doc(path).load()


def test_an_empty_file_is_read_from_its_backup_or_as_no_table(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text("")
    doc = Doc(path)
    doc.load()
    assert doc.table == {}
    (tmp_path / "doc.json.bak").write_text('{"table": {"a": 3}}')
    doc.load()
    assert doc.table == {"a": 3}


def test_a_broker_with_a_damaged_topic_file_and_no_backup_does_not_start(tmp_path: Path) -> None:
    data = tmp_path / "b"
    with EmbeddedBroker(data) as broker:
        Admin(broker.endpoint).create_topic("orders", queues=2)
    topics = next(data.rglob("topics.json"))
    text = topics.read_text()
    topics.write_text(text[: len(text) // 2])
    topics.with_name("topics.json.bak").unlink(missing_ok=True)
    proc = BrokerProcess(data, startup_timeout=20)
    try:
        with pytest.raises(RuntimeError, match="broker did not start") as refused:
            proc.start()
    finally:
        proc.stop()  # a broker that did start (the damage missed) must not outlive the test
    output = str(refused.value)
    assert f"pymq-broker: config file {topics} (JSONDecodeError" in output
    assert "the broker does not start without what it holds" in output and "Traceback" not in output
    assert topics.read_text() == text[: len(text) // 2]  # the evidence is kept
    topics.write_text(text)  # restored: the topic is back
    with EmbeddedBroker(data) as broker:
        assert "orders" in Admin(broker.endpoint).topic_names()


def test_a_topic_the_broker_could_not_save_is_an_error_and_the_saved_ones_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "b"
    with EmbeddedBroker(data) as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic("kept", queues=1)
        with monkeypatch.context() as patch:
            patch.setattr(config_manager.os, "write", FullDisk(data, 100))
            with pytest.raises(PymqError, match=r"create_topic: the broker could not save .*topics.json: "
                                                r"No space left on device.*free space") as full:
                admin.create_topic("unsaved", queues=1)
            assert full.value.code == "SYSTEM_ERROR"
        admin.create_topic("after", queues=1)  # room again: this write holds them all
    manager = TopicConfigManager(next(data.rglob("topics.json")))
    manager.load()
    assert {"kept", "unsaved", "after"} <= set(manager.topic_config_table)


def test_offsets_are_written_a_group_a_line_and_reloaded_after_each_change(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    for group in ("a", "b"):
        for queue_id in (0, 2, 10):
            offsets.commit_offset(group, "t", queue_id, 100 + queue_id)
    offsets.persist()
    offsets.commit_offset("b", "t", 2, 7)  # a line written before, changed since
    offsets.commit_offset("c", "u", 1, 1)
    offsets.persist()
    text = (tmp_path / "consumerOffset.json").read_text()
    assert '  "t@b": {"0": 100, "2": 7, "10": 110}' in [
        line.rstrip(",") for line in text.splitlines()]  # queue ids in order
    restarted = ConsumerOffsetManager(tmp_path / "consumerOffset.json")
    restarted.load()
    assert restarted.offset_table == offsets.offset_table
    assert restarted.query_offset("b", "t", 2) == 7 and restarted.query_offset("c", "u", 1) == 1
