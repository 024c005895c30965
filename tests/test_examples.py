"""Every example runs, and says what it should: scripts as subprocesses, the notebook headless.

``examples/delta_pipeline.py`` is run (and killed) by test_delta_pipeline.py.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_example(name: str, *args: str, timeout: float = 300, cwd: Path = ROOT,
                env: dict[str, str] | None = None) -> str:
    """Run ``examples/<name>`` with this interpreter; its stdout (fails on a non-zero exit).

    ``env``: variables to set on top of this process's environment.
    """
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, **env} if env else None,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_quickstart_client() -> None:
    out = run_example("quickstart_client.py")
    assert re.match(r"sent [0-9A-Fa-f]{32} to orders@broker-a#\d offset 0\n", out)
    pulled = re.findall(r"^orders@broker-a#\d (?:FOUND|NO_NEW_MSG) (\d+) messages$", out, re.M)
    assert len(pulled) == 4 and sum(map(int, pulled)) == 100
    lags = re.findall(r"^quickstart orders +broker-a +\d +\d+ +\d+ +(\d+)$", out, re.M)
    assert lags == ["0"] * 4


def test_retry_dead_letters_walkthrough() -> None:
    out = run_example("retry_dead_letters.py")
    lines = out.splitlines()
    failures = [line for line in lines if line.startswith("  order-3 from") and "FAILED" in line]
    assert [f.split(":")[0] + f.split("->")[1] for f in failures] == [
        "  order-3 from orders (reconsume_times=0) %RETRY%billing",
        "  order-3 from %RETRY%billing (reconsume_times=1) %RETRY%billing",
        "  order-3 from %RETRY%billing (reconsume_times=2) %DLQ%billing",
    ]
    for i in (1, 2, 4):
        assert f"  order-{i} from orders (reconsume_times=0): charged" in lines
    assert re.search(r"^billing\s+2\s+0\s+1$", out, re.M)  # retried, pending, dead letters
    assert "re-sent 1 dead letter(s) to 'orders'" in out
    after_resend = lines[lines.index("   re-sent 1 dead letter(s) to 'orders'"):]
    assert "  order-3 from orders (reconsume_times=0): charged" in after_resend
    assert lines[-1] == "4. purged: %DLQ%billing has 0 message(s); lag 0"


@pytest.mark.spark
@pytest.mark.parametrize("api_mode", ["classic", "connect"])
def test_quickstart_streams_and_resumes_from_its_checkpoint(api_mode: str) -> None:
    """Also under Spark Connect, as the README says (a local Connect server of its own)."""
    out = run_example("quickstart.py", env={"SPARK_API_MODE": api_mode})
    assert ("(Spark Connect)" in out) is (api_mode == "connect")
    assert "sent 100 orders to 'orders'" in out
    assert "first run: read 100 orders" in out
    assert re.findall(r"^\|\s+(\d)\|\s+25\|\s+24\|$", out, re.M) == ["0", "1", "2", "3"]
    assert "second run (same checkpoint): read 50 new orders" in out


@pytest.mark.spark
def test_demo_pipeline_runs_to_its_summary(tmp_path: Path) -> None:
    """``make demo``: broker, poison orders, the stream with retries, Delta, summary, charts."""
    out = run_example("demo_pipeline.py", "--out", str(tmp_path / "out"))
    summary = out[out.index("\nsummary\n"):]
    table = tmp_path / "out" / "orders_delta"
    assert f"  delivered      1980 (in the Delta table {table}, 0 duplicates; 200 after a retry)" \
        in summary
    assert "  retried        260 (sent back to %RETRY%billing)" in summary  # 200 flaky + 20 x 3
    assert "  dead-lettered  20 (in %DLQ%billing, each after 3 retries)" in summary
    assert "  lag            0" in summary
    assert re.search(r"^ +orders +4 +order \d*7: invalid amount -1.0$", summary, re.M)
    assert (table / "_delta_log").is_dir()
    for chart in ("lag.png", "retry_dlq.png"):
        path = tmp_path / "out" / chart
        assert f"  {path}" in summary
        width, height = png_size(path.read_bytes())
        assert width > 600 and height > 250


def test_explore_topics_notebook_runs_headless(monkeypatch: pytest.MonkeyPatch) -> None:
    """Executed with nbclient: no error, its tables and its two charts are in the outputs."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.delenv("PYMQ_ENDPOINT", raising=False)  # the notebook's own embedded broker
    nb = nbformat.read(EXAMPLES / "explore_topics.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    tables = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(tables) >= 7 and all("<table" in t for t in tables)
    html = "\n".join(tables)
    for expected in ("%DLQ%billing", "%RETRY%billing", "SCHEDULE_TOPIC_XXXX", "analytics",
                     "order-7", "invalid amount"):
        assert expected in html
    images = [base64.b64decode(o.data["image/png"]) for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # lag per queue, retries and dead letters per group
    for image in images:
        width, height = png_size(image)
        assert width > 500 and height > 200
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "re-sent 8 dead letter(s); %DLQ%billing now holds 0" in text


def test_explore_topics_notebook_only_reads_your_broker(
    monkeypatch: pytest.MonkeyPatch, shared_broker: Any
) -> None:
    """With PYMQ_ENDPOINT (the user's broker) the notebook re-sent and purged its dead letters, and
    died on a key it did not find: now it only reads there."""
    import nbformat
    from nbclient import NotebookClient
    from pyspark_pymq import Admin, Message, Producer, PullConsumer

    ep = shared_broker.endpoint
    topic, group = f"nb-{uuid.uuid4().hex[:8]}", f"nb-g-{uuid.uuid4().hex[:8]}"
    Admin(ep).create_topic(topic, queues=1)
    with Producer(ep) as producer:
        producer.send(Message(topic, b"poison", keys=["k-1"]))
    consumer = PullConsumer(ep, group)
    [mq] = consumer.queues(topic)
    consumer.send_back(consumer.pull(mq, 0).messages[0], delay_level=-1, reason="bad")  # to %DLQ%
    consumer.commit(mq, 1)
    for name, value in (("PYMQ_ENDPOINT", ep), ("PYMQ_TOPIC", topic), ("PYMQ_GROUP", group),
                        ("PYMQ_LAGGING_GROUP", group), ("PYMQ_KEY", "no-such-key")):
        monkeypatch.setenv(name, value)
    nb = nbformat.read(EXAMPLES / "explore_topics.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"no message of {topic!r} has the key 'no-such-key'" in text
    assert f"skipped on {ep}" in text
    assert [m.body for m in Admin(ep).dead_letter_messages(group)] == [b"poison"]
    assert Admin(ep).topics(topic=topic)["messages"].tolist() == [1]  # nothing sent


@pytest.mark.spark
def test_rocketmq_pipeline_against_the_real_cluster(rocketmq_cluster: Any, tmp_path: Path) -> None:
    """examples/rocketmq_pipeline.py: Apache RocketMQ's own %RETRY% and %DLQ% do the retries."""
    topic = f"orders-{tmp_path.name[-8:]}".replace("_", "-")
    rocketmq_cluster.create_topic(topic, 2)
    out = run_example("rocketmq_pipeline.py", "--namesrv-addr", rocketmq_cluster.namesrv_addr,
                      "--topic", topic, "--orders", "200", "--out", str(tmp_path / "out"))
    assert "sent 200 orders" in out and "(4 poison)" in out
    assert re.search(r"^  delivered      196 ", out, re.M)
    assert re.search(r"^  dead-lettered  4 \(in %DLQ%billing-\w+, after 2 retries each\)$", out, re.M)


def test_demo_pipeline_without_matplotlib_skips_its_charts_saying_how_to_get_them(tmp_path: Path) -> None:
    """After a plain ``pip install .`` the demo ran to its end and died in plot_lag with an ImportError
    before its summary; now the summary comes first and the charts are skipped with one line."""
    script = (
        "import sys; sys.modules['matplotlib'] = None\n"  # import matplotlib: ImportError
        "import demo_pipeline\n"
        f"demo_pipeline.write_charts(None, __import__('pathlib').Path({str(tmp_path)!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=EXAMPLES)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout == ("charts:\n  skipped: matplotlib is not installed (pip install '.[charts]' "
                           "in pymq's clone ('pyspark-pymq[charts]' once it is on PyPI))\n")
    assert not list(tmp_path.iterdir())
    demo = (EXAMPLES / "demo_pipeline.py").read_text()
    assert demo.index('print("summary")') < demo.index("write_charts(admin, out)")
