"""Let Spark's Python processes import pip's pyspark, not the same code from ``pyspark.zip``.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, py4j's zip and its own ``spark-core`` jar
at the front of the ``PYTHONPATH`` of every Python process it starts
(``PythonUtils.sparkPythonPath``). With a pip-installed pyspark, ``SPARK_HOME`` is that very
package: the zips hold the code that sits, already byte-compiled, in site-packages (pyspark
itself, and the py4j that pip installed with it), and the jar (5,800 entries) holds no Python
at all. Python cannot cache bytecode for a zip: each process compiles the modules it imports
from one again (~0.5 s of CPU for pyspark's, ~0.05 s for py4j's). And as the archives come
before the standard library on the path, the first import of any module that is not built in
makes a finder for each (reading its directory), and ``importlib.invalidate_caches()``, which
Spark's workers and every streaming query's Python source runner call at their start, reads
every such directory again: ~0.1 s of CPU, most of it the jar's. Most of Spark's Python
processes are forked from its worker daemon and pay this once, but every streaming query
starts its Python source runner afresh: a notebook user waits for it on each ``readStream ...
start()`` (``benchmarks/bench_query_start.py``).

The ``pyspark_pymq-pyspark-path.pth`` file installed with pymq (written by ``_pyspark_pymq_build``) calls
:func:`prefer_installed_pyspark` at interpreter start, only when ``sys.path`` holds a
``pyspark.zip``. It drops ``python/lib/pyspark.zip``, ``python/lib/py4j-<version>-src.zip`` and
``jars/spark-core_*.jar`` of a pyspark package from ``sys.path``, and forgets the finders
already made for them, when, and only when, the rest of the path then imports that same
package (and for py4j's zip, a py4j of the zip's version) first: the same modules are then
found, with their bytecode. An entry before site-packages that would win instead (another
pyspark or py4j on ``PYTHONPATH``, an archive that may hold one), or a separate Spark
distribution, leaves the archives where they are. ``PYMQ_KEEP_PYSPARK_ZIP=1`` turns this off.

Runs at every interpreter start of the environment: standard library only, never raises.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import zipimport
from collections.abc import MutableMapping
from typing import Any

__all__ = ["prefer_installed_pyspark"]

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
        packages = {entry: _archive_of_a_pyspark_package(entry) for entry in names}
        rest = [entry for entry in names if packages[entry] is None]
        pyspark_root = _first_root_with("pyspark", rest)  # what the path imports once they are gone
        dropped = [entry for entry, package in packages.items()
                   if package is not None and os.path.dirname(package) == pyspark_root
                   and _py4j_found_without(entry, rest)]
        for entry in dropped:
            entries.remove(entry)
    except (OSError, ValueError, TypeError, RuntimeError):  # an odd sys.path: leave it as it is
        return False
    if path is None and dropped:  # imports before this .pth (other .pth files) made finders for them
        with contextlib.suppress(TypeError, RuntimeError):
            _forget_importers(dropped, sys.path_importer_cache)
    return bool(dropped)


def _forget_importers(dropped: list[str], cache: MutableMapping[str, Any]) -> None:
    """Drop the cached path-entry finders of ``dropped`` and of the directories inside them:
    ``importlib.invalidate_caches()`` reads every cached archive's directory again."""
    inside = tuple(entry + os.sep for entry in dropped)
    for key in [k for k in cache if isinstance(k, str) and (k in dropped or k.startswith(inside))]:
        cache.pop(key, None)


def _archive_of_a_pyspark_package(entry: str) -> str | None:
    """The pyspark package directory ``entry`` lies in as ``python/lib/pyspark.zip``,
    ``python/lib/py4j-<version>-src.zip`` or ``jars/spark-core_*.jar``; None if it is none of them."""
    name = os.path.basename(entry)
    if name == "pyspark.zip" or _PY4J_ZIP.fullmatch(name):
        lib = os.path.dirname(os.path.realpath(entry))
        package = os.path.dirname(os.path.dirname(lib))
        if lib != os.path.join(package, "python", "lib"):
            return None
    elif name.startswith("spark-core_") and name.endswith(".jar"):
        jars = os.path.dirname(os.path.realpath(entry))
        package = os.path.dirname(jars)
        if os.path.basename(jars) != "jars":
            return None
    else:
        return None
    if os.path.basename(package) != "pyspark" or not os.path.isfile(os.path.join(package, "__init__.py")):
        return None
    return package


def _py4j_found_without(entry: str, rest: list[str]) -> bool:
    """For py4j's zip: ``rest``, in order, imports a py4j of the zip's version first (True for
    the other archives)."""
    py4j = _PY4J_ZIP.fullmatch(os.path.basename(entry))
    if py4j is None:
        return True
    root = _first_root_with("py4j", rest)
    return root is not None and _py4j_version(root) == py4j.group(1)


def _first_root_with(top: str, entries: list[str]) -> str | None:
    """The real path of the first directory of ``entries`` that holds the regular package or module
    ``top``; None if there is none, or if an archive before it may hold ``top`` (not looked into)."""
    for entry in entries:
        if not entry:
            continue
        if os.path.isfile(entry):  # a zip or egg: Python reads it anyway, at the first import
            try:
                if zipimport.zipimporter(entry).find_spec(top) is not None:
                    return None
            except (zipimport.ZipImportError, OSError):
                pass
            continue
        if os.path.isfile(os.path.join(entry, top, "__init__.py")) or os.path.isfile(
            os.path.join(entry, top + ".py")
        ):
            return os.path.realpath(entry)
    return None


def _py4j_version(root: str) -> str | None:
    """The ``__version__`` of a py4j package directly under ``root``, None if there is none."""
    try:
        with open(os.path.join(root, "py4j", "version.py"), encoding="utf-8") as f:
            found = _PY4J_VERSION.search(f.read())
    except OSError:
        return None
    return found.group(1) if found else None
