"""The working tree's packages, which tests and benchmarks import instead of an installed copy."""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = [str(ROOT / "connector"), str(ROOT / "broker_stub"), str(ROOT / "proto")]


def compile_bytecode() -> None:
    """Write the tree's bytecode, as pip does for an installed copy.

    Every broker process, Spark Python worker and source runner that tests and benchmarks start
    imports these packages afresh. With ``PYTHONDONTWRITEBYTECODE`` set (as some shells and CI
    runners do) no process writes a cache, so each compiled every module again: +0.45 s of CPU
    per broker start, +0.3 s per Spark worker, a quarter of the wall clock of broker-heavy test
    modules. Files already compiled are only checked (their source's mtime and size).
    """
    for d in SOURCE_DIRS:
        compileall.compile_dir(d, quiet=1)


def use_source_tree() -> None:
    """This tree's packages first on ``sys.path`` and on the PYTHONPATH of the processes Spark
    starts, and Spark's Python this interpreter: for the scripts tests run as drivers of their own
    (tests/jobs/), as the test session itself (conftest.py)."""
    for d in reversed(SOURCE_DIRS):
        if d not in sys.path:
            sys.path.insert(0, d)
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in SOURCE_DIRS]
    os.environ["PYTHONPATH"] = os.pathsep.join(SOURCE_DIRS + others)
    os.environ["PYSPARK_PYTHON"] = sys.executable
