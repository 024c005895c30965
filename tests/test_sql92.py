"""SQL92 property filters: the parser (with generated expressions) and the broker end to end."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from pymq_broker.filter.sql92 import SQL92SyntaxError, compile_sql92
from pyspark_pymq import Admin, Message, Producer, PullConsumer
from pyspark_pymq.errors import NoPermissionError, SubscriptionParseError

PROPS = ["a", "b", "c", "region"]


def test_operators_and_three_valued_logic() -> None:
    m = {"a": "10", "b": "x", "flag": "true"}
    cases = {
        "a > 5": True, "a >= 10": True, "a < 10": False, "a <= 10.0": True, "a = 10": True,
        "a <> 10": False, "b = 'x'": True, "b <> 'y'": True, "a BETWEEN 1 AND 10": True,
        "a NOT BETWEEN 1 AND 10": False, "b IN ('x', 'y')": True, "b NOT IN ('x')": False,
        "c IS NULL": True, "c IS NOT NULL": False, "flag = TRUE": True, "TRUE": True,
        "c > 1": False, "NOT (c > 1)": False,  # unknown stays unknown under NOT
        "c > 1 OR a > 1": True, "c > 1 AND a > 1": False, "b > 1": False,  # not a number
        "a > 5 AND b = 'x' OR c = 'z'": True, "NOT (a > 5 AND b = 'y')": True,
        "b = 'it''s'": False, "c NOT IN ('x')": False,
    }
    for text, want in cases.items():
        assert compile_sql92(text).matches(m) is want, text


def matching(text: str, *messages: dict[str, str]) -> list[bool]:
    compiled = compile_sql92(text)
    return [compiled.matches(m) for m in messages]


def test_whole_numbers_are_java_integers_and_longs() -> None:
    """A property compared with 100 is read by Integer.valueOf: '199.99', '5.0', ' 10' are errors."""
    assert matching("price > 100", {"price": "199.99"}, {"price": "199"}, {"price": "+199"}) == \
        [False, True, True]
    assert matching("price > 100.0", {"price": "199.99"}) == [True]
    assert matching("a = 5", {"a": "5.0"}, {"a": "5"}) == [False, True]
    assert matching("a <> 5", {"a": "7.5"}, {"a": "7"}) == [False, True]
    assert matching("a BETWEEN 1 AND 10", {"a": "5.5"}, {"a": "5"}) == [False, True]
    assert matching("a > 5", {"a": " 10"}, {"a": "1_000"}, {"a": "3000000000"}) == [False, False, False]
    # past Integer's range a literal is a Long, and compares exactly
    big = {"a": "9007199254740993"}
    assert matching("a > 9007199254740992", big, {"a": "9007199254740992"}) == [True, False]
    assert matching("a = 9007199254740993", big) == [True]
    assert matching("a = 5L", {"a": "5"}) == [True]
    assert matching("a > -5", {"a": "-4"}, {"a": "-6"}) == [True, False]


def test_decimals_read_as_java_doubles() -> None:
    """Double.valueOf: blanks trimmed, an f/d suffix, NaN above every number; Python's spellings fail."""
    assert matching("a > 5.0", {"a": "10f"}, {"a": " 10 "}, {"a": "NaN"}, {"a": "Infinity"}, {"a": "0x1p4"}) \
        == [True, True, True, True, True]
    arabic_ten = "\u0661\u0660"  # Java reads only ASCII digits as a Double
    assert matching("a > 5.0", {"a": "inf"}, {"a": "nan"}, {"a": "1_000"}, {"a": arabic_ten}) == [False] * 4
    assert matching("a < 5.0", {"a": "NaN"}) == [False]
    assert matching("a > .5", {"a": "0.7"}) == [True]
    assert matching("a > 5.", {"a": "6"}) == [True]
    assert matching("a > b", {"a": "0", "b": "-0.0"}, {"a": "2", "b": "x"}) == [True, False]


def test_an_evaluation_error_ends_the_evaluation() -> None:
    """RocketMQ's broker does not deliver a message whose evaluation throws; AND / OR go left to right."""
    m = {"a": "abc", "b": "x"}
    assert matching("a > 5 OR b = 'x'", m) == [False]
    assert matching("b = 'x' OR a > 5", m) == [True]
    assert matching("b = 'y' AND a > 5", m) == [False]
    assert matching("NOT (a > 5)", m) == [False]
    assert matching("a = 5 OR a = 7", {"a": "5.0"}, {"a": "7"}) == [False, True]


