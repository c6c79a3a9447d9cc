"""Just enough PromQL lexing for the dashboard lint: the selectors, what they match, and what encloses them.

There is no PromQL parser on PyPI worth a dependency and Prometheus 2.42 has no parse API, so this reads the
token stream. It is not a validator (promtool checks that every expression parses); it only has to find
each vector selector, its matchers, its range and offset, and the innermost function around it.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

_TOKEN = re.compile(
    r"""
     (?P<ws>\s+)
    |(?P<comment>\#[^\n]*)
    |(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    |(?P<var>\$(?:\{[^}]+\}|\w+))
    |(?P<number>0x[0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|s|m|h|d|w|y)(?:\d+(?:ms|s|m|h|d|w|y))*)?)
    |(?P<ident>[A-Za-z_:][\w:]*)
    |(?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=,(){}\[\]:@])
    """,
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}
_AGGREGATIONS |= {"group"}
_CONSTANTS = {"inf", "nan", "Inf", "NaN"}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    metric: str | None
    matchers: tuple[Matcher, ...]
    range: str | None  # what is between [ and ] right after the selector
    offset: str | None
    function: str | None  # the innermost function call around the selector
    start: int
    end: int

    def matches(self, label: str, op: str, value: str) -> bool:
        return Matcher(label, op, value) in self.matchers


def tokenize(expr: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise ValueError(f"cannot read PromQL at {pos}: {expr[pos : pos + 30]!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind not in ("ws", "comment"):
            tokens.append(Token(kind, match.group(), pos))
        pos = match.end()
    return tokens


def _unquote(text: str) -> str:
    body = text[1:-1]
    if text[0] == "`":
        return body
    return re.sub(r"\\(.)", r"\1", body)


class _Reader:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = tokenize(expr)
        self.i = 0
        self.stack: list[str | None] = []  # per open parenthesis: the function it calls, or None
        self.selectors: list[Selector] = []

    def peek(self, ahead: int = 0) -> Token | None:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else None

    def take(self) -> Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def skip_group(self, close: str) -> str:
        """Skip to the matching `close` (the opener was taken); the text in between."""
        start = self.tokens[self.i - 1].pos + 1
        depth = 1
        opener = {")": "(", "]": "[", "}": "{"}[close]
        while True:
            token = self.take()
            if token.text == opener:
                depth += 1
            elif token.text == close:
                depth -= 1
                if depth == 0:
                    return self.expr[start : token.pos].strip()

    def selector(self, metric: Token | None) -> None:
        start = metric.pos if metric else self.tokens[self.i].pos
        matchers: list[Matcher] = []
        end = metric.pos + len(metric.text) if metric else start
        nxt = self.peek()
        if nxt is not None and nxt.text == "{":
            self.take()
            while (token := self.take()).text != "}":
                if token.text == ",":
                    continue
                op, value = self.take(), self.take()
                matchers.append(Matcher(token.text, op.text, _unquote(value.text)))
            end = token.pos + 1
        range_ = offset = None
        nxt = self.peek()
        if nxt is not None and nxt.text == "[":
            self.take()
            range_ = self.skip_group("]")
            end = self.tokens[self.i - 1].pos + 1
        nxt = self.peek()
        if nxt is not None and nxt.text == "offset":
            self.take()
            token = self.take()
            offset = token.text
            end = token.pos + len(token.text)
        innermost = self.stack[-1] if self.stack else None  # None: top level or inside a plain parenthesis
        self.selectors.append(
            Selector(metric.text if metric else None, tuple(matchers), range_, offset, innermost, start, end)
        )

    def read(self) -> list[Selector]:
        pending: str | None = None  # an aggregation whose `by (...)` came before its argument
        while self.i < len(self.tokens):
            token = self.take()
            nxt = self.peek()
            if token.kind == "ident" and token.text in _LABEL_LISTS and nxt is not None and nxt.text == "(":
                self.take()
                self.skip_group(")")
            elif token.kind == "ident" and token.text in _AGGREGATIONS and nxt is not None and nxt.text in _LABEL_LISTS:
                pending = token.text
            elif token.text == "(":
                previous = self.tokens[self.i - 2] if self.i >= 2 else None
                if pending is not None and previous is not None and previous.text == ")":
                    self.stack.append(pending)
                    pending = None
                elif previous is not None and previous.kind == "ident" and previous.text not in _KEYWORDS:
                    self.stack.append(previous.text)
                else:
                    self.stack.append(None)
            elif token.text == ")":
                self.stack.pop()
            elif token.text == "[":
                self.skip_group("]")  # a subquery's range
            elif token.text == "{":
                self.i -= 1
                self.selector(None)
            elif token.kind == "ident" and token.text not in _KEYWORDS | _CONSTANTS:
                if nxt is not None and nxt.text == "(":
                    continue  # a function call: its name is taken when the parenthesis opens
                self.selector(token)
        return self.selectors


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in `expr`, in order."""
    return _Reader(expr).read()


def calls(expr: str, functions: set[str]) -> list[str]:
    """The names of the calls of `functions` in `expr`, in order (to count them)."""
    tokens = tokenize(expr)
    return [t.text for t, n in itertools.pairwise(tokens) if t.text in functions and n.text == "("]
