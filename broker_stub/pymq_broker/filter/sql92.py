"""RocketMQ's SQL92 property filter: a small hand-written parser and evaluator.

It answers as Apache RocketMQ 5.3.3's filter does (org.apache.rocketmq.filter: SelectorParser.jj,
ComparisonExpression, LogicExpression, UnaryExpression, ConstantExpression, and the broker's
ExpressionMessageFilter). The grammar, loosest binding first::

    or         := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := comparison ( = comparison | <> comparison | IS [NOT] NULL )*
    comparison := unary ( (> | >= | < | <=) unary
                        | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) 'string'
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' 'string' ( ',' 'string' )* ')' )*
    unary      := + unary | - unary | NOT unary | primary
    primary    := 'string' | integer | decimal | TRUE | FALSE | NULL | name | '(' or ')'

So NOT binds tighter than a comparison (``NOT a = 'x'`` is ``(NOT a) = 'x'``; write
``NOT (a = 'x')``), and a bare property used as a condition is FALSE (NULL when missing). Names are
``[A-Za-z_$][A-Za-z0-9_$]*`` and case-sensitive; keywords are case-insensitive; ``--`` (to the end of
the line) and ``/* */`` are comments; ``<>`` is not-equal (there is no ``!=``).

Values have Java's types. A whole number is an Integer (a Long past its range, or with an ``L``
suffix); a decimal is a Double (0.0 and numbers past Double's range are refused). A property is a
string: compared with an Integer it is read by ``Integer.valueOf``, with a Long by
``Long.valueOf``, with a Double by ``Double.valueOf`` (which allows surrounding blanks, ``NaN``,
``Infinity`` and an ``f``/``d`` suffix; NaN sorts above every number), with TRUE/FALSE as
``'true'`` (any case) or not; ``>`` between two properties reads both as Doubles. A value that does
not read so is an *evaluation error*, which ends the whole evaluation: RocketMQ's broker logs it
and does not deliver the message, so ``price > 100`` never delivers ``price = '199.99'`` (write
``price > 100.0``). AND and OR evaluate left to right and stop at the first FALSE / TRUE, so
``b = 'x' OR a > 5`` delivers ``{a: 'abc', b: 'x'}`` and ``a > 5 OR b = 'x'`` does not.

Logic is SQL's three-valued one: a missing property makes a comparison NULL (unknown) and a
message matches only when the whole expression is TRUE; except that CONTAINS / STARTSWITH /
ENDSWITH and their NOT forms are FALSE for a missing property (and for an empty search string),
and ``'x' = a`` (a literal on the left) is FALSE for a missing ``a``. A property whose value is
empty is missing, as RocketMQ's broker drops such properties when it decodes a message.

Expressions RocketMQ refuses when it compiles them raise :class:`SQL92SyntaxError` with the column
and what RocketMQ accepts there: a string, TRUE, FALSE or NULL beside ``>`` ``>=`` ``<`` ``<=``
or in BETWEEN, ``= NULL`` (write IS NULL), ``TRUE = 'x'``, ``BETWEEN 10 AND 1``, IN on something
that is not a property, a condition where a value belongs (``NOT a > 1``) and the reverse. RocketMQ
also ignores what follows a complete expression (``a = 1 b = 2`` filters on ``a = 1``); pymq
refuses it, as it is surely a mistake.

Every pull of a SQL92 subscription evaluates it on the broker's event loop, so its
cost is bounded (issue 17): at most :data:`MAX_EXPRESSION_LENGTH` characters,
:data:`MAX_DEPTH` levels of parentheses, NOT and signs, :data:`MAX_COMPARISONS`
comparisons; AND / OR chains are evaluated in a loop (no recursion per term) and
``IN`` is one set look-up whatever the length of its list.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_COMPARISONS", "MAX_DEPTH", "MAX_EXPRESSION_LENGTH", "Expression", "SQL92SyntaxError",
           "compile_sql92"]

MAX_EXPRESSION_LENGTH = 65536  # characters: room for an IN list of thousands of values
MAX_DEPTH = 64  # nested parentheses, NOTs and signs: the parser and evaluator recurse once per level
MAX_COMPARISONS = 512  # each is evaluated per message a pull scans
_MAX_HEIGHT = 2 * MAX_DEPTH  # levels of the evaluated tree (chained comparisons add levels too)
_CONTEXT = 40  # characters of the expression shown on each side of an error's column

Props = Mapping[str, str]
Eval = Callable[[Props], Any]  # a value of Java's types: str, bool, _Int, _Long, float or None

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DOUBLE_MIN = 5e-324  # Double.MIN_VALUE

# RocketMQ's tokens (SelectorParser.jj). Blanks are only these five characters.
_BLANKS = " \t\n\r\f"
_TOKEN = re.compile(
    r"(?P<comment>--[^\n\r]*(?:\r\n|\n|\r)|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/)"
    r"|(?P<float>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
    r"|(?P<int>0|[1-9][0-9]*[lL]?)"
    r"|(?P<str>'(?:[^']|'')*')"
    r"|(?P<op><>|>=|<=|=|>|<|\(|\)|,|\+|-)"
    r"|(?P<word>[A-Za-z_$][A-Za-z0-9_$]*)"
)
_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "TRUE", "FALSE", "BETWEEN", "IN", "CONTAINS", "STARTSWITH",
             "ENDSWITH"}
_RELATIONAL: dict[str, Callable[[int, int], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}
_TEXT_TESTS = ("CONTAINS", "STARTSWITH", "ENDSWITH")


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


class _EvalError(Exception):
    """What makes RocketMQ's evaluation throw (a NumberFormatException, a ClassCastException): its
    broker logs it and does not deliver the message."""


class _Int(int):
    """A java.lang.Integer (a whole-number literal within its range)."""


class _Long(int):
    """A java.lang.Long (a whole-number literal past Integer's range, or with an L)."""


# -- Java's conversions of a property's text --------------------------------------------------------

def _java_int(text: str, low: int, high: int) -> int:
    """``Integer.valueOf`` / ``Long.valueOf``: an optional sign and decimal digits, nothing else."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isdecimal() and len(digits) <= 20:
        number = int(text)
        if low <= number <= high:
            return number
    raise _EvalError(f"not a {'n Integer' if high == _INT_MAX else ' Long'}: {text!r}")


def _java_integer(text: str) -> int:
    return _java_int(text, _INT_MIN, _INT_MAX)


def _java_long(text: str) -> int:
    return _java_int(text, _LONG_MIN, _LONG_MAX)


_JAVA_TRIM = "".join(chr(c) for c in range(33))  # String.trim(): every character up to U+0020
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?"
    r"|0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?)"
)


def _java_double(text: str) -> float:
    """``Double.valueOf``: Java's syntax (blanks around, NaN, Infinity, f/d suffix, hex), not Python's."""
    if text.isascii() and text.replace(".", "", 1).isdigit():  # the common case: 12, 12.5, .5, 12.
        return float(text)
    t = text.strip(_JAVA_TRIM)
    if not _JAVA_DOUBLE.fullmatch(t):
        raise _EvalError(f"not a Double: {text!r}")
    if t[-1] in "fFdD":
        t = t[:-1]
    if "x" in t or "X" in t:
        try:
            return float.fromhex(t)
        except OverflowError:
            return -math.inf if t[0] == "-" else math.inf
    return float(t)


def _dcmp(a: float, b: float) -> int:
    """``Double.compare``: -0.0 below 0.0, NaN above everything and equal to itself."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:
            sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
            return (sa > sb) - (sa < sb)
        return 0
    an, bn = a != a, b != b
    return (an > bn) - (an < bn)


def _icmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _jcompare(lv: Any, rv: Any) -> int:
    """ComparisonExpression.__compare (convertStringExpressions on): both values are not None."""
    lc, rc = type(lv), type(rv)
    if lc is rc:
        if lc is float:
            return _dcmp(lv, rv)
        return int((lv > rv) - (lv < rv))
    if lc is bool:
        if rc is str:  # Boolean.valueOf((String) lv): a ClassCastException
            raise _EvalError("TRUE/FALSE on the left of a string")
        return -1
    if lc is _Int or lc is _Long:
        if rc is _Int or rc is _Long:
            return _icmp(lv, rv)
        if rc is float:
            return _dcmp(float(lv), rv)
        if rc is str:
            return _icmp(lv, _java_integer(rv) if lc is _Int else _java_long(rv))
        return -1
    if lc is float:
        if rc is _Int or rc is _Long:
            return _dcmp(lv, float(rv))
        if rc is str:
            return _dcmp(lv, _java_double(rv))
        return -1
    if lc is str:
        if rc is bool:
            return _icmp(lv.lower() == "true", rv)
        if rc is _Int:
            return _icmp(_java_integer(lv), rv)
        if rc is _Long:
            return _icmp(_java_long(lv), rv)
        if rc is float:
            return _dcmp(_java_double(lv), rv)
    return -1


# -- the compiled tree ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Node:
    """A parsed expression: its evaluator and what RocketMQ's compile-time checks look at."""

    ev: Eval
    kind: str  # const (a literal), boolconst (TRUE/FALSE/NULL), prop, bool (a condition), value
    pos: int  # 1-based column of its first token
    value: Any = None  # a literal's value
    name: str = ""  # a property's name
    height: int = 1

    @property
    def is_const(self) -> bool:
        return self.kind in ("const", "boolconst")

    @property
    def is_condition(self) -> bool:
        return self.kind in ("bool", "boolconst")


def _property(name: str) -> Eval:
    def get(p: Props) -> str | None:
        return p.get(name) or None  # an empty value: RocketMQ's broker drops it when decoding

    return get


def _not(inner: Eval) -> Eval:
    def negation(p: Props) -> bool | None:
        v = inner(p)
        return None if v is None else not v

    return negation


def _all_of(terms: list[Eval]) -> Eval:
    """``t1 AND t2 AND ...`` evaluated in a loop, left to right, stopping at a FALSE."""

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
    """``t1 OR t2 OR ...`` evaluated in a loop, left to right, stopping at a TRUE."""

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


def _equal(left: _Node, right: _Node) -> Eval:
    """ComparisonExpression.doCreateEqual."""
    if left.kind == "prop" and right.kind in ("const", "boolconst"):
        name, c = left.name, right.value
        if type(c) is str:
            return lambda p: (v == c) if (v := p.get(name)) else None
        if type(c) is bool:
            return lambda p: ((v.lower() == "true") is c) if (v := p.get(name)) else None
        if type(c) is _Int:
            return lambda p: (_java_integer(v) == c) if (v := p.get(name)) else None
        if type(c) is _Long:
            return lambda p: (_java_long(v) == c) if (v := p.get(name)) else None
    lev, rev = left.ev, right.ev

    def equal(p: Props) -> bool | None:
        lv, rv = lev(p), rev(p)
        if lv is None or rv is None:
            return True if lv is rv else (None if lv is None else False)
        return _jcompare(lv, rv) == 0

    return equal


def _relational(op: str, left: _Node, right: _Node) -> Eval:
    """ComparisonExpression's >, >=, <, <=: operands are checked to be no literal but a number."""
    test = _RELATIONAL[op]
    if left.kind == "prop" and right.kind == "const":
        name, c = left.name, right.value
        if type(c) is _Int:
            return lambda p: test(_java_integer(v), c) if (v := p.get(name)) else None
        if type(c) is _Long:
            return lambda p: test(_java_long(v), c) if (v := p.get(name)) else None
        return lambda p: test(_dcmp(_java_double(v), c), 0) if (v := p.get(name)) else None
    lev, rev = left.ev, right.ev

    def relation(p: Props) -> bool | None:
        lv = lev(p)
        if lv is None:
            return None
        rv = rev(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            return test(_dcmp(_java_double(lv), _java_double(rv)), 0)
        return test(_jcompare(lv, rv), 0)

    return relation


def _is_null(inner: _Node, negate: bool) -> Eval:
    """IS NULL / IS NOT NULL (an empty property value is missing)."""
    if inner.kind == "prop":
        name = inner.name
        return (lambda p: bool(p.get(name))) if negate else (lambda p: not p.get(name))
    ev = inner.ev
    return (lambda p: ev(p) is not None) if negate else (lambda p: ev(p) is None)


def _text_test(kind: str, negate: bool, inner: Eval, search: str) -> Eval:
    """CONTAINS, STARTSWITH, ENDSWITH: FALSE for a missing property, a non-string, an empty search."""
    if not search:
        return lambda p: False
    if kind == "CONTAINS":
        found: Callable[[str], bool] = lambda v: search in v  # noqa: E731
    elif kind == "STARTSWITH":
        found = lambda v: v.startswith(search)  # noqa: E731
    else:
        found = lambda v: v.endswith(search)  # noqa: E731
    if negate:
        return lambda p: type(v := inner(p)) is str and not found(v)
    return lambda p: type(v := inner(p)) is str and found(v)


def _negate(inner: _Node) -> Eval:
    """UnaryExpression.createNegate: a number negated (Java's wrap-around), anything else NULL."""

    def neg(v: Any) -> Any:
        t = type(v)
        if t is _Int:
            return _Int((-v - _INT_MIN) % 2**32 + _INT_MIN)
        if t is _Long:
            return _Long((-v - _LONG_MIN) % 2**64 + _LONG_MIN)
        if t is float:
            return -v
        return None

    if inner.is_const:
        value = neg(inner.value)
        return lambda p: value
    ev = inner.ev
    return lambda p: neg(ev(p))


def _in_strings(name: str, values: list[str], negate: bool) -> Eval:
    """UnaryExpression.createInExpression: a string property in a set of strings."""
    items = frozenset(values)
    if negate:
        return lambda p: (v not in items) if (v := p.get(name)) else None
    return lambda p: (v in items) if (v := p.get(name)) else None


_NUMBER_WORDS = "a number or a property name"
_RELATIONAL_HINT = ("(RocketMQ compares only numbers with >, >=, <, <= and BETWEEN; compare text with "
                    "=, <>, IN, CONTAINS, STARTSWITH or ENDSWITH)")


@dataclass(frozen=True)
class _Tok:
    kind: str  # float, int, str, op, word, kw, end
    text: str
    pos: int  # 1-based column


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _BLANKS:
            i += 1
            continue
        m = _TOKEN.match(text, i)
        if not m:
            if text.startswith("!=", i):
                expected = "'<>' for not-equal (RocketMQ's SQL92 has no '!=')"
            elif ch == "'":
                expected = "a closing quote: the string runs to the end of the expression"
            elif text.startswith("/*", i):
                expected = "'*/': the comment runs to the end of the expression"
            else:
                expected = (f"a value, a property name or an operator, not {ch!r} (names are letters, "
                            "digits, _ and $, not starting with a digit; blanks are spaces, tabs and line "
                            "breaks)")
            raise SQL92SyntaxError(text, i + 1, expected)
        kind = m.lastgroup or ""
        value = m.group()
        i = m.end()
        if kind == "comment":
            continue
        if kind == "word" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        toks.append(_Tok(kind, value, m.start() + 1))
    toks.append(_Tok("end", "", n + 1))
    return toks


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

    def peek(self, ahead: int = 1) -> _Tok:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

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

    def refuse(self, pos: int, expected: str) -> None:
        raise SQL92SyntaxError(self.text, pos, expected)

    def node(self, ev: Eval, pos: int, *children: _Node, kind: str = "bool", count: bool = True) -> _Node:
        """A condition or value over ``children``, counted against the bounds."""
        height = 1 + max((c.height for c in children), default=0)
        if height > _MAX_HEIGHT:
            self.refuse(pos, f"at most {_MAX_HEIGHT} levels of nested conditions (parentheses, NOT, chained "
                             "comparisons); write the filter flatter")
        if kind == "bool" and count:
            self.comparisons += 1
            if self.comparisons > MAX_COMPARISONS:
                self.refuse(pos, f"at most {MAX_COMPARISONS} comparisons (each is evaluated for every "
                                 "message a pull scans); use IN (...) for a list of values")
        return _Node(ev, kind, pos, height=height)

    def deeper(self) -> None:
        """One more level of parentheses, NOT or sign, refused past :data:`MAX_DEPTH`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.refuse(self.toks[self.i - 1].pos,
                        f"at most {MAX_DEPTH} levels of nested parentheses and NOT; write the filter flatter")

    def condition(self, n: _Node, where: str) -> _Node:
        """SelectorParser.asBooleanExpression: a condition as is, a property as a boolean cast."""
        if n.is_condition:
            return n
        if n.kind == "prop":
            ev = _property(n.name)
            return self.node(lambda p: False if ev(p) is not None else None, n.pos, n)
        self.refuse(n.pos, f"a condition {where} (a comparison, TRUE, FALSE or a property name), "
                           "not a value")
        raise AssertionError

    def parse(self) -> _Node:
        if self.tok.kind == "end":
            self.fail("an expression")
        e = self.condition(self.parse_or(), "as the filter")
        if self.tok.kind != "end":
            self.fail("AND, OR or the end of the expression (RocketMQ would ignore the rest: "
                      "write it with AND or OR)")
        return e

    def parse_or(self) -> _Node:
        first = self.parse_and()
        if self.tok.kind != "kw" or self.tok.text != "OR":
            return first
        terms = [self.condition(first, "before OR")]
        while self.accept("kw", "OR"):
            terms.append(self.condition(self.parse_and(), "after OR"))
        return self.node(_any_of([t.ev for t in terms]), first.pos, *terms)

    def parse_and(self) -> _Node:
        first = self.parse_equality()
        if self.tok.kind != "kw" or self.tok.text != "AND":
            return first
        terms = [self.condition(first, "before AND")]
        while self.accept("kw", "AND"):
            terms.append(self.condition(self.parse_equality(), "after AND"))
        return self.node(_all_of([t.ev for t in terms]), first.pos, *terms)

    def check_equal_operand(self, n: _Node, op: str) -> None:
        if n.is_const and n.value is None:
            self.refuse(n.pos, f"a value beside '{op}', not NULL (write IS NULL or IS NOT NULL)")

    def parse_equality(self) -> _Node:
        left = self.parse_comparison()
        while True:
            t = self.tok
            if t.kind == "op" and t.text in ("=", "<>"):
                self.i += 1
                right = self.parse_comparison()
                self.check_equal_operand(left, t.text)
                self.check_equal_operand(right, t.text)
                if left.kind == "boolconst" and right.is_const and not right.is_condition:
                    self.refuse(right.pos, f"TRUE, FALSE or a property name after {t.text!r} (RocketMQ "
                                           "refuses comparing TRUE or FALSE with a literal; to test a "
                                           "property, write it first: flag = TRUE)")
                ev = _equal(left, right)
                eq = self.node(ev, left.pos, left, right)
                left = eq if t.text == "=" else self.node(_not(ev), left.pos, eq, count=False)
            elif t.kind == "kw" and t.text == "IS":
                self.i += 1
                negate = self.accept("kw", "NOT")
                self.expect("kw", "NULL", "NULL after IS NOT" if negate else "NULL or NOT NULL after IS")
                left = self.node(_is_null(left, negate), left.pos, left)
            else:
                return left

    def check_number_operand(self, n: _Node, op: str) -> None:
        """ComparisonExpression.checkLessThanOperand: a number literal, a property, a signed value."""
        if n.is_const:
            if type(n.value) in (_Int, _Long, float):
                return
            shown = "NULL" if n.value is None else str(n.value).upper() if type(n.value) is bool else \
                "'" + n.value.replace("'", "''") + "'"
            self.refuse(n.pos, f"{_NUMBER_WORDS} beside '{op}', not {shown} {_RELATIONAL_HINT}")
        if n.is_condition:
            self.refuse(n.pos, f"{_NUMBER_WORDS} beside '{op}', not a condition (NOT binds tighter "
                               "than comparisons: write NOT (a > 1), not NOT a > 1)")

    def relational(self, op: str, left: _Node, right: _Node, shown: str = "") -> _Node:
        self.check_number_operand(left, shown or op)
        self.check_number_operand(right, shown or op)
        return self.node(_relational(op, left, right), left.pos, left, right)

    def string_literal(self, after: str) -> str:
        t = self.tok
        if t.kind != "str":
            self.fail(f"a 'string' after {after}")
        self.i += 1
        return t.text[1:-1].replace("''", "'")

    def parse_comparison(self) -> _Node:
        left = self.parse_unary()
        while True:
            t = self.tok
            if t.kind == "op" and t.text in _RELATIONAL:
                self.i += 1
                left = self.relational(t.text, left, self.parse_unary())
                continue
            if t.kind != "kw" or t.text not in ("NOT", "BETWEEN", "IN", *_TEXT_TESTS):
                return left
            negate = t.text == "NOT"
            if negate:
                nxt = self.peek()
                if nxt.kind != "kw" or nxt.text not in ("BETWEEN", "IN", *_TEXT_TESTS):
                    self.i += 1
                    self.fail("BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT")
                self.i += 1
            word = self.tok.text
            self.i += 1
            if word in _TEXT_TESTS:
                search = self.string_literal(word)
                left = self.node(_text_test(word, negate, left.ev, search), left.pos, left)
            elif word == "BETWEEN":
                low = self.parse_unary()
                self.expect("kw", "AND", "AND")
                high = self.parse_unary()
                left = self.between(left, low, high, negate)
            else:
                left = self.in_list(left, negate)

    def between(self, value: _Node, low: _Node, high: _Node, negate: bool) -> _Node:
        if not negate and low.is_const and high.is_const:  # ComparisonExpression.createBetween
            if low.value is None or high.value is None:
                self.refuse((low if low.value is None else high).pos,
                            f"{_NUMBER_WORDS} in BETWEEN, not NULL")
            try:
                backwards = _jcompare(high.value, low.value) < 0
            except _EvalError:
                backwards = False  # refused below: the bounds are not both numbers
            if backwards:
                self.refuse(low.pos, f"BETWEEN's low value first: {low.value} is above {high.value} "
                                     "(RocketMQ refuses BETWEEN high AND low)")
        if negate:  # createNotBetween: value < low OR value > high
            terms = [self.relational("<", value, low, "NOT BETWEEN"),
                     self.relational(">", value, high, "NOT BETWEEN")]
            return self.node(_any_of([t.ev for t in terms]), value.pos, *terms, count=False)
        terms = [self.relational(">=", value, low, "BETWEEN"),
                 self.relational("<=", value, high, "BETWEEN")]
        return self.node(_all_of([t.ev for t in terms]), value.pos, *terms, count=False)

    def in_list(self, left: _Node, negate: bool) -> _Node:
        if left.kind != "prop":
            self.refuse(left.pos, "a property name before IN (NOT binds tighter than IN: write "
                                  "NOT (a IN (...)) or a NOT IN (...))")
        self.expect("op", "(", "'(' after IN")
        values = [self.in_value()]
        while self.accept("op", ","):
            values.append(self.in_value())
        self.expect("op", ")", "',' or ')'")
        return self.node(_in_strings(left.name, values, negate), left.pos, left)

    def in_value(self) -> str:
        t = self.tok
        if t.kind == "str":  # SelectorParser.jj: an IN list holds string literals only
            value: str = self.parse_primary().value
            return value
        self.fail("a 'string' in the IN list (RocketMQ's IN takes strings only: write '7', not 7)")
        raise AssertionError

    def parse_unary(self) -> _Node:
        t = self.tok
        if (t.kind == "op" and t.text in ("+", "-")) or (t.kind == "kw" and t.text == "NOT"):
            self.i += 1
            self.deeper()
            inner = self.parse_unary()
            self.depth -= 1
            if t.text == "+":
                return inner
            if t.text == "-":
                return self.node(_negate(inner), t.pos, inner, kind="value")
            operand = self.condition(inner, "after NOT")
            return self.node(_not(operand.ev), t.pos, operand)
        return self.parse_primary()

    def parse_primary(self) -> _Node:
        t = self.tok
        if t.kind == "op" and t.text == "(":
            self.i += 1
            self.deeper()
            inner = self.parse_or()
            self.expect("op", ")", "')', AND or OR")
            self.depth -= 1
            return inner
        value: Any
        if t.kind == "word":
            self.i += 1
            return _Node(_property(t.text), "prop", t.pos, name=t.text)
        if t.kind == "str":
            value = t.text[1:-1].replace("''", "'")
        elif t.kind == "int":
            number = int(t.text.rstrip("lL"))
            if number > _LONG_MAX:
                self.refuse(t.pos, f"a whole number up to {_LONG_MAX} (Java's long), not {t.text}")
            value = _Int(number) if number <= _INT_MAX else _Long(number)
        elif t.kind == "float":
            value = float(t.text)
            if value == math.inf:
                self.refuse(t.pos, f"a number up to 1.7976931348623157E308 (Java's double), not {t.text}")
            if value < _DOUBLE_MIN:
                self.refuse(t.pos, f"a decimal of at least 4.9E-324, not {t.text} (RocketMQ refuses 0.0 "
                                   "and decimals that round to it; write 0 for zero)")
        elif t.kind == "kw" and t.text in ("TRUE", "FALSE", "NULL"):
            self.i += 1
            b = None if t.text == "NULL" else t.text == "TRUE"
            return _Node(lambda p: b, "boolconst", t.pos, value=b)
        else:
            self.fail("a property name, a number, a 'string', TRUE, FALSE, NULL or '('")
            raise AssertionError
        self.i += 1
        return _Node(lambda p: value, "const", t.pos, value=value)


@dataclass(frozen=True)
class Expression:
    """A compiled SQL92 filter: ``expression.matches(properties)``."""

    text: str
    evaluate: Eval

    def matches(self, properties: Props) -> bool:
        """Whether the filter is TRUE for ``properties``; False also when RocketMQ's evaluation would
        throw (its broker does not deliver such a message)."""
        try:
            return self.evaluate(properties) is True
        except _EvalError:
            return False


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
    return Expression(text, _Parser(text).parse().ev)