def test_not_binds_tighter_than_comparisons() -> None:
    assert matching("NOT a IS NULL", {}, {"a": "1"}) == [True, False]  # (NOT a) IS NULL
    assert matching("NOT a = 'x'", {"a": "x"}, {"a": "y"}, {}) == [False, False, False]
    assert matching("NOT a", {"a": "true"}, {}) == [True, False]  # a property as a condition is FALSE
    assert matching("a", {"a": "true"}) == [False]
    assert matching("NOT (a > 1)", {"a": "0"}) == [True]
    for text in ("NOT a > 1", "NOT a IN ('x')", "NOT a BETWEEN 1 AND 2"):
        with pytest.raises(SQL92SyntaxError, match="NOT binds tighter"):
            compile_sql92(text)


def test_true_on_the_left_of_a_string_property_never_matches() -> None:
    assert matching("TRUE = flag", {"flag": "true"}) == [False]
    assert matching("flag = TRUE", {"flag": "TRUE"}, {"flag": "yes"}) == [True, False]
    assert matching("'x' = a", {}) == [False]  # a literal on the left: FALSE for a missing property
    assert matching("NOT ('x' = a)", {}) == [True]


def test_contains_startswith_endswith_and_rocketmq_spellings() -> None:
    m = {"s": "hello world"}
    assert matching("s CONTAINS 'lo w'", m, {}) == [True, False]
    assert matching("s NOT CONTAINS 'xyz'", m, {}) == [True, False]  # missing: FALSE, not unknown
    assert matching("s STARTSWITH 'hell'", m) == [True]
    assert matching("s NOT STARTSWITH 'hell'", m) == [False]
    assert matching("s ENDSWITH 'rld' AND s NOT ENDSWITH 'x'", m) == [True]
    assert matching("s CONTAINS ''", m) == [False]
    assert matching("NOT (s CONTAINS 'q')", {}) == [True]
    assert matching("-- a comment\n s = 'hello world' /* another */", m) == [True]
    assert matching("$s_1 = 'x'", {"$s_1": "x"}) == [True]
    assert matching("s IS NOT NULL and S IS NULL", m) == [True]


def test_an_empty_value_is_missing() -> None:
    """RocketMQ's broker drops a property with an empty value when it decodes a message."""
    assert matching("e IS NULL", {"e": ""}) == [True]
    assert matching("e = ''", {"e": ""}) == [False]
    assert matching("e NOT IN ('x')", {"e": ""}) == [False]


@pytest.mark.parametrize("text,column,words", [
    ("a > '5'", 5, "numbers"), ("a BETWEEN '1' AND '9'", 11, "numbers"), ("a > TRUE", 5, "numbers"),
    ("a = NULL", 5, "IS NULL"), ("a BETWEEN 10 AND 1", 11, "BETWEEN high AND low"),
    ("5 IN ('x')", 1, "property name before IN"), ("a != 1", 3, "'<>'"),
    ("a > 0.0", 5, "4.9E-324"), ("a > 1e400", 5, "double"), ("a = 9223372036854775808", 5, "long"),
    ("a.b = 1", 2, "names are"), ("TRUE = 'x'", 8, "flag = TRUE"), ("5", 1, "condition"),
    ("a = 1 OR 5", 10, "condition"), ("a NOT LIKE 'x'", 7, "CONTAINS"),
    ("a IN ('x', 7)", 12, "strings only"), ("a NOT IN (TRUE)", 11, "strings only"),
])
def test_what_rocketmq_refuses_is_refused(text: str, column: int, words: str) -> None:
    with pytest.raises(SQL92SyntaxError) as info:
        compile_sql92(text)
    assert info.value.position == column and words in str(info.value), str(info.value)


# -- generated expressions: render an AST, parse it, compare with a reference evaluator --

def gen(rnd: random.Random, depth: int) -> tuple[Any, ...]:
    if depth <= 0 or rnd.random() < 0.3:
        kind = rnd.choice(["cmp", "cmp", "isnull", "between", "in", "bool"])
        prop = rnd.choice(PROPS)
        if kind == "cmp":
            op = rnd.choice(["=", "<>", ">", ">=", "<", "<="])
            lit = rnd.choice([rnd.randint(-3, 3), f"'{rnd.choice('xyz')}'"]) if op in ("=", "<>") \
                else rnd.randint(-3, 3)
            return ("cmp", prop, op, lit)
        if kind == "isnull":
            return ("isnull", prop, rnd.random() < 0.5)
        if kind == "between":
            lo = rnd.randint(-3, 2)
            return ("between", prop, lo, lo + rnd.randint(0, 3), rnd.random() < 0.5)
        if kind == "in":
            return ("in", prop, [f"'{v}'" for v in rnd.sample("xyz", rnd.randint(1, 3))], rnd.random() < 0.5)
        return ("bool", rnd.random() < 0.5)
    kind = rnd.choice(["and", "or", "not"])
    if kind == "not":
        return ("not", gen(rnd, depth - 1))
    return (kind, gen(rnd, depth - 1), gen(rnd, depth - 1))


