"""Sphinx configuration of pymq's API reference (``make docs``).

The reference is built from the docstrings. They are reStructuredText as written
(``literals``, ``::`` blocks, simple tables, ``:class:`` roles); a few functions
and classes add Google-style ``Args:`` / ``Returns:`` sections, which napoleon's
parser turns into field lists. Modules are imported from this source tree, not
from an installed copy, and nothing here needs a running broker or a Spark JVM
(pyspark's Python modules import without one).

Every module of the three packages must appear on some page: a new module that
is not documented is a warning, so ``make docs`` (warnings as errors) fails and
says which page to add it to.
"""

from __future__ import annotations

import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.ext.napoleon import Config as NapoleonConfig
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.util import logging

ROOT = Path(__file__).resolve().parent.parent
# setup.cfg's package_dir: pyspark_pymq lives in connector/, pymq_broker in broker_stub/,
# pymq_proto in proto/. Put them first so the docs describe this tree, not site-packages.
PACKAGE_DIRS = {"pyspark_pymq": "connector", "pymq_broker": "broker_stub", "pymq_proto": "proto"}
for sub in PACKAGE_DIRS.values():
    sys.path.insert(0, str(ROOT / sub))

project = "pymq"
author = "pymq contributors"
copyright = "pymq contributors, Apache-2.0"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_preserve_defaults = True

exclude_patterns = ["_build"]
# Docstrings quote command lines ("--port 0"): keep "--" and quotes as typed.
smartquotes = False
templates_path: list[str] = []
html_theme = "alabaster"
html_static_path: list[str] = []
html_title = "pymq API reference"
html_theme_options = {
    "description": "Spark Structured Streaming on a RocketMQ-style broker",
    "fixed_sidebar": True,
    "page_width": "1200px",
}

# -- Google-style sections ---------------------------------------------------------------
# napoleon is applied only to the docstrings of callables and classes that have a Google
# section header. Loaded as an extension it would also read the first line of every
# property or attribute docstring as "type: description", and most of pymq's start with
# a phrase and a colon ("Where requests go, in words: for error messages.").
_GOOGLE_SECTION = re.compile(r"^\s*(Args|Arguments|Attributes|Returns|Raises|Yields|Keyword Args):\s*$")
_NAPOLEON = NapoleonConfig(
    napoleon_google_docstring=True, napoleon_numpy_docstring=False, napoleon_use_rtype=False,
    napoleon_use_ivar=True,
)


def _google_sections(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if what not in {"function", "method", "class", "exception"}:
        return
    if not any(_GOOGLE_SECTION.match(line) for line in lines):
        return
    lines[:] = GoogleDocstring(lines, _NAPOLEON, app, what, name, obj, options).lines()


# -- every module documented -------------------------------------------------------------
# Generated gRPC code and ``python -m`` entry points are left out on purpose.
_NOT_DOCUMENTED = re.compile(r"(\.__main__$|^pymq_proto\.v1(\.|$)|^pymq_proto\.rocketmq_v2\.\w+_pb2(_grpc)?$)")


def _all_modules() -> set[str]:
    found: set[str] = set()
    for package, sub in PACKAGE_DIRS.items():
        found.add(package)
        path = [str(ROOT / sub / package)]
        for info in pkgutil.walk_packages(path, prefix=package + ".", onerror=lambda _name: None):
            found.add(info.name)
    return {name for name in found if not _NOT_DOCUMENTED.search(name)}


def _check_every_module_documented(app: Sphinx, env: Any) -> None:
    documented = set(env.domaindata["py"]["modules"])
    missing = sorted(_all_modules() - documented)
    if missing:
        logging.getLogger(__name__).warning(
            "module(s) with no page in docs/: %s; add an ``.. automodule::`` to the page of "
            "their layer (client.rst, spark.rst, admin.rst, broker.rst or backends.rst)",
            ", ".join(missing),
        )


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _google_sections)
    app.connect("env-check-consistency", _check_every_module_documented)
