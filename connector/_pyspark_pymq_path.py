"""Let Spark's Python processes import pip's pyspark, not the same code from ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the ``PYTHONPATH`` of
every Python process it starts, and its own ``spark-core`` jar last
(``PythonUtils.sparkPythonPath``). With a pip-installed pyspark, ``SPARK_HOME`` is that very
package: the zips hold the code that sits, already byte-compiled, in site-packages (pyspark
itself, and the py4j that pip installed with it), and the jar (5,800 entries) holds no Python
at all. Python cannot cache bytecode for a zip: each process compiles the modules it imports
from one again (~0.5 s of CPU for pyspark's, ~0.05 s for py4j's). And a finder is made for
each archive by the first import that looks past site-packages; ``importlib.invalidate_caches()``,
which Spark's workers and every streaming query's Python source runner call at their start,
reads every such archive's directory again: ~0.1 s of CPU, most of it the jar's. Most of
Spark's Python processes are forked from its worker daemon and pay this once, but every
streaming query starts its Python source runner afresh: a notebook user waits for it on each
``readStream ... start()`` (``benchmarks/bench_query_start.py``).

The ``pyspark_pymq-pyspark-path.pth`` file installed with pymq (written by ``_pyspark_pymq_build``) calls
:func:`prefer_installed_pyspark` at interpreter start, only when ``sys.path`` holds a
``pyspark.zip``. It drops ``python/lib/pyspark.zip``, ``python/lib/py4j-<version>-src.zip`` and
``jars/spark-core_*.jar`` from ``sys.path``, with the finders already made for them, when, and
only when, they lie inside a pyspark package that is itself importable from a ``sys.path``
entry (the pip layout), and for py4j's zip, when the same py4j version is importable too: the
same modules are then found, with their bytecode. Archives of a separate Spark distribution
are left where they are. ``PYMQ_KEEP_PYSPARK_ZIP=1`` turns this off.

Runs at every interpreter start of the environment: standard library only, never raises.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

__all__ = ["prefer_installed_pyspark"]

_ZIP_IN_PACKAGE = os.path.join("python", "lib", "pyspark.zip")
_PY4J_ZIP = re.compile(r"py4j-([0-9][0-9A-Za-z.]*)-src\.zip")
_PY4J_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def prefer_installed_pyspark(path: list[str] | None = None) -> bool:
    """Drop the pip pyspark's own ``pyspark.zip``, py4j zip and ``spark-core`` jar from ``path``.

    ``path`` defaults to ``sys.path`` and is changed in place. Returns True when an entry
    was dropped.
    """
    if os.environ.get("PYMQ_KEEP_PYSPARK_ZIP", "") not in ("", "0"):
        return False
    entries = sys.path if path is None else path
    try:
        names = [entry for entry in entries if isinstance(entry, str)]  # sys.path may hold other objects
        roots = {os.path.realpath(entry) for entry in names if entry and not entry.endswith((".zip", ".jar"))}
        dropped = [entry for entry in names if _installed_pyspark_archive(entry, roots)]
    except (OSError, ValueError):
        return False
    for entry in dropped:
        entries.remove(entry)
    if path is None:  # imports before this .pth (other .pth files) made readers of the archives
        _forget_importers(dropped, sys.path_importer_cache)
    return bool(dropped)


def _forget_importers(dropped: list[str], cache: MutableMapping[str, Any]) -> None:
    """Drop the cached path-entry finders of ``dropped`` and of the directories inside them:
    ``importlib.invalidate_caches()`` reads every cached archive's directory again."""
    inside = tuple(entry + os.sep for entry in dropped)
    for key in [k for k in cache if isinstance(k, str) and (k in dropped or k.startswith(inside))]:
        cache.pop(key, None)


def _installed_pyspark_archive(entry: str, roots: set[str]) -> bool:
    """``entry`` is the zip, py4j's zip or the spark-core jar inside a pyspark package importable
    from ``roots`` (py4j's only when the same py4j version is importable from ``roots`` too)."""
    name = os.path.basename(entry)
    py4j = _PY4J_ZIP.fullmatch(name)
    if entry.endswith(_ZIP_IN_PACKAGE) or py4j is not None:
        lib = os.path.dirname(os.path.realpath(entry))
        if lib != os.path.join(os.path.dirname(os.path.dirname(lib)), "python", "lib"):
            return False
        package = os.path.dirname(os.path.dirname(lib))
        if py4j is not None and not any(_py4j_version(root) == py4j.group(1) for root in roots):
            return False
    elif entry.endswith(".jar") and name.startswith("spark-core_"):
        jars = os.path.dirname(os.path.realpath(entry))
        if os.path.basename(jars) != "jars":
            return False
        package = os.path.dirname(jars)
    else:
        return False
    return (
        os.path.basename(package) == "pyspark"
        and os.path.dirname(package) in roots
        and os.path.isfile(os.path.join(package, "__init__.py"))
    )


def _py4j_version(root: str) -> str | None:
    """The ``__version__`` of a py4j package directly under ``root``, None if there is none."""
    try:
        with open(os.path.join(root, "py4j", "version.py"), encoding="utf-8") as f:
            found = _PY4J_VERSION.search(f.read())
    except OSError:
        return None
    return found.group(1) if found else None