PREC = {"or": 1, "and": 2, "not": 3}


def render(node: tuple[Any, ...], rnd: random.Random) -> str:
    def kw(word: str) -> str:
        return rnd.choice([word, word.lower(), word.capitalize()])

    kind = node[0]
    if kind == "cmp":
        return f"{node[1]} {node[2]} {node[3]}"
    if kind == "isnull":
        return f"{node[1]} {kw('IS')} {kw('NOT') + ' ' if node[2] else ''}{kw('NULL')}"
    if kind == "between":
        neg = kw("NOT") + " " if node[4] else ""
        return f"{node[1]} {neg}{kw('BETWEEN')} {node[2]} {kw('AND')} {node[3]}"
    if kind == "in":
        return f"{node[1]} {kw('NOT') + ' ' if node[3] else ''}{kw('IN')} ({', '.join(node[2])})"
    if kind == "bool":
        return kw("TRUE" if node[1] else "FALSE")

    def child(c: tuple[Any, ...], parent: int) -> str:
        text = render(c, rnd)
        needs = c[0] in PREC and PREC[c[0]] < parent
        return f"({text})" if needs or (c[0] in PREC and rnd.random() < 0.2) else text

    if kind == "not":  # NOT binds tighter than a comparison: parenthesise all but NOT and TRUE/FALSE
        inner = render(node[1], rnd)
        return f"{kw('NOT')} {inner if node[1][0] in ('not', 'bool') else f'({inner})'}"
    # left-associative: a right child of the same operator needs parentheses to keep the tree
    left = child(node[1], PREC[kind])
    right = render(node[2], rnd)
    if node[2][0] in PREC and PREC[node[2][0]] <= PREC[kind] and node[2][0] != "not":
        right = f"({right})"
    return f"{left} {kw(kind.upper())} {right}"


class EvalError(Exception):
    """RocketMQ's evaluation throws: the message is not delivered."""


def integer(v: str) -> int:
    """Integer.valueOf"""
    if re.fullmatch(r"[+-]?[0-9]+", v) and -(2**31) <= int(v) < 2**31:
        return int(v)
    raise EvalError(v)


def ref(node: tuple[Any, ...], p: dict[str, str]) -> bool | None:
    """RocketMQ's answer: left to right, AND / OR stop early, an error ends it (raises EvalError)."""
    kind = node[0]
    if kind == "bool":
        return bool(node[1])
    if kind == "not":
        r = ref(node[1], p)
        return None if r is None else not r
    if kind in ("and", "or"):
        stop = kind == "or"
        a = ref(node[1], p)
        if a is stop:
            return stop
        b = ref(node[2], p)
        if b is stop:
            return stop
        return None if None in (a, b) else not stop
    v = p.get(node[1]) or None
    if kind == "isnull":
        return (v is not None) if node[2] else (v is None)
    if v is None:
        return None
    if kind == "cmp":
        op, lit = node[2], node[3]
        if isinstance(lit, str):
            eq = v == lit.strip("'")
        else:
            n = integer(v)
            if op in ("=", "<>"):
                eq = n == lit
            else:
                return bool({">": n > lit, ">=": n >= lit, "<": n < lit, "<=": n <= lit}[op])
        return eq if op == "=" else not eq
    if kind == "between":
        n = integer(v)
        inside = node[2] <= n <= node[3]
        return not inside if node[4] else inside
    inside = v in [x.strip("'") for x in node[2]]
    return not inside if node[3] else inside


def delivered(tree: tuple[Any, ...], p: dict[str, str]) -> bool:
    try:
        return ref(tree, p) is True
    except EvalError:
        return False


def test_generated_expressions_parse_and_evaluate_like_the_reference() -> None:
    rnd = random.Random(20261122)
    values = [None, "-2", "0", "1", "3", "x", "y", "z", "1.5", "", " 1", "+3"]
    for _ in range(600):
        tree = gen(rnd, 4)
        text = render(tree, rnd)
        compiled = compile_sql92(text)
        for _ in range(8):
            props = {k: v for k in PROPS if (v := rnd.choice(values)) is not None}
            assert compiled.matches(props) is delivered(tree, props), (text, props)


