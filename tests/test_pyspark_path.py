"""Spark's Python processes import pip's pyspark (with its bytecode), not the same code from pyspark.zip,
and do not read the spark-core jar's directory (it holds no Python).

``_pyspark_pymq_path`` is run by the ``.pth`` file the wheel installs; these tests call it on
made-up layouts, then check the installed interpreter and Spark's own workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pyspark_pymq_path import prefer_installed_pyspark


def _pip_layout(root: Path) -> tuple[str, str]:
    """A site-packages with a pyspark package and the pyspark.zip inside it, as pip installs it."""
    site = root / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"")
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    (site / "py4j" / "version.py").write_text("__version__ = '0.10.9.9'\n")
    (site / "pyspark" / "jars").mkdir()
    for jar in ("spark-core_2.13-4.2.0.jar", "spark-sql_2.13-4.2.0.jar"):
        (site / "pyspark" / "jars" / jar).write_bytes(b"")
    return str(site), str(lib / "pyspark.zip")


def _core_jar(site: str, name: str = "spark-core_2.13-4.2.0.jar") -> str:
    return os.path.join(site, "pyspark", "jars", name)


def test_the_zip_and_the_core_jar_of_the_installed_pyspark_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYMQ_KEEP_PYSPARK_ZIP", raising=False)
    site, zip_path = _pip_layout(tmp_path)
    other_jar = _core_jar(site, "spark-sql_2.13-4.2.0.jar")  # not one Spark puts on the path
    py4j_zip = zip_path.replace("pyspark.zip", "py4j-0.10.9.9-src.zip")
    path = [zip_path, py4j_zip, "/x/py4j-0.10.9.9-src.zip", "/src", site, _core_jar(site), other_jar]
    assert prefer_installed_pyspark(path) is True
    assert path == ["/x/py4j-0.10.9.9-src.zip", "/src", site, other_jar]


def test_py4j_zip_stays_unless_that_py4j_version_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYMQ_KEEP_PYSPARK_ZIP", raising=False)
    site, zip_path = _pip_layout(tmp_path)
    py4j_zip = zip_path.replace("pyspark.zip", "py4j-0.10.9.9-src.zip")
    (Path(site) / "py4j" / "version.py").write_text('__version__ = "0.10.9.8"\n')
    path = [py4j_zip, site]
    assert prefer_installed_pyspark(path) is False and path == [py4j_zip, site]
    (Path(site) / "py4j" / "version.py").unlink()
    assert prefer_installed_pyspark(path) is False and path == [py4j_zip, site]


def test_archives_stay_where_an_earlier_entry_would_win_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what the path itself would then import counts: an entry before site-packages wins."""
    import zipfile

    monkeypatch.delenv("PYMQ_KEEP_PYSPARK_ZIP", raising=False)
    site, zip_path = _pip_layout(tmp_path)
    py4j_zip, jar = zip_path.replace("pyspark.zip", "py4j-0.10.9.9-src.zip"), _core_jar(site)
    spark_path = [zip_path, py4j_zip, jar]
    old_py4j = tmp_path / "old-py4j"  # another py4j version, on PYTHONPATH before site-packages
    (old_py4j / "py4j").mkdir(parents=True)
    (old_py4j / "py4j" / "__init__.py").write_text("")
    (old_py4j / "py4j" / "version.py").write_text("__version__ = '0.10.9.5'\n")
    path = [*spark_path, str(old_py4j), site]
    assert prefer_installed_pyspark(path) is True
    assert path == [py4j_zip, str(old_py4j), site]  # py4j's zip stays: it would have won
    other_spark = tmp_path / "spark-3.5" / "python"  # another pyspark before site-packages
    (other_spark / "pyspark").mkdir(parents=True)
    (other_spark / "pyspark" / "__init__.py").write_text("")
    path = [*spark_path, str(other_spark), site]
    assert prefer_installed_pyspark(path) is False and path == [*spark_path, str(other_spark), site]
    egg = tmp_path / "py4j.egg"  # an archive before site-packages that holds py4j
    with zipfile.ZipFile(egg, "w") as z:
        z.writestr("py4j/__init__.py", "")
    path = [*spark_path, str(egg), site]
    assert prefer_installed_pyspark(path) is True and path == [py4j_zip, str(egg), site]
    namespace = tmp_path / "ns"  # a pyspark/ without __init__.py loses to the regular package
    (namespace / "pyspark").mkdir(parents=True)
    path = [*spark_path, str(namespace), site]
    assert prefer_installed_pyspark(path) is True and path == [str(namespace), site]


