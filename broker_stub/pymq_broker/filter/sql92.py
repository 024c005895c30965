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

Every pull of a SQL92 subscription evaluates it on the broker's event loop, so its
cost is bounded (issue 17): at most :data:`MAX_EXPRESSION_LENGTH` characters,
:data:`MAX_DEPTH` levels of parentheses and NOT, :data:`MAX_COMPARISONS`
comparisons; AND / OR chains are evaluated in a loop (no recursion per term) and
``IN`` is one set look-up whatever the length of its list.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["MAX_COMPARISONS", "MAX_DEPTH", "MAX_EXPRESSION_LENGTH", "Expression", "SQL92SyntaxError",
           "compile_sql92"]

MAX_EXPRESSION_LENGTH = 65536  # characters: room for an IN list of thousands of values
MAX_DEPTH = 64  # nested parentheses and NOTs: the parser and evaluator recurse once per level
MAX_COMPARISONS = 512  # each is evaluated per message a pull scans
_CONTEXT = 40  # characters of the expression shown on each side of an error's column

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
        start = max(0, position - 1 - _CONTEXT)  # a long expression: only the part around the column
        shown = expression[start : position - 1 + _CONTEXT]
        pointer = " " * (position - 1 - start) + "^"
        super().__init__(
            f"SQL92 syntax error at column {position}: expected {expected}\n  {shown}\n  {pointer}"
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


def _all_of(terms: list[Eval]) -> Eval:
    """``t1 AND t2 AND ...`` evaluated in a loop: a long chain costs no recursion."""

    def evaluate(p: Props) -> bool | None:
        result: bool | None = True
        for term in terms:
            value = term(p)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return evaluate


def _any_of(terms: list[Eval]) -> Eval:
    """``t1 OR t2 OR ...`` evaluated in a loop."""

    def evaluate(p: Props) -> bool | None:
        result: bool | None = False
        for term in terms:
            value = term(p)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return evaluate


def _in_list(left: Operand, values: list[Value]) -> Eval:
    """``left IN (values)``: what OR-ing ``left = v`` over the values gives, by set look-ups.

    A string property equals a string value as is, a number value as a number (a
    property that is no number makes those comparisons unknown), TRUE/FALSE as
    'true'/other text. Other operands (a number or boolean literal on the left) take
    the comparisons one by one, as they are rare.
    """
    strings = frozenset(v for v in values if isinstance(v, str))
    numbers = frozenset(v for v in values if isinstance(v, float))
    booleans = frozenset(v for v in values if isinstance(v, bool))

    def inside(p: Props) -> bool | None:
        v = left(p)
        if v is None:
            return None
        if not isinstance(v, str):
            result: bool | None = False
            for item in values:
                result = _or(result, _compare("=", v, item))
            return result
        if v in strings:
            return True
        if booleans and (v.lower() == "true") in booleans:
            return True
        if numbers:
            number = _num(v)
            if number is None:
                return None
            if number in numbers:
                return True
        return False

    return inside


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = 0
        self.comparisons = 0

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
        terms = [self.parse_and()]
        while self.accept("kw", "OR"):
            terms.append(self.parse_and())
        return terms[0] if len(terms) == 1 else _any_of(terms)

    def parse_and(self) -> Eval:
        terms = [self.parse_not()]
        while self.accept("kw", "AND"):
            terms.append(self.parse_not())
        return terms[0] if len(terms) == 1 else _all_of(terms)

    def deeper(self) -> None:
        """One more level of parentheses or NOT, refused past :data:`MAX_DEPTH`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SQL92SyntaxError(
                self.text, self.toks[self.i - 1].pos,
                f"at most {MAX_DEPTH} levels of nested parentheses and NOT; write the filter flatter",
            )

    def parse_not(self) -> Eval:
        if self.accept("kw", "NOT"):
            self.deeper()
            inner = self.parse_not()
            self.depth -= 1
            return lambda p: _not(inner(p))
        return self.parse_primary()

    def parse_primary(self) -> Eval:
        if self.accept("op", "("):
            self.deeper()
            inner = self.parse_or()
            self.expect("op", ")", "')'")
            self.depth -= 1
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
        self.comparisons += 1
        if self.comparisons > MAX_COMPARISONS:
            raise SQL92SyntaxError(
                self.text, self.tok.pos,
                f"at most {MAX_COMPARISONS} comparisons (each is evaluated for every message a pull "
                "scans); use IN (...) for a list of values",
            )
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

            inside = _in_list(left, values)

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
    """Parse ``text``; SQL92SyntaxError (a ValueError) names the column of the mistake.

    ValueError for an expression over the bounds (:data:`MAX_EXPRESSION_LENGTH`,
    :data:`MAX_DEPTH`, :data:`MAX_COMPARISONS`). Compiled once per text: a
    consumer sends the same subscription with every pull.
    """
    if not isinstance(text, str):
        raise TypeError(f"a SQL92 expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ValueError(
            f"SQL92 expression of {len(text)} characters is over the limit of {MAX_EXPRESSION_LENGTH} "
            "characters; filter on fewer values (or tag the messages and subscribe by tag)"
        )
    return _compile(text)


@functools.lru_cache(maxsize=64)
def _compile(text: str) -> Expression:
    return Expression(text, _Parser(text).parse())
