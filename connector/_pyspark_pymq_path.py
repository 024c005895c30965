"""Let Spark's Python processes import pip's pyspark, not the same code from ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the ``PYTHONPATH`` of every Python
process it starts. With a pip-installed pyspark, ``SPARK_HOME`` is that very package, so the
zip holds the code that sits, already byte-compiled, next to it in site-packages. Python
cannot cache bytecode for a zip: each process compiles the pyspark modules it imports again
(~0.5 s of CPU), and ``importlib.invalidate_caches()``, which Spark's workers call, re-reads
the zip's 1,400-entry directory. Most of Spark's Python processes are forked from its worker
daemon and pay this once, but every streaming query starts its Python source runner afresh: a
notebook user waits ~0.5 s for it on each ``readStream ... start()`` (``benchmarks/
bench_query_start.py``: a 10,000-row ``availableNow`` query 1.70 -> 1.13 s).

The ``pyspark_pymq-pyspark-path.pth`` file installed with pymq (written by ``_pyspark_pymq_build``) calls
:func:`prefer_installed_pyspark` at interpreter start, only when ``sys.path`` holds a
``pyspark.zip``. It moves the zip to the end of ``sys.path`` when, and only when, the zip is
the ``python/lib/pyspark.zip`` of a pyspark package that is itself importable from a
``sys.path`` entry (the pip layout): the same files either way, found with their bytecode.
A zip from a separate Spark distribution is left where it is. ``PYMQ_KEEP_PYSPARK_ZIP=1``
turns this off.

Runs at every interpreter start of the environment: standard library only, never raises.
"""

from __future__ import annotations

import os
import sys

__all__ = ["prefer_installed_pyspark"]

_ZIP_IN_PACKAGE = os.path.join("python", "lib", "pyspark.zip")


def prefer_installed_pyspark(path: list[str] | None = None) -> bool:
    """Move the pip pyspark's own ``pyspark.zip`` behind its package on ``path``.

    ``path`` defaults to ``sys.path`` and is changed in place. Returns True when an entry
    moved.
    """
    if os.environ.get("PYMQ_KEEP_PYSPARK_ZIP", "") not in ("", "0"):
        return False
    entries = sys.path if path is None else path
    try:
        names = [entry for entry in entries if isinstance(entry, str)]  # sys.path may hold other objects
        roots = {os.path.realpath(entry) for entry in names if entry and not entry.endswith(".zip")}
        moved = [entry for entry in names if _is_zip_of_installed_pyspark(entry, roots)]
    except (OSError, ValueError):
        return False
    for entry in moved:
        entries.remove(entry)
        entries.append(entry)
    return bool(moved)


def _is_zip_of_installed_pyspark(entry: str, roots: set[str]) -> bool:
    if not entry.endswith(_ZIP_IN_PACKAGE):
        return False
    package = os.path.realpath(entry)[: -len(_ZIP_IN_PACKAGE) - 1]
    return (
        os.path.basename(package) == "pyspark"
        and os.path.dirname(package) in roots
        and os.path.isfile(os.path.join(package, "__init__.py"))
    )
