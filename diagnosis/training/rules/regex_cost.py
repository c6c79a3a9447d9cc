"""How many ways one start position of a signature's search can be tried, read from its parse tree.

Python's `re` backtracks: when the rest of a pattern fails, every other length of every repeat before
it is tried. Each repeat is bounded (rules/regex.py refuses the others), so the work per start position is
bounded by a product of repeat widths, and a search tries every start position of a line. Two shapes
make that product large, and the loader refuses both over `MAX_PATHS`:

* a repeat inside a repeat: `(?:a{1,30}){1,30}` splits a run of `a` 900 ways;
* wide repeats in a row, `[^\\n]{1,2000}? --local_rank=\\d{1,5}[^\\n]{0,2000}? returned …`: when
  `returned` is not there, every split of the text between the two wildcards is tried, 2000 x 2000 per
  start position. The first wildcard can absorb whatever lies between them (the literal, the digits)
  as long as it can match those characters, so it still counts there.

A wide repeat is one of a character class of `WIDE` characters or more (`[^\\n]`, `.`, `\\S`, `\\w`,
`[^,\\n]`): it can match nearly any text a hostile line offers. A narrow one (`\\d{1,5}`, ` {0,4}`)
multiplies little and is left out. Two refinements keep the count honest rather than alarmist: a wide
repeat directly followed by a literal character it cannot match has one length that lets the match go
on (it ends before the first such character), so it multiplies nothing; and a repeat after which
nothing in the pattern can fail is never backtracked into, nor is anything before an optional group
after which nothing can fail (NCCL's `(?:…opcode …)?(?:…vendor err …)?` tail: a failed group is skipped).
"""

from __future__ import annotations

import importlib
import math
import string
from typing import Any, NamedTuple

_c: Any = importlib.import_module("re._constants")

MAX_PATHS = 512  # ways one start position may be tried: a repeat around a repeat, or wide repeats in a row
WIDE = 32  # characters a repeated class needs to count as a wildcard

_ALL = frozenset(range(129))  # ASCII, and 128 for any non-ASCII character
_DIGIT = frozenset(map(ord, string.digits))
_SPACE = frozenset(map(ord, " \t\n\r\f\v"))
_WORD = frozenset(map(ord, string.ascii_letters + string.digits + "_"))
_CATEGORIES = {
    "CATEGORY_DIGIT": _DIGIT,
    "CATEGORY_NOT_DIGIT": _ALL - _DIGIT,
    "CATEGORY_SPACE": _SPACE,
    "CATEGORY_NOT_SPACE": _ALL - _SPACE,
    "CATEGORY_WORD": _WORD,
    "CATEGORY_NOT_WORD": _ALL - _WORD,
}


class _Wild(NamedTuple):
    chars: frozenset[int]
    width: int  # lengths it can take


def problems(tree: Any) -> list[str]:
    """What in the parsed pattern `tree` lets one start position be tried more than MAX_PATHS ways."""
    found: list[str] = []
    _nesting(tree, found)
    _walk(list(tree), [], tail_fails=False, found=found)
    return found


# -- a repeat inside a repeat ---------------------------------------------------------------------


def _nesting(seq: Any, found: list[str]) -> None:
    for op, av in seq:
        if op is _c.SUBPATTERN:
            _nesting(av[3], found)
        elif op is _c.BRANCH:
            for alt in av[1]:
                _nesting(alt, found)
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            _low, high, sub = av
            if high is not _c.MAXREPEAT and high > 1 and (inner := _widest(sub)) > 1 and high * inner > MAX_PATHS:
                found.append(f"a repeat of up to {high} around a repeat: bound the product by {MAX_PATHS}")
            _nesting(sub, found)


def _widest(seq: Any) -> int:
    """The largest repeat bound inside `seq` (1 when there is none): what an outer repeat multiplies."""
    widest = 1
    for op, av in seq:
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            high = av[1]
            widest = max(widest, (1 << 30) if high is _c.MAXREPEAT else max(high, 1) * _widest(av[2]))
        elif op is _c.SUBPATTERN:
            widest = max(widest, _widest(av[3]))
        elif op is _c.BRANCH:
            widest = max(widest, *(_widest(alt) for alt in av[1]))
    return widest


# -- wide repeats in a row ------------------------------------------------------------------------


