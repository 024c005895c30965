"""The one place that applies ``failOnDataLoss``.

Messages the query should read can be gone: expired by the broker's retention
(``fileReservedTime``), a topic deleted while the query runs, or deleted and
created again (its offsets went backwards, or its topic id changed). The driver
(planning a batch) and the executors (pulling a range) both find such gaps; all
of them call :func:`report_data_loss`, so the policy and the wording live here once.

With ``failOnDataLoss=true`` (the default) the query stops with a
:class:`DataLossError` that says what was lost and which option changes the
behaviour. With ``false`` the source logs a warning and skips ahead.
"""

from __future__ import annotations

import logging

from ..errors import OffsetIllegalError

__all__ = ["DataLossError", "report_data_loss"]

logger = logging.getLogger("pyspark_pymq.spark")


class DataLossError(OffsetIllegalError):
    """Messages the query was to read are no longer on the broker."""


def report_data_loss(fail_on_data_loss: bool, what: str, skip: str) -> None:
    """Fail (``failOnDataLoss=true``) or log and go on.

    Args:
        fail_on_data_loss: the option's value.
        what: what was lost, e.g. "queue orders@broker-a#0: offsets [0, 120) are
            no longer on the broker (its min offset is 120)".
        skip: what the source does instead when allowed, e.g. "skip to offset 120".
    """
    if fail_on_data_loss:
        raise DataLossError(
            f"pymq source lost data: {what}. This happens when messages expire "
            "(the broker's fileReservedTime) or a topic is deleted or recreated before "
            "the query read them. The query stops because failOnDataLoss=true; set "
            f"failOnDataLoss=false to {skip} and continue without the lost messages"
        )
    logger.warning("pymq source lost data: %s; failOnDataLoss=false, so %s", what, skip)