def test_broker_filters_by_sql92_when_enabled(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b", ["--enable-property-filter"]) as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("sql", queues=1)
        Producer(ep).send_batch([
            Message("sql", f"m{i}", properties={"amount": str(i), "region": "eu" if i % 2 else "us"})
            for i in range(100)
        ])
        consumer = PullConsumer(ep, "g")
        mq = consumer.queues("sql")[0]
        r = consumer.pull(mq, 0, 1000, subscription="amount >= 90 AND region = 'eu'", expression_type="SQL92")
        assert [m.body for m in r.messages] == [b"m91", b"m93", b"m95", b"m97", b"m99"]
        assert r.next_begin_offset == 100
        first = consumer.pull(mq, 0, 2, subscription="region IN ('eu')", expression_type="SQL92")
        assert [m.body for m in first.messages] == [b"m1", b"m3"] and first.next_begin_offset == 4
        with pytest.raises(SubscriptionParseError, match="column 9"):
            consumer.pull(mq, 0, 10, subscription="amount >", expression_type="SQL92")


def test_sql92_is_refused_when_the_broker_has_it_off(endpoint: str) -> None:
    Admin(endpoint).create_topic("nosql", queues=1)
    consumer = PullConsumer(endpoint, "g")
    with pytest.raises(NoPermissionError, match="--enable-property-filter"):
        consumer.pull(consumer.queues("nosql")[0], 0, 10, subscription="a = 1", expression_type="SQL92")


def test_spark_source_reads_with_a_sql92_subscription(spark: Any, tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b", ["--enable-property-filter"]) as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("orders", queues=2)
        Producer(ep).send_batch([
            Message("orders", f"o{i}", properties={"amount": str(i * 10)}) for i in range(20)
        ])

        def read(expr: str) -> Any:
            return (spark.read.format("pymq").option("endpoint", ep).option("topic", "orders")
                    .option("subscriptionType", "SQL92").option("subscription", expr).load())

        rows = read("amount BETWEEN 50 AND 80").select("body").collect()
        assert sorted(r["body"] for r in rows) == [b"o5", b"o6", b"o7", b"o8"]
        expected = "subscription='amount >' is not valid: SQL92 syntax error at column 9"
        with pytest.raises(Exception, match=expected):
            read("amount >").collect()


def test_the_brokers_check_a_subscription_before_a_consumer_starts(endpoint: str, tmp_path: Path) -> None:
    """CHECK_CLIENT_CONFIG, as RocketMQ's consumers ask at start: SQL92 on a broker without the
    property filter is refused naming the setting, a TAG expression always passes."""
    from pyspark_pymq.backend import BackendConfig, open_backend

    Admin(endpoint).create_topic("checked", queues=2)
    backend = open_backend(BackendConfig(endpoint=endpoint))
    queues = backend.route("checked").subscribe_queues
    backend.check_client_config("g", queues, "TagA || TagB", "TAG")
    with pytest.raises(NoPermissionError, match="--enable-property-filter"):
        backend.check_client_config("g", queues, "a = 1", "SQL92")
    with BrokerProcess(tmp_path / "b", ["--enable-property-filter"]) as broker:
        Admin(broker.endpoint).create_topic("checked", queues=1)
        on = open_backend(BackendConfig(endpoint=broker.endpoint))
        on_queues = on.route("checked").subscribe_queues
        on.check_client_config("g", on_queues, "a = 1", "SQL92")
        with pytest.raises(SubscriptionParseError, match="column 4"):
            on.check_client_config("g", on_queues, "a >", "SQL92")


def test_spark_sql92_on_a_broker_without_property_filter_fails_before_any_task(
    spark: Any, endpoint: str, tmp_path: Path
) -> None:
    """It failed in every task's first pull (a stage failure per micro-batch); now at the start,
    naming the options."""
    Admin(endpoint).create_topic("sql-off", queues=2)
    Producer(endpoint).send(Message("sql-off", b"x", properties={"a": "1"}))
    expected = r"subscriptionType='SQL92', subscription='a = 1'.*--enable-property-filter"

    def reader(kind: Any) -> Any:
        return (kind.format("pymq").option("endpoint", endpoint).option("topic", "sql-off")
                .option("subscriptionType", "SQL92").option("subscription", "a = 1"))

    with pytest.raises(Exception, match=expected) as batch:
        reader(spark.read).load().collect()
    assert "stage failure" not in str(batch.value)
    query = (reader(spark.readStream).option("consumerGroup", "g-sql-off").load().writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        with pytest.raises(Exception, match=expected) as stream:
            query.awaitTermination(60)
        assert "stage failure" not in str(stream.value)
    finally:
        query.stop()
