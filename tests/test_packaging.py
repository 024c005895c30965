"""The wheel holds every package of the source tree (setup.cfg lists them by hand)."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_setup_cfg_lists_every_package_of_the_tree() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    roots = dict(
        line.split("=", 1) for line in cfg["options"]["package_dir"].strip().splitlines()
    )
    # The root ("" = connector) holds top-level modules only (py_modules), every package has its own line.
    modules = {f"{m}.py" for m in cfg["options"]["py_modules"].split()}
    assert modules <= {p.name for p in (ROOT / "connector").glob("*.py")}
    found = set()
    for name, where in ((n.strip(), w.strip()) for n, w in roots.items() if n.strip()):
        base = ROOT / where
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join((name, *rel.parts)))
    assert found - listed == set(), "packages missing from setup.cfg [options] packages"
    assert listed - found == set(), "setup.cfg lists packages that do not exist"


def test_a_wheel_built_from_the_sdist_installs_everything_the_tree_does(tmp_path: Path) -> None:
    """``pip install`` from PyPI may build from the sdist: the sdist must carry what the build
    needs (the build_py hook that writes the ``.pth``), and its wheel every package, module,
    generated protobuf file and the ``.pth`` itself. Built offline with the PEP 517 hooks,
    from a copy of the tracked files (the tree stays untouched)."""
    import subprocess
    import sys
    import tarfile
    import zipfile

    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    src = tmp_path / "src"
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((ROOT / rel).read_bytes())

    def hook(cwd: Path, call: str) -> str:
        code = f"from setuptools import build_meta as b; print(b.{call})"
        run = subprocess.run
        out = run([sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True, text=True)
        return out.stdout.strip().splitlines()[-1]

    dist = tmp_path / "dist"
    sdist = dist / hook(src, f"build_sdist({str(dist)!r})")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    wheel = dist / hook(unpacked, f"build_wheel({str(dist)!r})")
    names = set(zipfile.ZipFile(wheel).namelist())

    assert "pyspark_pymq-pyspark-path.pth" in names
    assert {"_pyspark_pymq_path.py", "_pyspark_pymq_build.py"} <= names
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for package in cfg["options"]["packages"].split():
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
    assert "pymq_proto/v1/pymq_pb2.py" in names and "pymq_broker/py.typed" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "pymq-broker" in zipfile.ZipFile(wheel).read(entry_points).decode()
