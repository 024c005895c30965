"""A broker's runtime info, as ``mqadmin brokerStatus`` shows it (GET_BROKER_RUNTIME_INFO), through
Admin.broker_info: RocketMQ's keys and formats for the offsets and the disk."""

from __future__ import annotations

import os
import re

import pytest
from pymq_broker.store.disk_space import human_readable_byte_count
from pyspark_pymq import Message

from .conftest import BROKER, Target, send_and_read

pytestmark = pytest.mark.integration


def test_runtime_info_keys_and_disk_figures(target: Target, scratch_topic: str) -> None:
    send_and_read(target, Message(scratch_topic, b"x"))
    info = target.admin().broker_info(BROKER)
    assert info["broker_name"] == BROKER
    assert int(info["commitLogMaxOffset"]) > int(info["commitLogMinOffset"]) >= 0
    # the disk holding the store, used: df's Use%, rounded up, as a fraction
    for key in ("commitLogDiskRatio", "consumeQueueDiskRatio"):
        assert re.fullmatch(r"0\.\d{1,2}|1\.0", info[key]), (key, info[key])
        assert 0 < float(info[key]) <= 1
    assert re.fullmatch(r"Total : \d+\.\d [KMGTPE]iB, Free : (\d+\.\d [KMGTPE]iB|\d+ B)\.",
                        info["commitLogDirCapacity"]), info["commitLogDirCapacity"]
    # per commit-log path too; Total is the file system's whole size (File.getTotalSpace())
    (path,) = [k.removeprefix("commitLogDiskRatio_") for k in info if k.startswith("commitLogDiskRatio_")]
    assert info[f"commitLogDiskRatio_{path}"] == info["commitLogDiskRatio"]
    st = os.statvfs(path)
    total = human_readable_byte_count(st.f_blocks * st.f_frsize)
    assert info["commitLogDirCapacity"].startswith(f"Total : {total},"), (total, info["commitLogDirCapacity"])
    with pytest.raises(ValueError, match="'no-such-broker'"):
        target.admin().broker_info("no-such-broker")
