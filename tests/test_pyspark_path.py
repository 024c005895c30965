"""Spark's Python processes import pip's pyspark (with its bytecode), not the same code from pyspark.zip.

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
    return str(site), str(lib / "pyspark.zip")


def test_the_zip_of_the_installed_pyspark_moves_behind_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYMQ_KEEP_PYSPARK_ZIP", raising=False)
    site, zip_path = _pip_layout(tmp_path)
    path = [zip_path, "/x/py4j-0.10.9.9-src.zip", "/src", site]
    assert prefer_installed_pyspark(path) is True
    assert path == ["/x/py4j-0.10.9.9-src.zip", "/src", site, zip_path]


def test_a_zip_of_another_spark_distribution_stays_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYMQ_KEEP_PYSPARK_ZIP", raising=False)
    site, _ = _pip_layout(tmp_path / "venv")
    dist_site, dist_zip = _pip_layout(tmp_path / "opt-spark")  # its package dir is not on the path
    path = [dist_zip, site]
    assert prefer_installed_pyspark(path) is False
    assert path == [dist_zip, site]
    # The pip layout without a pyspark package beside the zip: nothing to import instead.
    (Path(dist_site) / "pyspark" / "__init__.py").unlink()
    path = [dist_zip, dist_site]
    assert prefer_installed_pyspark(path) is False
    assert path == [dist_zip, dist_site]


def test_pymq_keep_pyspark_zip_turns_it_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site, zip_path = _pip_layout(tmp_path)
    monkeypatch.setenv("PYMQ_KEEP_PYSPARK_ZIP", "1")
    path = [zip_path, site]
    assert prefer_installed_pyspark(path) is False
    assert path == [zip_path, site]


def _pyspark_file(keep: str) -> str:
    import pyspark

    zip_path = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    env = {**os.environ, "PYTHONPATH": str(zip_path), "PYMQ_KEEP_PYSPARK_ZIP": keep}
    out = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_installed_pth_applies_at_interpreter_start() -> None:
    assert ".zip" not in _pyspark_file("0")
    assert "pyspark.zip" in _pyspark_file("1")  # what Spark does without pymq


@pytest.mark.spark
def test_spark_python_workers_import_the_installed_pyspark(spark: object) -> None:
    from pyspark.sql import functions as F

    @F.udf("string")
    def where_pyspark(_):  # type: ignore[no-untyped-def]  # Spark reads type hints as a pandas UDF
        import pyspark

        return str(pyspark.__file__)

    found = spark.range(1).select(where_pyspark("id")).first()[0]  # type: ignore[attr-defined]
    assert ".zip" not in found and found.endswith(os.path.join("pyspark", "__init__.py"))
