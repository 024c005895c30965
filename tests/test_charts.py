"""Notebook tables and charts (pyspark_pymq.charts) against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark_pymq import Admin, Message, Producer, PullConsumer
from pyspark_pymq.charts import message_table, plot_lag, plot_retry_dlq, retry_dlq_counts
from pyspark_pymq.errors import PymqError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def fail_some(endpoint: str, topic: str, group: str, retry: int, dead: int) -> None:
    """Consume ``topic`` as ``group``: ``retry`` messages go to %RETRY%, ``dead`` to the DLQ."""
    consumer = PullConsumer(endpoint, group)
    msgs = []
    for mq in consumer.queues(topic):
        result = consumer.pull(mq, 0, 1000)
        msgs.extend(result.messages)
        consumer.commit(mq, result.next_begin_offset)
    for m in msgs[:retry]:
        consumer.send_back(m, reason="try later")
    for m in msgs[retry : retry + dead]:
        consumer.send_back(m, delay_level=-1, reason="poison")
    admin = Admin(endpoint)
    deadline = time.monotonic() + 15  # retries reach %RETRY% after their delay level
    while time.monotonic() < deadline:
        counts = retry_dlq_counts(admin, [group])
        if counts["retried"][0] == retry:
            return
        time.sleep(0.1)
    raise AssertionError(f"retries did not arrive: {counts}")


@pytest.fixture
def traffic(shared_broker: Any) -> dict[str, str]:
    """A topic with 40 messages on 2 queues; one group failed on some, one is behind."""
    ep = shared_broker.endpoint
    topic, group, behind = unique("ct"), unique("cg"), unique("lagging")
    Admin(ep).create_topic(topic, queues=2)
    with Producer(ep) as producer:
        for i in range(40):
            producer.send(Message(topic, json.dumps({"i": i}), keys=[f"k-{i}"]))
    fail_some(ep, topic, group, retry=5, dead=2)
    lagging = PullConsumer(ep, behind)
    for n, mq in enumerate(lagging.queues(topic)):
        lagging.commit(mq, 5 * (n + 1))  # 15 and 10 behind
    return {"endpoint": ep, "topic": topic, "group": group, "behind": behind}


def test_retry_dlq_counts_per_group(traffic: dict[str, str]) -> None:
    counts = retry_dlq_counts(traffic["endpoint"], [traffic["group"], traffic["behind"]])
    assert list(counts.columns) == ["group", "retried", "retry_pending", "dead_letters"]
    rows = counts.set_index("group").to_dict("index")
    assert rows[traffic["group"]] == {"retried": 5, "retry_pending": 5, "dead_letters": 2}
    assert rows[traffic["behind"]] == {"retried": 0, "retry_pending": 0, "dead_letters": 0}
    # without groups: every group with a %RETRY% or %DLQ% topic
    assert traffic["group"] in set(retry_dlq_counts(Admin(traffic["endpoint"]))["group"])
    assert traffic["behind"] not in set(retry_dlq_counts(Admin(traffic["endpoint"]))["group"])


def test_plot_lag_draws_each_queue_and_writes_a_png(traffic: dict[str, str], tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    path = tmp_path / "charts" / "lag.png"  # the directory does not exist yet
    ax = plot_lag(Admin(traffic["endpoint"]), traffic["behind"], path=path)
    assert f"{traffic['behind']!r}: 25 message(s) behind" in ax.get_title()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{traffic['topic']} [0]", f"{traffic['topic']} [1]"]
    texts = [t.get_text().strip() for t in ax.texts]  # the bar labels
    assert "lag 15" in texts and "lag 10" in texts
    lag_bars = ax.containers[1]
    assert [p.get_width() for p in lag_bars] == [15, 10]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["consumed", "lag"]
    assert ax.get_xlabel() == "queue offset (messages)"
    width, height = png_size(path)
    assert width > 600 and height > 200
    assert plt.get_fignums() == []  # outside IPython: a standalone figure, nothing left in pyplot


def test_plot_retry_dlq_on_given_axes(traffic: dict[str, str], tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    out = plot_retry_dlq(traffic["endpoint"], [traffic["group"], traffic["behind"]], ax=ax,
                         path=tmp_path / "retry.svg")
    assert out is ax
    retried, dead = ax.containers
    assert [b.get_height() for b in retried] == [5, 0]
    assert [b.get_height() for b in dead] == [2, 0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [traffic["group"], traffic["behind"]]
    assert ax.get_title() == "Retries and dead letters per consumer group"
    assert (tmp_path / "retry.svg").read_text().lstrip().startswith("<?xml")


def test_charts_of_nothing_say_so(endpoint: str) -> None:
    ax = plot_retry_dlq(endpoint)
    assert "no retries and no dead letters" in [t.get_text() for t in ax.texts]
    assert retry_dlq_counts(endpoint).empty
    with pytest.raises(TypeError, match="Admin or an endpoint"):
        plot_lag(42, "g")  # type: ignore[arg-type]
    with pytest.raises(PymqError, match="consumer group 'nobody' is unknown"):
        plot_lag(endpoint, "nobody")  # a misspelt group: not a chart of no lag
    Admin(endpoint).update_group("nobody", retry_max_times=3)
    ax = plot_lag(endpoint, "nobody")
    assert "no progress on the broker for group 'nobody'" in [t.get_text() for t in ax.texts]


def test_message_table_by_key_and_msg_id(traffic: dict[str, str]) -> None:
    admin = Admin(traffic["endpoint"])
    found = message_table(admin.query_message(traffic["topic"], "k-7"))
    assert len(found) == 1
    row = found.iloc[0]
    assert row["body"] == '{"i": 7}' and row["keys"] == "k-7" and row["topic"] == traffic["topic"]
    assert str(row["store_time"].tz) == "UTC"
    again = message_table([admin.view_message(row["msg_id"], topic=traffic["topic"])])
    assert again.iloc[0]["queue_offset"] == row["queue_offset"]
    assert message_table([]).empty and "msg_id" in message_table([]).columns


def test_importing_pymq_or_charts_does_not_import_matplotlib() -> None:
    code = ("import sys, pyspark_pymq; assert 'pyspark_pymq.charts' not in sys.modules; "
            "import pyspark_pymq.charts; assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
