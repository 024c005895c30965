"""Tables and charts for notebooks: lag per queue, retries and dead letters per group.

One call each, drawn with matplotlib (:data:`INSTALL_HINT`), which is imported only when a
chart is drawn::

    from pyspark_pymq import Admin
    from pyspark_pymq.charts import message_table, plot_lag, plot_retry_dlq, retry_dlq_counts

    admin = Admin("127.0.0.1:8081")
    retry_dlq_counts(admin)                        # DataFrame: one row per group
    message_table(admin.query_message("orders", "order-7"))  # DataFrame: messages by key
    plot_lag(admin, "billing")                     # in a notebook: shown inline
    plot_retry_dlq(admin, path="out/retry_dlq.png")  # from a script: written to a file

In IPython or Jupyter a chart is drawn on a new pyplot figure, so it shows
inline. Anywhere else it is drawn on a standalone figure with the Agg canvas:
no window, no display needed, nothing kept in pyplot's figure registry; pass
``path`` to write it to a file (PNG, SVG or PDF, by the suffix). Pass ``ax`` to
draw on axes of your own (a dashboard of several charts).

Every function takes an :class:`~pyspark_pymq.client.admin.Admin` or an
endpoint ``"host:port"``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pymq_proto.topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, get_dlq_topic, get_retry_topic

from .client.admin import Admin

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.ticker import Locator

    from .client.message import MessageExt

__all__ = ["INSTALL_HINT", "message_table", "plot_lag", "plot_retry_dlq", "retry_dlq_counts"]

#: (width, height) in inches of a chart drawn on a new figure.
FIGSIZE = (8.0, 4.5)
_CONSUMED_COLOR = "#9ecae1"
_LAG_COLOR = "#e6550d"
_RETRY_COLOR = "#fdae6b"
_DLQ_COLOR = "#de2d26"


INSTALL_HINT = "pip install '.[charts]' in pymq's clone ('pyspark-pymq[charts]' once it is on PyPI)"
"""How to get matplotlib for the charts."""


def _admin(admin_or_endpoint: Admin | str) -> Admin:
    if isinstance(admin_or_endpoint, Admin):
        return admin_or_endpoint
    if isinstance(admin_or_endpoint, str):
        return Admin(admin_or_endpoint)
    raise TypeError(
        f"expected an Admin or an endpoint 'host:port', got {type(admin_or_endpoint).__name__}"
    )


def _in_ipython() -> bool:
    """Whether this runs in IPython or Jupyter (then pyplot shows figures inline)."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return get_ipython is not None and get_ipython() is not None


def _new_axes(ax: Axes | None, height: float) -> Axes:
    if ax is not None:
        return ax
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(f"pyspark_pymq.charts draws with matplotlib: {INSTALL_HINT}") from err
    size = (FIGSIZE[0], height)
    if _in_ipython():
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=size, layout="constrained")
    else:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
    return fig.add_subplot()


def _save(ax: Axes, path: str | Path | None) -> None:
    if path is None:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    from matplotlib.figure import Figure

    fig = ax.figure
    if not isinstance(fig, Figure):  # a SubFigure: save its root figure
        fig = fig.figure
    fig.savefig(out, dpi=120)


