"""No signature backtracks catastrophically: hostile lines are classified in bounded time.

The loader already refuses unbounded repetition; these tests throw lines at every signature that
are built to make a backtracking engine work hard (long runs of the characters the patterns use,
example prefixes repeated until the line limit) and bound the time each one takes.
"""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.diagnosis.line_scan import DEFAULT_MAX_LINE
from gpu_triage.diagnosis.log_lines import normalise
from gpu_triage.diagnosis.training_rules import load_rules

RULES = load_rules()
SIGNATURES = [sig for rule in RULES.rules for sig in rule.signatures] + [
    sig for ctx in RULES.context for sig in ctx.signatures
]
# Generous against a slow CI machine; catastrophic backtracking on such lines takes minutes.
SIGNATURE_BOUND_S = 0.25
LINE_BOUND_S = 1.5


def _skeleton(pattern: str) -> str:
    """The literal text of a pattern, roughly: what a near-match of it looks like."""
    return re.sub(r"\\[a-zA-Z]|[\\\[\](){}?*+|^$]|\?P<\w+>|\?:|\?<!", "", pattern)


ALPHABET = sorted({c for sig in SIGNATURES for c in _skeleton(sig.pattern)} | set("0123456789 _.:-<>()[]/="))
FRAGMENTS = sorted(
    {normalise(ex.line).text[:k] for rule in RULES.rules for ex in rule.examples for k in (12, 60)}
    | {_skeleton(sig.pattern)[:k] for sig in SIGNATURES for k in (8, 200)} - {""}
)
EXHAUSTIVE_LINE = 8192  # every fragment at this length; the property test below goes to the limit


def _check(line: str) -> None:
    for sig in SIGNATURES:
        start = time.perf_counter()
        sig.search(line)
        took = time.perf_counter() - start
        assert took < SIGNATURE_BOUND_S, f"{sig.pattern!r} took {took:.3f}s on {line[:60]!r}…"
    start = time.perf_counter()
    text = normalise(line).text
    RULES.match(text)
    RULES.match_context(text)
    assert time.perf_counter() - start < LINE_BOUND_S


def test_runs_of_every_character_the_patterns_use() -> None:
    for char in ALPHABET:
        _check(char * 8192)


def test_every_example_prefix_repeated() -> None:
    for fragment in FRAGMENTS:
        _check((fragment * (EXHAUSTIVE_LINE // len(fragment) + 1))[:EXHAUSTIVE_LINE])


_units = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.text(alphabet=ALPHABET, min_size=1, max_size=16),
    st.lists(st.sampled_from(FRAGMENTS), min_size=2, max_size=5).map(" ".join),
)


@settings(max_examples=60, deadline=None)
@given(
    _units,
    st.one_of(st.integers(min_value=1, max_value=DEFAULT_MAX_LINE), st.just(DEFAULT_MAX_LINE)),
    st.text(alphabet=ALPHABET, max_size=40),
)
def test_adversarial_lines_take_bounded_time(unit: str, repeat: int, tail: str) -> None:
    line = (unit * (repeat // len(unit) + 1))[: DEFAULT_MAX_LINE - len(tail)] + tail
    _check(line)