def _chars(op: Any, av: Any) -> frozenset[int] | None:
    """The characters a one-character item matches; None for anything else."""
    if op is _c.LITERAL:
        return frozenset((min(av, 128),))
    if op is _c.NOT_LITERAL:
        return _ALL - {av}
    if op is _c.ANY:
        return _ALL - {10}
    if op is not _c.IN:
        return None
    negate, chars = False, set()
    for item_op, item_av in av:
        if item_op is _c.NEGATE:
            negate = True
        elif item_op is _c.LITERAL:
            chars.add(min(item_av, 128))
        elif item_op is _c.RANGE:
            chars.update(range(item_av[0], min(item_av[1], 128) + 1))
        elif item_op is _c.CATEGORY:
            chars |= _CATEGORIES[str(item_av)]
    return _ALL - chars if negate else frozenset(chars)


def _can_fail(seq: Any) -> bool:
    """Whether matching `seq` can fail at all (it must consume something, or assert something)."""
    return any(op is _c.AT or _min_width(op, av) > 0 for op, av in seq)


def _min_width(op: Any, av: Any) -> int:
    if _chars(op, av) is not None:
        return 1
    if op is _c.SUBPATTERN:
        return sum(_min_width(o, a) for o, a in av[3])
    if op is _c.BRANCH:
        return min(sum(_min_width(o, a) for o, a in alt) for alt in av[1])
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
        low: int = av[0]
        return low * sum(_min_width(o, a) for o, a in av[2])
    return 0


def _walk(seq: list[Any], open_: list[_Wild], *, tail_fails: bool, found: list[str], follow: Any = None) -> list[_Wild]:
    """Walk `seq` with the wide repeats still `open_` before it (those that can absorb what follows);
    record in `found` a wide repeat whose widths times theirs exceed MAX_PATHS; return the open ones
    after `seq`. `tail_fails`: whether what follows `seq` in the pattern can fail; `follow`: the item
    right after `seq` there, if any."""
    for i, (op, av) in enumerate(seq):
        rest_fails = tail_fails or _can_fail(seq[i + 1 :])
        after = seq[i + 1] if i + 1 < len(seq) else follow
        chars = _chars(op, av)
        if chars is not None:
            open_ = [w for w in open_ if w.chars & chars]
        elif op is _c.SUBPATTERN:
            open_ = _walk(list(av[3]), open_, tail_fails=rest_fails, found=found, follow=after)
        elif op is _c.BRANCH:
            ends = [
                w
                for alt in av[1]
                for w in _walk(list(alt), list(open_), tail_fails=rest_fails, found=found, follow=after)
            ]
            open_ = list(dict.fromkeys(ends))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            open_ = _repeat(av, after, open_, rest_fails, found)
    return open_


def _repeat(av: Any, after: Any, open_: list[_Wild], rest_fails: bool, found: list[str]) -> list[_Wild]:
    low, high, sub = av
    chars = _chars(*sub[0]) if len(sub) == 1 else None
    if chars is None:  # a group repeated: its inside goes on from here (a repeat of it is _nesting's)
        if low == 0 and not rest_fails:
            # An optional group with nothing after it that can fail: when its inside fails, skipping it
            # succeeds, so nothing before it is tried again. Its inside counts on its own.
            _walk(list(sub), [], tail_fails=False, found=found)
            return open_
        follow = after if high == 1 else None
        inside = _walk(list(sub), list(open_), tail_fails=True if high > 1 else rest_fails, found=found, follow=follow)
        return list(dict.fromkeys(inside + (open_ if low == 0 else [])))
    absorbing = [w for w in open_ if w.chars & chars]
    if len(chars) < WIDE or high == low:
        return absorbing if low > 0 else open_
    stopped = after is not None and after[0] is _c.LITERAL and min(after[1], 128) not in chars
    if stopped or not rest_fails:
        return absorbing  # one length lets the match go on: it multiplies nothing
    width = high - low + 1 if high is not _c.MAXREPEAT else 1 << 30
    paths = width * math.prod(w.width for w in absorbing)
    if absorbing and paths > MAX_PATHS:
        found.append(
            f"wide repeats in a row (up to {paths} ways to split the text between them per start position): "
            f"bound the product by {MAX_PATHS}, or separate them with a literal the first cannot match"
        )
    return [*absorbing, _Wild(chars, width)]
