"""What the loader needs to know about a signature regex, read from Python's own parse of it.

Every signature is used three ways, and this module derives the two other forms from the one in the
rules file:

* Python `re` (ASCII mode) matches the bare message of a line and extracts the fields;
* a whole-block scan (Hyperscan, or the pure-Python literal scan where Hyperscan is missing) picks the
  lines worth that match out of gigabytes of healthy output. `scan_pattern` rewrites the signature for
  Hyperscan and `required_literals` names the literal text every match must contain.

For the two scans to give the same findings, each must flag *every* line Python would match; what
else they flag costs only time, since Python decides. So the scan form is a relaxation of the regex:
named groups lose their names, a one-character item that can match a non-ASCII character may take up
to four bytes (a block is scanned as bytes, Python counts characters: `[^\n]{0,200}` becomes
`[^\n]{0,800}`), `^` becomes "the start of a line or the end of a prefix" (Python matches the message
after its prefixes are cut off), `$` goes, and negated classes never cross a newline. The bounds stay:
the scan reports, per line, which signatures nearly match it, and Python tries only those
(diagnosis/training/scan/block_scan.py), so a line crafted to hold every literal and match nothing costs no regex.

Constructs that either engine cannot honour, or that would let a match be slow, are refused here and
reported by the loader: look-around, back-references, inline flags, atomic groups, possessive or
unbounded repetition, non-ASCII literals, and the shapes diagnosis/training/rules/regex_cost.py counts too many ways
to try (a repeat inside a repeat, wide repeats in a row).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from typing import Any

from gpu_triage.diagnosis.training.rules import regex_cost
from gpu_triage.diagnosis.xid.kernel_log import TRIGGERS as KERNEL_TRIGGERS

# The parser Python's `re` uses; private, but its output is what the matcher really runs.
_sre: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

MAX_OPTIONAL_WILD = 2  # optional parts with a wildcard a scan form keeps (see scan_pattern)
_UTF8_MAX = 4  # bytes of one character (a U+FFFD from a bad byte is one), what a scan bound widens by
MIN_LITERAL = 4  # a signature's required text is at least this long: distinctive, and cheap to look for

# Characters that end every prefix `log_lines.normalise` strips (`: `, `] `, `]:`, `>:`, a blank), so a
# message that starts after a prefix starts after one of these in the raw line.
_AFTER_PREFIX = r"(?:^|[ \t\r\f\v:\]>])"
_SPACE = r" \t\r\f\v"  # Python's ASCII \s without the newline a block scan must never cross


def _parse(pattern: str) -> Any:
    return _sre.parse(pattern, re.ASCII)


def unsupported(pattern: str) -> list[str]:
    """What in `pattern` one of the engines cannot run, or could run slowly; empty when it is usable."""
    try:
        tree = _parse(pattern)
    except re.error as exc:
        return [f"bad regex: {exc}"]
    problems: list[str] = []
    if tree.state.flags & ~(re.ASCII | re.UNICODE):
        problems.append("inline flags are not allowed (the engines run case-sensitive, ASCII)")
    _check(tree, problems)
    if not problems:  # the cost of a search is only worth counting in a pattern that can run
        problems += regex_cost.problems(tree)
    return sorted(set(problems))


_REFUSED = {
    "ASSERT": "look-ahead/look-behind is not allowed (the block scan cannot run it): rewrite without it",
    "ASSERT_NOT": "look-ahead/look-behind is not allowed (the block scan cannot run it): rewrite without it",
    "GROUPREF": "back-references are not allowed",
    "GROUPREF_EXISTS": "conditional groups are not allowed",
    "ATOMIC_GROUP": "atomic groups are not allowed",
    "POSSESSIVE_REPEAT": "possessive repetition is not allowed",
}


def _check(seq: Any, problems: list[str]) -> None:
    for op, av in seq:
        name = str(op)
        if name in _REFUSED:
            problems.append(_REFUSED[name])
        elif op is _c.LITERAL or op is _c.NOT_LITERAL:
            if av > 0x7F:
                problems.append(f"non-ASCII literal {chr(av)!r}: log text is matched as ASCII")
        elif op is _c.SUBPATTERN:
            _group, add, _del, sub = av
            if add & ~(re.ASCII | re.UNICODE):
                problems.append("inline flags are not allowed (the engines run case-sensitive, ASCII)")
            _check(sub, problems)
        elif op is _c.BRANCH:
            for alt in av[1]:
                _check(alt, problems)
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            _low, high, sub = av
            if high is _c.MAXREPEAT:
                problems.append("unbounded repetition (*, +, {n,}): use a bounded {m,n}")
            _check(sub, problems)
        elif op is _c.IN:
            for item_op, item_av in av:
                if item_op is _c.LITERAL and item_av > 0x7F:
                    problems.append(f"non-ASCII literal {chr(item_av)!r} in a class")


# -- required literals -------------------------------------------------------------------------------


def _better(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    """The more selective of two alternative requirements: longer shortest literal, then fewer literals."""
    if a is None:
        return b
    if b is None:
        return a
    key_a = (min(map(len, a)), -len(a))
    key_b = (min(map(len, b)), -len(b))
    return b if key_b > key_a else a


def _required(seq: Any) -> frozenset[str] | None:
    """A set of literals one of which every match of `seq` contains; None when there is none."""
    best: frozenset[str] | None = None
    run: list[str] = []

    def flush() -> None:
        nonlocal best
        if run:
            best = _better(best, frozenset(["".join(run)]))
            run.clear()

    for op, av in seq:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        if op is _c.AT:
            continue  # zero-width: the run goes on
        if op is _c.IN and len(av) == 1 and av[0][0] is _c.LITERAL:
            run.append(chr(av[0][1]))
            continue
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and len(av[2]) == 1 and av[2][0][0] is _c.LITERAL:
            low, high, sub = av  # `={20,80}`: at least `low` copies in a row
            run.append(chr(sub[0][1]) * low)
            if high != low:
                flush()
            continue
        flush()
        found: frozenset[str] | None = None
        if op is _c.SUBPATTERN:
            found = _required(av[3])
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT) and av[0] >= 1:
            found = _required(av[2])
        elif op is _c.BRANCH:
            parts = [_required(alt) for alt in av[1]]
            if all(p is not None for p in parts):
                found = frozenset().union(*(p for p in parts if p is not None))
        best = _better(best, found)
    flush()
    return best


def required_literals(pattern: str) -> tuple[str, ...]:
    """Literal strings, one of which every match of `pattern` contains (empty if none is certain)."""
    found = _required(_parse(pattern))
    return tuple(sorted(found)) if found else ()


# -- the scan form -----------------------------------------------------------------------------------

_CATEGORY_IN_CLASS = {
    "CATEGORY_DIGIT": (r"\d", False),
    "CATEGORY_NOT_DIGIT": (r"\D", True),
    "CATEGORY_SPACE": (_SPACE, False),
    "CATEGORY_NOT_SPACE": (r"\S", True),
    "CATEGORY_WORD": (r"\w", False),
    "CATEGORY_NOT_WORD": (r"\W", True),
}


def _char(code: int) -> str:
    return re.escape(chr(code)) if chr(code) not in "\n\t\r" else {10: r"\n", 9: r"\t", 13: r"\r"}[code]


def _class(items: Any) -> tuple[str, bool]:
    """A character class in scan form, and whether it can match a non-ASCII character (a byte of one)."""
    negate = False
    parts: list[str] = []
    wide = False
    for op, av in items:
        if op is _c.NEGATE:
            negate = True
        elif op is _c.LITERAL:
            parts.append(_char(av))
        elif op is _c.RANGE:
            parts.append(f"{_char(av[0])}-{_char(av[1])}")
        elif op is _c.CATEGORY:
            text, not_category = _CATEGORY_IN_CLASS[str(av)]
            parts.append(text)
            wide = wide or not_category
        else:  # pragma: no cover - the parser produces nothing else inside a class
            raise ValueError(f"unexpected class item {op}")
    if negate:
        return "[^" + "".join(parts) + r"\n]", True
    # A positive class with \W or \D may cross a newline in a block; that only flags a line more.
    return "[" + "".join(parts) + "]", wide


def _item(op: Any, av: Any) -> tuple[str, bool]:
    """One node in scan form, and whether it is a single character that may be non-ASCII."""
    if op is _c.LITERAL:
        return _char(av), False
    if op is _c.NOT_LITERAL:
        return f"[^{_char(av)}\\n]", True
    if op is _c.ANY:
        return ".", True
    if op is _c.IN:
        return _class(av)
    if op is _c.AT:
        name = str(av)
        if name in ("AT_BEGINNING", "AT_BEGINNING_STRING"):
            return _AFTER_PREFIX, False
        if name in ("AT_END", "AT_END_STRING"):
            return "", False
        return (r"\b" if name == "AT_BOUNDARY" else r"\B"), False
    if op is _c.SUBPATTERN:
        return "(?:" + _seq(av[3]) + ")", False
    if op is _c.BRANCH:
        return "(?:" + "|".join(_seq(alt) for alt in av[1]) + ")", False
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
        low, high, sub = av
        if len(sub) == 1:
            text, wide = _item(*sub[0])
            # `[^\n]{0,200}` is 200 characters, up to 4 UTF-8 bytes each: in bytes, 0 to 800.
            return f"(?:{text}){{{low},{high * _UTF8_MAX if wide else high}}}", False
        return f"(?:{_seq(sub)}){{{low},{high}}}", False  # a group: its characters widen inside it
    raise ValueError(f"unsupported regex construct {op}")


def _seq(seq: Any) -> str:
    out: list[str] = []
    for op, av in seq:
        text, wide = _item(op, av)
        # A character Python counts as one may be several bytes in the block: let it take them.
        out.append(f"(?:{text}){{1,{_UTF8_MAX}}}" if wide else text)
    return "".join(out)


def scan_pattern(pattern: str) -> str:
    """`pattern` relaxed for a whole-block byte scan (see the module docstring); call `unsupported` first.

    Bounded as the pattern is (only the bytes a character may take widen a bound), so that the scan
    flags a line only where the regex nearly matches it, and says which signature does: a line that holds
    every signature's literal and matches none costs Hyperscan's time, not every regex's.
    """
    tree = list(_parse(pattern))
    # Hyperscan refuses a pattern whose optional parts each hold a wildcard (the states multiply). What a
    # line must hold to match the start of a pattern it must hold to match all of it, so a trailing
    # optional part (NCCL's `(?:… opcode …)?(?:… vendor err …)?(?: hca …)?` tail) can go from the scan
    # form without losing a line.
    while len(tree) > 1 and _optional_wildcards(tree) > MAX_OPTIONAL_WILD and regex_cost._min_width(*tree[-1]) == 0:
        tree.pop()
    return _seq(tree)


def _optional_wildcards(seq: Any) -> int:
    """How many optional items of `seq` hold a wide repeat."""
    return sum(1 for op, av in seq if regex_cost._min_width(op, av) == 0 and _has_wildcard([(op, av)]))


def _has_wildcard(seq: Any) -> bool:
    for op, av in seq:
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            sub = av[2]
            if (len(sub) == 1 and _item(*sub[0])[1] and av[1] > 1) or _has_wildcard(sub):
                return True
        elif (op is _c.SUBPATTERN and _has_wildcard(av[3])) or (
            op is _c.BRANCH and any(_has_wildcard(alt) for alt in av[1])
        ):
            return True
    return False


def literal_set(literals: Sequence[str]) -> tuple[str, ...]:
    """`literals` without those that contain another one (a line holding the longer holds the shorter)."""
    unique = sorted(set(literals), key=len)
    kept: list[str] = []
    for lit in unique:
        if not any(k in lit for k in kept):
            kept.append(lit)
    return tuple(sorted(kept))


def literal_needles(literals: Sequence[str]) -> tuple[str, ...]:
    """What the literal search looks for: the signatures' literals and the kernel-log triggers, without
    those that contain another (diagnosis/training/rules/load.py keeps the answer with the rules)."""
    return literal_set([*literals, *(t.decode() for t in KERNEL_TRIGGERS)])