def _integer_ticks() -> Locator:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _legend_outside(ax: Axes) -> None:
    """The legend right of the axes, where it never hides a bar or a label."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


# -- tables -------------------------------------------------------------------------------


def retry_dlq_counts(
    admin_or_endpoint: Admin | str, groups: Iterable[str] | None = None
) -> pd.DataFrame:
    """One row per consumer group: how many messages were retried and dead-lettered.

    Columns:

    - ``group``;
    - ``retried``: messages stored in ``%RETRY%<group>`` (each retry of a
      message counts once; messages still waiting for their delay level are
      not there yet);
    - ``retry_pending``: of those, how many the group has not consumed yet, by
      the progress on the broker (a Spark query commits a batch's progress when
      it plans the next one, so this may count the last batch);
    - ``dead_letters``: messages in ``%DLQ%<group>``.

    Without ``groups``: every group that has a %RETRY% or %DLQ% topic, by name.
    """
    import pandas as pd

    admin = _admin(admin_or_endpoint)
    topics = admin.topics(include_system=True)
    messages = dict(zip(topics["topic"], topics["messages"], strict=True))
    if groups is None:
        found = set()
        for name in messages:
            for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
                if name.startswith(prefix):
                    found.add(name[len(prefix):])
        groups = sorted(found)
    rows = []
    for group in groups:
        retry = get_retry_topic(group)
        pending = 0
        if retry in messages:
            pending = int(admin.group_progress(group, retry)["lag"].sum())
        rows.append(
            {
                "group": group,
                "retried": int(messages.get(retry, 0)),
                "retry_pending": pending,
                "dead_letters": int(messages.get(get_dlq_topic(group), 0)),
            }
        )
    return pd.DataFrame(rows, columns=["group", "retried", "retry_pending", "dead_letters"])


def message_table(messages: Iterable[MessageExt], body_chars: int = 200) -> pd.DataFrame:
    """Messages as a DataFrame, one row each: for ``Admin.query_message``,
    ``Admin.view_message`` or ``Admin.dead_letter_messages`` in a notebook.

    Bodies are decoded as UTF-8 (invalid bytes replaced) and cut at
    ``body_chars``; timestamps are pandas Timestamps (UTC).
    """
    import pandas as pd

    rows = [
        {
            "topic": m.topic,
            "queue_id": m.queue_id,
            "queue_offset": m.queue_offset,
            "msg_id": m.msg_id,
            "offset_msg_id": m.offset_msg_id,
            "tags": m.tags,
            "keys": " ".join(m.keys),
            "reconsume_times": m.reconsume_times,
            "retry_topic": m.retry_topic,
            "born_time": pd.Timestamp(m.born_timestamp, unit="ms", tz="UTC"),
            "store_time": pd.Timestamp(m.store_timestamp, unit="ms", tz="UTC"),
            "body": m.body.decode("utf-8", "replace")[:body_chars],
            "properties": m.user_properties,
        }
        for m in messages
    ]
    return pd.DataFrame(
        rows,
        columns=["topic", "queue_id", "queue_offset", "msg_id", "offset_msg_id", "tags", "keys",
                 "reconsume_times", "retry_topic", "born_time", "store_time", "body", "properties"],
    )


# -- charts -------------------------------------------------------------------------------


def plot_lag(
    admin_or_endpoint: Admin | str,
    group: str,
    *,
    topic: str | None = None,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Axes:
    """Lag per queue of consumer group ``group``, as horizontal bars.

    Each bar is one MessageQueue the group has progress on (its
    ``%RETRY%<group>`` queue included), split into what the group has
    consumed and what it has not yet (the lag, labelled at the bar's end).
    ``topic`` keeps one topic's queues only. A group the broker knows without progress draws a
    note; one it does not know fails (:meth:`Admin.group_progress`'s SUBSCRIPTION_GROUP_NOT_EXIST).

    Args:
        admin_or_endpoint: an ``Admin`` or ``"host:port"``.
        group: the consumer group.
        topic: only this topic's queues (default: all of the group's).
        ax: draw on these axes instead of a new figure.
        path: also write the figure to this file (PNG, SVG, PDF...).

    Returns:
        The axes drawn on.
    """
    progress = _admin(admin_or_endpoint).group_progress(group, topic)
    progress = progress.sort_values(["topic", "broker_name", "queue_id"], ignore_index=True)
    ax = _new_axes(ax, height=max(2.5, 1.2 + 0.45 * len(progress)))
    total = int(progress["lag"].sum())
    ax.set_title(f"Lag per queue of consumer group {group!r}: {total:,} message(s) behind")
    if progress.empty:
        ax.text(0.5, 0.5, f"no progress on the broker for group {group!r}",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        _save(ax, path)
        return ax
    several_brokers = progress["broker_name"].nunique() > 1
    labels = [
        f"{r.topic} [{r.broker_name}:{r.queue_id}]" if several_brokers else f"{r.topic} [{r.queue_id}]"
        for r in progress.itertuples()
    ]
    consumed = (progress["broker_offset"] - progress["lag"]).clip(lower=0)
    y = list(range(len(progress)))
    ax.barh(y, consumed, color=_CONSUMED_COLOR, label="consumed")
    bars = ax.barh(y, progress["lag"], left=consumed, color=_LAG_COLOR, label="lag")
    ax.bar_label(bars, labels=[f" lag {int(v):,}" for v in progress["lag"]], padding=2)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("queue offset (messages)")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_xlim(0, max(1.0, float(progress["broker_offset"].max())) * 1.18)
    _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    _save(ax, path)
    return ax


def plot_retry_dlq(
    admin_or_endpoint: Admin | str,
    groups: Iterable[str] | None = None,
    *,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Axes:
    """Retried and dead-lettered messages per consumer group, as grouped bars.

    The counts are :func:`retry_dlq_counts`: messages stored in
    ``%RETRY%<group>`` and in ``%DLQ%<group>``.

    Args:
        admin_or_endpoint: an ``Admin`` or ``"host:port"``.
        groups: the groups to show (default: every group with a %RETRY% or
            %DLQ% topic).
        ax: draw on these axes instead of a new figure.
        path: also write the figure to this file (PNG, SVG, PDF...).

    Returns:
        The axes drawn on.
    """
    counts = retry_dlq_counts(admin_or_endpoint, groups)
    ax = _new_axes(ax, height=FIGSIZE[1])
    ax.set_title("Retries and dead letters per consumer group")
    if counts.empty:
        ax.text(0.5, 0.5, "no retries and no dead letters", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        _save(ax, path)
        return ax
    x = list(range(len(counts)))
    width = 0.38
    retried = ax.bar([i - width / 2 for i in x], counts["retried"], width, color=_RETRY_COLOR,
                     label="retried\n(in %RETRY%<group>)")
    dead = ax.bar([i + width / 2 for i in x], counts["dead_letters"], width, color=_DLQ_COLOR,
                  label="dead letters\n(in %DLQ%<group>)")
    ax.bar_label(retried, labels=[f"{int(v):,}" for v in counts["retried"]], padding=2)
    ax.bar_label(dead, labels=[f"{int(v):,}" for v in counts["dead_letters"]], padding=2)
    ax.set_xticks(x, list(counts["group"]))
    ax.set_xlim(-1, len(counts))
    ax.set_xlabel("consumer group")
    ax.set_ylabel("messages")
    ax.yaxis.set_major_locator(_integer_ticks())
    top = max(int(counts["retried"].max()), int(counts["dead_letters"].max()), 1)
    ax.set_ylim(0, top * 1.2)
    _legend_outside(ax)
    ax.grid(axis="y", alpha=0.3)
    _save(ax, path)
    return ax
