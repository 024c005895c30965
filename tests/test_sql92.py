"""SQL92 property filters: the parser (with generated expressions) and the broker end to end."""

from __future__ import annotations

import random
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
        "c > 1": False, "NOT c > 1": False,  # unknown stays unknown under NOT
        "c > 1 OR a > 1": True, "c > 1 AND a > 1": False, "b > 1": False,  # not a number
        "a > 5 AND b = 'x' OR c = 'z'": True, "NOT (a > 5 AND b = 'y')": True,
        "b = 'it''s'": False,
    }
    for text, want in cases.items():
        assert compile_sql92(text).matches(m) is want, text


@pytest.mark.parametrize("text,column", [
    ("a >", 4), ("a > 5 AND", 10), ("(a = 1", 7), ("a BETWEEN 1 OR 2", 13), ("a IN (1,", 9),
    ("a = 'x", 5), ("", 1), ("a = 1 b = 2", 7), ("a ~ 1", 3),
])
def test_syntax_errors_point_at_the_column(text: str, column: int) -> None:
    with pytest.raises(SQL92SyntaxError) as info:
        compile_sql92(text)
    assert info.value.position == column
    assert f"column {column}" in str(info.value) and "expected" in str(info.value)


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

    if kind == "not":
        return f"{kw('NOT')} {child(node[1], PREC['not'] + 1 if node[1][0] != 'not' else 3)}"
    # left-associative: a right child of the same operator needs parentheses to keep the tree
    left = child(node[1], PREC[kind])
    right = render(node[2], rnd)
    if node[2][0] in PREC and PREC[node[2][0]] <= PREC[kind] and node[2][0] != "not":
        right = f"({right})"
    return f"{left} {kw(kind.upper())} {right}"


def num(v: str | None) -> float | None:
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


def ref(node: tuple[Any, ...], p: dict[str, str]) -> bool | None:
    kind = node[0]
    if kind == "bool":
        return bool(node[1])
    if kind == "not":
        r = ref(node[1], p)
        return None if r is None else not r
    if kind in ("and", "or"):
        a, b = ref(node[1], p), ref(node[2], p)
        if kind == "and":
            return False if False in (a, b) else (None if None in (a, b) else True)
        return True if True in (a, b) else (None if None in (a, b) else False)
    v = p.get(node[1])
    if kind == "isnull":
        return (v is not None) if node[2] else (v is None)
    if v is None:
        return None
    if kind == "cmp":
        op, lit = node[2], node[3]
        if isinstance(lit, str):
            eq = v == lit.strip("'")
        else:
            n = num(v)
            if n is None:
                return None
            if op in ("=", "<>"):
                eq = n == lit
            else:
                return {">": n > lit, ">=": n >= lit, "<": n < lit, "<=": n <= lit}[op]
        return eq if op == "=" else not eq
    if kind == "between":
        n = num(v)
        if n is None:
            return None
        inside = node[2] <= n <= node[3]
        return not inside if node[4] else inside
    inside = v in [x.strip("'") for x in node[2]]
    return not inside if node[3] else inside


def test_generated_expressions_parse_and_evaluate_like_the_reference() -> None:
    rnd = random.Random(20261122)
    values = [None, "-2", "0", "1", "3", "x", "y", "z", "1.5"]
    for _ in range(600):
        tree = gen(rnd, 4)
        text = render(tree, rnd)
        compiled = compile_sql92(text)
        for _ in range(8):
            props = {k: v for k in PROPS if (v := rnd.choice(values)) is not None}
            assert compiled.matches(props) is (ref(tree, props) is True), (text, props)


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
