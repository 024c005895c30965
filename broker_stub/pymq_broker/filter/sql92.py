"""RocketMQ's SQL92 property filter: a small hand-written parser and evaluator.

The grammar is RocketMQ's subset::

    expr       := or
    or         := and ( OR and )*
    and        := not ( AND not )*
    not        := NOT not | primary
    primary    := '(' expr ')' | TRUE | FALSE | comparison
    comparison := operand ( op operand
                          | IS [NOT] NULL
                          | [NOT] BETWEEN operand AND operand
                          | [NOT] IN '(' literal ( ',' literal )* ')' )
    op         := = | <> | != | > | >= | < | <=
    operand    := identifier | number | 'string' | TRUE | FALSE | NULL

Properties are strings; compared with a number they are read as numbers
(a value that is not a number makes the comparison unknown). Logic is SQL's
three-valued one: a missing property makes a comparison unknown, and a
message matches only when the whole expression is TRUE. Keywords are
case-insensitive. A syntax error raises :class:`SQL92SyntaxError` with the
position (1-based column) and what was expected there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Expression", "SQL92SyntaxError", "compile_sql92"]

Value = float | str | bool | None
Props = Mapping[str, str]
Eval = Callable[[Props], "bool | None"]
Operand = Callable[[Props], Value]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"|(?P<str>'(?:[^']|'')*')"
    r"|(?P<op><>|!=|>=|<=|=|>|<|\(|\)|,)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_.\-]*))"
)
_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "TRUE", "FALSE", "BETWEEN", "IN"}


class SQL92SyntaxError(ValueError):
    """A syntax error at ``position`` (1-based column) of ``expression``."""

    def __init__(self, expression: str, position: int, expected: str) -> None:
        pointer = " " * (position - 1) + "^"
        super().__init__(
            f"SQL92 syntax error at column {position}: expected {expected}\n  {expression}\n  {pointer}"
        )
        self.expression = expression
        self.position = position


@dataclass(frozen=True)
class _Tok:
    kind: str  # num, str, op, word, kw, end
    text: str
    pos: int  # 1-based column


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        m = _TOKEN.match(text, i)
        if not m or m.end() == i:
            raise SQL92SyntaxError(text, i + 1, f"a value, a property name or an operator, not {text[i]!r}")
        kind = m.lastgroup or ""
        start = m.start(kind)
        value = m.group(kind)
        if kind == "word" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        toks.append(_Tok(kind, value, start + 1))
        i = m.end()
    toks.append(_Tok("end", "", len(text) + 1))
    return toks


def _num(v: Value) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, float):
        return v
    try:
        return float(v)
    except ValueError:
        return None


def _compare(op: str, a: Value, b: Value) -> bool | None:
    if a is None or b is None:
        return None
    if op in ("=", "<>", "!="):
        if isinstance(a, bool) or isinstance(b, bool):
            la = a if isinstance(a, bool) else (str(a).lower() == "true" if isinstance(a, str) else None)
            lb = b if isinstance(b, bool) else (str(b).lower() == "true" if isinstance(b, str) else None)
            if la is None or lb is None:
                return None
            eq = la == lb
        elif isinstance(a, float) or isinstance(b, float):
            na, nb = _num(a), _num(b)
            if na is None or nb is None:
                return None
            eq = na == nb
        else:
            eq = a == b
        return eq if op == "=" else not eq
    na, nb = _num(a), _num(b)
    if na is None or nb is None:
        return None
    if op == ">":
        return na > nb
    if op == ">=":
        return na >= nb
    if op == "<":
        return na < nb
    return na <= nb


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def accept(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        if t.kind == kind and (text is None or t.text == text):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, text: str, what: str) -> None:
        if not self.accept(kind, text):
            self.fail(what)

    def fail(self, expected: str) -> None:
        t = self.tok
        found = "the end of the expression" if t.kind == "end" else repr(t.text)
        raise SQL92SyntaxError(self.text, t.pos, f"{expected}, found {found}")

    def parse(self) -> Eval:
        if self.tok.kind == "end":
            self.fail("an expression")
        e = self.parse_or()
        if self.tok.kind != "end":
            self.fail("AND, OR or the end of the expression")
        return e

    def parse_or(self) -> Eval:
        left = self.parse_and()
        while self.accept("kw", "OR"):
            right = self.parse_and()
            left = (lambda a, b: lambda p: _or(a(p), b(p)))(left, right)
        return left

    def parse_and(self) -> Eval:
        left = self.parse_not()
        while self.accept("kw", "AND"):
            right = self.parse_not()
            left = (lambda a, b: lambda p: _and(a(p), b(p)))(left, right)
        return left

    def parse_not(self) -> Eval:
        if self.accept("kw", "NOT"):
            inner = self.parse_not()
            return lambda p: _not(inner(p))
        return self.parse_primary()

    def parse_primary(self) -> Eval:
        if self.accept("op", "("):
            inner = self.parse_or()
            self.expect("op", ")", "')'")
            return inner
        t = self.tok
        if t.kind == "kw" and t.text in ("TRUE", "FALSE"):
            nxt = self.toks[self.i + 1]
            if not (nxt.kind == "op" and nxt.text in ("=", "<>", "!=", ">", ">=", "<", "<=")) and not (
                nxt.kind == "kw" and nxt.text in ("IS", "BETWEEN", "IN", "NOT")
            ):
                self.take()
                value = t.text == "TRUE"
                return lambda p: value
        return self.parse_comparison()

    def parse_operand(self) -> Operand:
        t = self.tok
        if t.kind == "word":
            self.take()
            name = t.text
            return lambda p: p.get(name)
        if t.kind == "num":
            self.take()
            n = float(t.text)
            return lambda p: n
        if t.kind == "str":
            self.take()
            s = t.text[1:-1].replace("''", "'")
            return lambda p: s
        if t.kind == "kw" and t.text in ("TRUE", "FALSE"):
            self.take()
            b = t.text == "TRUE"
            return lambda p: b
        if t.kind == "kw" and t.text == "NULL":
            self.take()
            return lambda p: None
        self.fail("a property name, a number, a 'string', TRUE, FALSE or NULL")
        raise AssertionError

    def parse_literal(self) -> Value:
        t = self.tok
        if t.kind in ("num", "str") or (t.kind == "kw" and t.text in ("TRUE", "FALSE")):
            return self.parse_operand()({})
        self.fail("a number, a 'string', TRUE or FALSE")
        raise AssertionError

    def parse_comparison(self) -> Eval:
        left = self.parse_operand()
        t = self.tok
        if t.kind == "op" and t.text in ("=", "<>", "!=", ">", ">=", "<", "<="):
            self.take()
            right = self.parse_operand()
            op = t.text
            return lambda p: _compare(op, left(p), right(p))
        if self.accept("kw", "IS"):
            negate = self.accept("kw", "NOT")
            self.expect("kw", "NULL", "NULL")
            return (lambda p: left(p) is not None) if negate else (lambda p: left(p) is None)
        negate = self.accept("kw", "NOT")
        if self.accept("kw", "BETWEEN"):
            low = self.parse_operand()
            self.expect("kw", "AND", "AND")
            high = self.parse_operand()

            def between(p: Props) -> bool | None:
                v = left(p)
                return _and(_compare(">=", v, low(p)), _compare("<=", v, high(p)))

            return (lambda p: _not(between(p))) if negate else between
        if self.accept("kw", "IN"):
            self.expect("op", "(", "'(' after IN")
            values = [self.parse_literal()]
            while self.accept("op", ","):
                values.append(self.parse_literal())
            self.expect("op", ")", "',' or ')'")

            def inside(p: Props) -> bool | None:
                v = left(p)
                result: bool | None = False
                for item in values:
                    result = _or(result, _compare("=", v, item))
                return result

            return (lambda p: _not(inside(p))) if negate else inside
        self.fail("a comparison (=, <>, >, >=, <, <=, IS [NOT] NULL, BETWEEN, IN)")
        raise AssertionError


@dataclass(frozen=True)
class Expression:
    """A compiled SQL92 filter: ``expression.matches(properties)``."""

    text: str
    evaluate: Eval

    def matches(self, properties: Props) -> bool:
        return self.evaluate(properties) is True


def compile_sql92(text: str) -> Expression:
    """Parse ``text``; SQL92SyntaxError (a ValueError) names the column of the mistake."""
    if not isinstance(text, str):
        raise TypeError(f"a SQL92 expression must be a string, got {type(text).__name__}")
    return Expression(text, _Parser(text).parse())
