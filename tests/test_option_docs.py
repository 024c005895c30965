"""The option registry is the one source of truth: the parsers obey it, the docs are rendered from it.

When a test here fails after an option changed, edit
``connector/pyspark_pymq/spark/option_registry.py`` and run
``python -m pyspark_pymq.spark.option_docs`` (it rewrites README.md's option
tables and ``PymqDataSource``'s option lists).
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

import pytest
from pyspark.sql.types import BinaryType, StructField, StructType
from pyspark_pymq.spark import option_docs, views
from pyspark_pymq.spark.data_source import PymqDataSource
from pyspark_pymq.spark.option_registry import (
    REGISTRIES,
    SINK_OPTIONS,
    SOURCE_OPTIONS,
    VIEW_OPTIONS,
    OptionRegistry,
    OptionSpec,
)
from pyspark_pymq.spark.options import parse_source_options
from pyspark_pymq.spark.sink_options import parse_sink_options

FIX = "stale: run `python -m pyspark_pymq.spark.option_docs` to render it from the registry"
EP = "127.0.0.1:8081"
BODY = StructType([StructField("body", BinaryType())])
SEND_BACK = StructType.fromJson({"type": "struct", "fields": [
    {"name": name, "type": kind, "nullable": True, "metadata": {}} for name, kind in (
        ("commit_log_offset", "long"), ("msg_id", "string"), ("topic", "string"), ("broker_name", "string"),
        ("reconsume_times", "integer"), ("body", "binary"),
        ("properties", {"type": "map", "keyType": "string", "valueType": "string",
                        "valueContainsNull": True}),
    )
]})
IDS = [r.kind for r in REGISTRIES]


def readme() -> str:
    return option_docs.README_PATH.read_text(encoding="utf-8")


def data_source_text() -> str:
    return option_docs.DATA_SOURCE_PATH.read_text(encoding="utf-8")


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# -- the documents are what the registry renders ---------------------------------------------------


@pytest.mark.parametrize("registry", REGISTRIES, ids=IDS)
def test_readme_option_table_is_rendered_from_the_registry(registry: OptionRegistry) -> None:
    got = option_docs.region(readme(), option_docs.readme_markers(registry.kind))
    assert got == option_docs.readme_region_body(registry), f"README.md's {registry.kind} options are {FIX}"


@pytest.mark.parametrize("registry", REGISTRIES, ids=IDS)
def test_docstring_option_list_is_rendered_from_the_registry(registry: OptionRegistry) -> None:
    got = option_docs.region(data_source_text(), option_docs.docstring_markers(registry.kind))
    assert got == option_docs.docstring_region_body(registry), (
        f"PymqDataSource's {registry.kind} options are {FIX}"
    )
    doc = PymqDataSource.__doc__
    if doc is not None:  # None under python -OO
        assert option_docs.render_docstring_list(registry) in doc


@pytest.mark.parametrize("registry", REGISTRIES, ids=IDS)
def test_every_registered_option_is_documented_in_both(registry: OptionRegistry) -> None:
    table = option_docs.region(readme(), option_docs.readme_markers(registry.kind))
    in_readme = re.findall(r"^\| `([A-Za-z]+)` \|", table, flags=re.MULTILINE)
    listing = option_docs.region(data_source_text(), option_docs.docstring_markers(registry.kind))
    in_docstring = re.findall(r"^    ``([A-Za-z]+)``$", listing, flags=re.MULTILINE)
    assert in_readme == list(registry.names)
    assert in_docstring == list(registry.names)
    for spec in registry:
        assert spec.doc.strip(), f"{registry.kind} option {spec.name} has no doc"


def test_the_options_missing_from_the_docs_before_are_documented() -> None:
    assert "subscriptionType" in SOURCE_OPTIONS.names and "consumeTimestamp" in SOURCE_OPTIONS.names
    assert "stage" in SINK_OPTIONS.names
    for kind, name in (("source", "subscriptionType"), ("source", "consumeTimestamp"), ("sink", "stage")):
        assert f"| `{name}` |" in option_docs.region(readme(), option_docs.readme_markers(kind))


@pytest.mark.parametrize("registry", REGISTRIES, ids=IDS)
def test_markdown_rows_have_one_cell_per_column(registry: OptionRegistry) -> None:
    rows = option_docs.render_markdown_table(registry).splitlines()
    widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
    assert len(widths) == 1, rows


def test_links_in_option_docs_name_readme_headings() -> None:
    headings = re.findall(r"^#+ (.+)$", readme(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    for registry in REGISTRIES:
        for spec in registry:
            for anchor in re.findall(r"\]\(#([^)]+)\)", spec.doc):
                assert anchor in anchors, f"{spec.name}: README.md has no heading #{anchor}"


def test_check_reports_stale_documents_and_the_rewrite_fixes_them(tmp_path: Path) -> None:
    assert option_docs.main(["--check"]) == 0
    stale_readme, stale_source = tmp_path / "README.md", tmp_path / "data_source.py"
    stale_readme.write_text(readme().replace("| `pullBatchSize` |", "| `pullBatch` |"), encoding="utf-8")
    stale_source.write_text(data_source_text().replace("``pullBatchSize``", "``pullBatch``"),
                            encoding="utf-8")
    args = ["--readme", str(stale_readme), "--data-source", str(stale_source)]
    assert option_docs.main(["--check", *args]) == 1
    assert option_docs.main(args) == 0
    assert stale_readme.read_text(encoding="utf-8") == readme()
    assert stale_source.read_text(encoding="utf-8") == data_source_text()
    assert option_docs.main(["--check", *args]) == 0


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError, match="options:source:begin"):
        option_docs.rewrite_readme("no markers here\n")


# -- the parsers obey the registry ---------------------------------------------------------------------


def test_view_options_are_the_view_readers() -> None:
    # every view the registry documents has a schema, and every option it knows is parsed
    assert VIEW_OPTIONS["view"].choices == tuple(views.VIEWS)
    with pytest.raises(ValueError, match=r"'nope' does not apply to a view read.*View options: endpoint"):
        views.parse_view_options({"endpoint": "127.0.0.1:1", "view": "lag", "nope": "1"})
    with pytest.raises(ValueError, match=r"view='bogus'.*use one of topics, queues"):
        views.parse_view_options({"endpoint": "127.0.0.1:1", "view": "bogus"})
    with pytest.raises(ValueError, match=r"maxMessages='0'.*integer >= 1"):
        views.parse_view_options({"endpoint": "127.0.0.1:1", "view": "deadLetters",
                                  "consumerGroup": "g", "maxMessages": "0"})
    got = views.parse_view_options({"ENDPOINT": "127.0.0.1:1", "View": "DEADLETTERS", "consumergroup": "g",
                                    "includesystem": "TRUE"})
    assert (got.view, got.group, got.include_system, got.max_messages) == ("deadLetters", "g", True, 10000)


@pytest.mark.parametrize("name", SOURCE_OPTIONS.names)
def test_the_source_knows_every_registered_option_in_any_case(name: str) -> None:
    for key in (name, name.lower(), name.upper()):
        try:
            parse_source_options({"endpoint": EP, "topic": "t", key: "?"}, stream=None)
        except ValueError as err:
            assert "is unknown" not in str(err), err


@pytest.mark.parametrize("name", SINK_OPTIONS.names)
def test_the_sink_knows_every_registered_option_in_any_case(name: str) -> None:
    for key in (name, name.lower(), name.upper()):
        try:
            parse_sink_options({"endpoint": EP, "topic": "t", key: "?"}, BODY, stream=True)
        except ValueError as err:
            assert "is unknown" not in str(err), err


def test_unknown_options_name_the_closest_registered_one() -> None:
    with pytest.raises(ValueError, match=r"'pullBatchSise' is unknown\. Did you mean 'pullBatchSize'\?"):
        parse_source_options({"endpoint": EP, "topic": "t", "pullBatchSise": "1"}, stream=False)
    with pytest.raises(ValueError, match=r"sink option 'sendmodes' is unknown\. Did you mean 'sendMode'\?"):
        parse_sink_options({"endpoint": EP, "topic": "t", "sendmodes": "sync"}, BODY, stream=False)
    # Spark lower-cases the names: the hint is still the registered spelling
    with pytest.raises(ValueError, match=r"'pullbatchsise' is unknown\. Did you mean 'pullBatchSize'\?"):
        parse_source_options({"endpoint": EP, "topic": "t", "pullbatchsise": "1"}, stream=False)


@pytest.mark.parametrize(("kafka", "here"), [
    ("subscribe", "use 'topic' here"),  # not the closest spelling, 'subscription' (the tag filter)
    ("minOffsetsPerTrigger", "use 'minMessagesPerTrigger' here (with maxTriggerDelay"),
    ("kafkaConsumer.pollTimeoutMs", "use 'pollTimeoutMs' here"),
    ("kafka.security.protocol", "TLS is options tls=true and tlsCaFile"),
    ("kafka.sasl.jaas.config", "authentication is options accessKey and secretKey"),
    ("kafka.bootstrap.servers", "use 'endpoint' here (the pymq broker's host:port, or namesrvAddr"),
    ("kafka.group.id", "use 'consumerGroup' here"),
    ("maxOffsetsPerTrigger", "use 'maxMessagesPerTrigger' here"),
    ("includeHeaders", "every message's properties (RocketMQ's headers) are in the properties column"),
])
def test_the_kafka_connectors_option_names_say_what_they_are_called_here(kafka: str, here: str) -> None:
    with pytest.raises(ValueError, match="is unknown") as info:  # as Spark hands them over: lower-cased
        parse_source_options({"endpoint": EP, "topic": "t", kafka.lower(): "x"}, stream=True)
    assert "It is an option of Spark's Kafka connector: " in str(info.value) and here in str(info.value)
    assert "Did you mean" not in str(info.value)


def test_other_kafka_client_settings_say_none_pass_through() -> None:
    with pytest.raises(ValueError, match="pymq passes no Kafka client settings through") as info:
        parse_sink_options({"endpoint": EP, "topic": "t", "kafka.linger.ms": "5"}, BODY, stream=True)
    assert "Did you mean" not in str(info.value)
    with pytest.raises(ValueError, match="use 'sendMode' here"):
        parse_sink_options({"endpoint": EP, "topic": "t", "kafka.acks": "all"}, BODY, stream=True)


@pytest.mark.parametrize("spec", [s for s in SOURCE_OPTIONS if s.scope != "both"], ids=lambda s: s.name)
def test_source_scope_is_enforced_as_documented(spec: OptionSpec) -> None:
    wrong_kind_is_stream = spec.scope == "batch"
    options = {"endpoint": EP, "topic": "t", "consumerGroup": "g", spec.name: "1"}
    with pytest.raises(ValueError, match=f"{spec.name}='1' cannot apply to .* only. Remove it"):
        parse_source_options(options, stream=wrong_kind_is_stream)


def _int_cases() -> list[tuple[OptionRegistry, OptionSpec]]:
    return [(r, s) for r in (SOURCE_OPTIONS, SINK_OPTIONS) for s in r if s.type == "integer"]


@pytest.mark.parametrize(("registry", "spec"), _int_cases(), ids=lambda x: getattr(x, "name", ""))
def test_integer_bounds_are_the_documented_ones(registry: OptionRegistry, spec: OptionSpec) -> None:
    assert spec.minimum is not None
    bad = [str(spec.minimum - 1), "x"] + ([str(spec.maximum + 1)] if spec.maximum is not None else [])
    upper = f" and <= {spec.maximum}" if spec.maximum is not None else ""
    for value in bad:
        with pytest.raises(ValueError) as info:
            if registry is SOURCE_OPTIONS:
                parse_source_options(
                    {"endpoint": EP, "topic": "t", "consumerGroup": "g", spec.name: value},
                    stream=spec.scope == "stream",
                )
            elif spec.section == "send back":  # refused with action=send
                parse_sink_options({"endpoint": EP, "action": "reconsumeLater", "consumerGroup": "g",
                                    spec.name: value}, SEND_BACK, stream=True)
            else:
                parse_sink_options({"endpoint": EP, "topic": "t", spec.name: value}, BODY, stream=True)
        message = str(info.value)
        assert f"{registry.prefix} {spec.name}={value!r}" in message
        assert f"use an integer >= {spec.minimum}{upper}" in message


def _value(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


GIVEN = ("endpoint", "topic", "consumerGroup")


def test_documented_defaults_are_what_the_parsers_use() -> None:
    compared = []
    sink = {"endpoint": EP, "topic": "t"}
    parsed = {
        SOURCE_OPTIONS: [
            parse_source_options({"endpoint": EP, "topic": "t", "consumerGroup": "g"}, stream=True),
            parse_source_options({"endpoint": EP, "topic": "t"}, stream=False),
        ],
        SINK_OPTIONS: [parse_sink_options(sink, BODY, stream=s) for s in (True, False)],
    }
    for registry, results in parsed.items():
        for spec in registry:
            attr = snake(spec.name)
            for result in results:
                if not hasattr(result, attr):
                    continue
                value = _value(getattr(result, attr))
                if spec.default is not None:
                    assert value == spec.default, (registry.kind, spec.name)
                    compared.append(spec.name)
                elif spec.default_doc is None and spec.required is None and spec.name not in GIVEN:
                    assert value is None, (registry.kind, spec.name, value)  # documented as "no default"
    assert len(set(compared)) >= 15, compared
    stream_sink, batch_sink = parsed[SINK_OPTIONS]
    # as `stage` documents:
    assert (stream_sink.stage, batch_sink.stage) == ("spark-stream-sink", "spark-sink")
