"""The option lists of README.md and of ``PymqDataSource``'s docstring, rendered from the registry.

Both documents hold each registry's list between markers, which this module
rewrites (and nothing else)::

    README.md          <!-- options:source:begin --> ... <!-- options:source:end -->
    data_source.py     .. options:source:begin       ...  .. options:source:end

(``source``, ``sink`` and ``view``). After changing an option in
:mod:`pyspark_pymq.spark.option_registry`, run from the repository::

    python -m pyspark_pymq.spark.option_docs           # rewrite both documents
    python -m pyspark_pymq.spark.option_docs --check   # exit 1 if either is stale

``tests/test_option_docs.py`` runs the check.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from .option_registry import REGISTRIES, OptionRegistry, OptionSpec

__all__ = [
    "DATA_SOURCE_PATH",
    "README_PATH",
    "docstring_markers",
    "main",
    "readme_markers",
    "region",
    "render_docstring_list",
    "render_markdown_table",
    "rewrite_data_source",
    "rewrite_readme",
]

_REPO = Path(__file__).resolve().parents[3]
README_PATH = _REPO / "README.md"
DATA_SOURCE_PATH = Path(__file__).resolve().parent / "data_source.py"

_DOCSTRING_INDENT = " " * 4
_DOCSTRING_WIDTH = 104  # data_source.py's lines stay within ruff's 110
_BROKERS = {"both": "pymq, RocketMQ", "pymq": "pymq", "rocketmq": "RocketMQ"}
_LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")
_CODE = re.compile(r"`([^`]+)`")


# -- facts of one option, as text with `code` ------------------------------------------------------


def type_text(spec: OptionSpec) -> str:
    """``integer 1..100000``, ``boolean``, ``one of `A`, `B```..."""
    if spec.type == "integer":
        if spec.maximum is not None:
            return f"integer {spec.minimum}..{spec.maximum}"
        return f"integer >= {spec.minimum}"
    if spec.type == "choice":
        return "one of " + ", ".join(f"`{c}`" for c in spec.choices)
    names = {"list": "comma-separated list", "json": "keyword or JSON", "json_object": "JSON"}
    return names.get(spec.type, spec.type)


def default_text(spec: OptionSpec) -> str:
    """The default as documented (or how the option is required); "" when there is none."""
    if spec.required is not None:
        return spec.required
    if spec.default_doc is not None:
        return spec.default_doc
    if spec.default is None:
        return ""
    if isinstance(spec.default, bool):
        return f"`{str(spec.default).lower()}`"
    if isinstance(spec.default, int):
        return str(spec.default)
    return f"`{spec.default}`"


def scope_text(registry: OptionRegistry, spec: OptionSpec) -> str:
    if spec.scope == "stream":
        return f"`{registry.stream_api}` only"
    if spec.scope == "batch":
        return f"`{registry.batch_api}` only"
    return f"`{registry.stream_api}`, `{registry.batch_api}`"


def doc_text(spec: OptionSpec) -> str:
    """The doc, plus the other spellings a choice accepts."""
    if not spec.aliases:
        return spec.doc
    return f"{spec.doc} Also accepted: {', '.join(f'`{alias}`' for alias, _ in spec.aliases)}."


# -- Markdown (README.md) ---------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown_table(registry: OptionRegistry) -> str:
    """The registry as a GitHub Markdown table, one row per option."""
    columns = ["option", "type", "default", *(["scope"] if registry.scoped else []), "broker", "meaning"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for spec in registry:
        cells = [f"`{spec.name}`", type_text(spec), default_text(spec)]
        if registry.scoped:
            cells.append(scope_text(registry, spec))
        cells += [_BROKERS[spec.backend], doc_text(spec)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


# -- reStructuredText (the docstring) ----------------------------------------------------------------


def _rst(text: str) -> str:
    """`code` as ``code``; a README link as its text (and where to find it)."""
    text = _LINK.sub(
        lambda m: f'"{m.group(1)}" in README.md' if m.group(2).startswith("#") else m.group(1), text
    )
    return _CODE.sub(r"``\1``", text)


def render_docstring_list(registry: OptionRegistry, indent: str = _DOCSTRING_INDENT) -> str:
    """The registry as an RST definition list, readable in ``help()`` too."""
    body_indent = indent + "    "
    entries = []
    for spec in registry:
        facts = [type_text(spec)]
        default = default_text(spec)
        if spec.required is not None:
            facts.append(default)
        elif default:
            facts.append(f"default {default}")
        if registry.scoped and spec.scope != "both":
            facts.append(scope_text(registry, spec))
        if spec.backend != "both":
            facts.append(f"{_BROKERS[spec.backend]} only")
        text = _rst(f"({'; '.join(facts)}) {doc_text(spec)}")
        wrapped = textwrap.fill(
            text, width=_DOCSTRING_WIDTH, initial_indent=body_indent, subsequent_indent=body_indent,
            break_long_words=False, break_on_hyphens=False,
        )
        entries.append(f"{indent}``{spec.name}``\n{wrapped}\n")
    return "\n".join(entries)


# -- regions -----------------------------------------------------------------------------------------


def readme_markers(kind: str) -> tuple[str, str]:
    return f"<!-- options:{kind}:begin -->\n", f"<!-- options:{kind}:end -->\n"


def docstring_markers(kind: str, indent: str = _DOCSTRING_INDENT) -> tuple[str, str]:
    return f"{indent}.. options:{kind}:begin\n", f"{indent}.. options:{kind}:end\n"


def region(text: str, markers: tuple[str, str]) -> str:
    """What ``text`` holds between the two marker lines (ValueError if they are missing)."""
    begin, end = markers
    first = text.find(begin)
    last = text.find(end, first + len(begin)) if first >= 0 else -1
    if first < 0 or last < 0 or text.count(begin) != 1:
        raise ValueError(f"expected one {begin.strip()!r} followed by {end.strip()!r}")
    return text[first + len(begin):last]


def _replace(text: str, markers: tuple[str, str], body: str) -> str:
    begin, _ = markers
    old = region(text, markers)
    start = text.index(begin) + len(begin)
    return text[:start] + body + text[start + len(old):]


def readme_region_body(registry: OptionRegistry) -> str:
    return "\n" + render_markdown_table(registry) + "\n"


def docstring_region_body(registry: OptionRegistry) -> str:
    return "\n" + render_docstring_list(registry) + "\n"


def rewrite_readme(text: str, registries: Sequence[OptionRegistry] = REGISTRIES) -> str:
    for registry in registries:
        text = _replace(text, readme_markers(registry.kind), readme_region_body(registry))
    return text


def rewrite_data_source(text: str, registries: Sequence[OptionRegistry] = REGISTRIES) -> str:
    for registry in registries:
        text = _replace(text, docstring_markers(registry.kind), docstring_region_body(registry))
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pyspark_pymq.spark.option_docs",
        description="Render the option lists of README.md and PymqDataSource's docstring from the registry.",
    )
    parser.add_argument("--check", action="store_true", help="only report stale documents (exit 1)")
    parser.add_argument("--readme", type=Path, default=README_PATH)
    parser.add_argument("--data-source", type=Path, default=DATA_SOURCE_PATH)
    args = parser.parse_args(argv)
    stale = []
    for path, rewrite in ((args.readme, rewrite_readme), (args.data_source, rewrite_data_source)):
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(new, encoding="utf-8")
    for path in stale:
        verb = "is stale" if args.check else "rewritten"
        print(f"{path} {verb}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
