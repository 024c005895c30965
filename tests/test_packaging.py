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