def test_finders_made_for_the_dropped_archives_are_forgotten() -> None:
    from _pyspark_pymq_path import _forget_importers

    j = os.path.join
    zip_path, jar = j(os.sep, "s", "pyspark.zip"), j(os.sep, "s", "spark-core.jar")
    cache: dict[str, object] = {zip_path: 1, j(zip_path, "pyspark"): 2, zip_path + "x": 3,
                                jar: 4, j(jar, "org"): 5, j(os.sep, "site"): 6}
    _forget_importers([zip_path, jar], cache)
    assert cache == {zip_path + "x": 3, j(os.sep, "site"): 6}


def test_a_zip_of_another_spark_distribution_stays_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYMQ_KEEP_PYSPARK_ZIP", raising=False)
    site, _ = _pip_layout(tmp_path / "venv")
    dist_site, dist_zip = _pip_layout(tmp_path / "opt-spark")  # its package dir is not on the path
    path = [dist_zip, site, _core_jar(dist_site)]
    assert prefer_installed_pyspark(path) is False
    assert path == [dist_zip, site, _core_jar(dist_site)]
    # The pip layout without a pyspark package beside the zip: nothing to import instead.
    (Path(dist_site) / "pyspark" / "__init__.py").unlink()
    path = [dist_zip, dist_site]
    assert prefer_installed_pyspark(path) is False
    assert path == [dist_zip, dist_site]


def test_pymq_keep_pyspark_zip_turns_it_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site, zip_path = _pip_layout(tmp_path)
    monkeypatch.setenv("PYMQ_KEEP_PYSPARK_ZIP", "1")
    path = [zip_path, site, _core_jar(site)]
    assert prefer_installed_pyspark(path) is False
    assert path == [zip_path, site, _core_jar(site)]


def _pyspark_file_and_archives(keep: str) -> tuple[str, list[str]]:
    """Where a process with Spark's PYTHONPATH finds pyspark, and the archives left on its path."""
    import pyspark

    package = Path(pyspark.__file__).parent
    jars = sorted((package / "jars").glob("spark-core_*.jar"))
    assert len(jars) == 1, jars
    lib = package / "python" / "lib"
    spark_path = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*-src.zip")), str(jars[0])]  # as Spark
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(spark_path), "PYMQ_KEEP_PYSPARK_ZIP": keep}
    code = ("import sys, importlib, pyspark, py4j; print(pyspark.__file__, py4j.__file__);"
            " importlib.invalidate_caches(); import zipimport;"
            " print(*[p for p in sys.path if p in sys.argv[1:]]);"
            " print(*[k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)"
            " and k.startswith(tuple(sys.argv[1:]))])")
    out = subprocess.run([sys.executable, "-c", code, *spark_path],
                         env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    return out[0], [*out[1].split(), *out[2].split()]


def test_the_installed_pth_applies_at_interpreter_start() -> None:
    found, archives = _pyspark_file_and_archives("0")
    assert ".zip" not in found and archives == []  # neither on sys.path nor read by a finder
    found, archives = _pyspark_file_and_archives("1")  # what Spark does without pymq
    assert "pyspark.zip" in found and "py4j-" in found and any(a.endswith(".jar") for a in archives)


@pytest.mark.spark
def test_spark_python_workers_import_the_installed_pyspark(spark: object) -> None:
    from pyspark.sql import functions as F

    @F.udf("string")
    def where_pyspark(_):  # type: ignore[no-untyped-def]  # Spark reads type hints as a pandas UDF
        import sys

        import pyspark

        archives = [p for p in sys.path if p.endswith((".zip", ".jar")) and "pyspark" in p]
        return "|".join([str(pyspark.__file__), *archives])

    found, *archives = spark.range(1).select(where_pyspark("id")).first()[0].split("|")  # type: ignore[attr-defined]
    assert ".zip" not in found and found.endswith(os.path.join("pyspark", "__init__.py"))
    assert archives == []
