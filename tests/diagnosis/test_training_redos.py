"""No signature can backtrack catastrophically, and the reason is asserted from each regex's structure.

Bounded work needs no clock to check: with every repetition bounded, no look-around or
back-reference, no repeat inside a repeat and no run of wide repeats whose product of widths exceeds
`MAX_PATHS` (diagnosis/training/rules/regex_cost.py), a search tries each start position of a (length-capped) line
and explores a bounded number of paths from each. And a line without any of a signature's required
literals is not searched by it at all. How long the worst lines actually take is printed by
bench/bench_regex_worst.py, on the machine it runs on.
"""

from __future__ import annotations

import re

import pytest

from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.rules.regex import required_literals, unsupported
from gpu_triage.diagnosis.training.rules.regex_cost import MAX_PATHS

RULES = load_rules()
SIGNATURES = list(RULES.signatures())
IDS = [s.pattern[:40] for s in SIGNATURES]


@pytest.mark.parametrize("sig", SIGNATURES, ids=IDS)
def test_every_signature_is_bounded_and_plain(sig: object) -> None:
    assert unsupported(sig.pattern) == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("sig", SIGNATURES, ids=IDS)
def test_a_line_without_the_required_literal_is_not_searched(sig: object) -> None:
    literals = sig.literals  # type: ignore[attr-defined]
    assert literals == required_literals(sig.pattern)  # type: ignore[attr-defined]
    # A long line of everything the pattern uses but its literal text: no search at all.
    hostile = re.sub(r"[A-Za-z]", "", sig.pattern) * 200  # type: ignore[attr-defined]
    if not any(lit in hostile for lit in literals):
        assert sig.search(hostile) is None  # type: ignore[attr-defined]


def _refused(pattern: str, why: str) -> bool:
    return any(why in p for p in unsupported(pattern))


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [
        (r"(?:a{1,30}){1,30} error", True),  # 900 paths per start position
        (r"(?:a{1,16}){1,16} error", False),  # 256
        (r"(?:x|y{1,600}) error", False),  # no repeat inside a repeat
        (r"error (?:\w{1,40}\.){0,8}end", False),  # 320
        (r"error (?:(?:\w{1,9}){1,9}\.){1,9}end", True),  # 729 nested twice
    ],
)
def test_the_nesting_bound_is_a_product(pattern: str, refused: bool) -> None:
    assert _refused(pattern, "around a repeat") is refused
    assert MAX_PATHS == 512


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [
        # The shape that took 2 s per 64 KiB line: the first wildcard absorbs the second one's text.
        (
            r"CalledProcessError: Command [^\n]{1,2000}?(?:--local_rank=(?P<local_rank>\d{1,5})[^\n]{0,2000}?)? "
            r"returned non-zero exit status (?P<exitcode>\d{1,3})",
            True,
        ),
        (r"CalledProcessError: Command [^\n]{1,2000}? returned non-zero exit status (?P<exitcode>\d{1,3})", False),
        (r"error [^\n]{0,100}[^\n]{0,100}end", True),  # adjacent: 101 x 101
        (r"error \S{0,30} \S{0,30}end", False),  # the blank between them is one the first cannot take
        (r"error .{1,40}?: .{1,40}?end", True),  # `.` takes ": " too
        (r"error \w{1,32}[^\n]{0,500}?,task=", True),  # 32 x 500
        (r"error [^\n]{1,500}?,task=(?P<process>[^,\n]{1,16}),pid=", False),  # the second stops at its comma
        (r"error [^:\n]{1,300}: [^\n]{1,300}end", False),  # the first cannot take the `:` between them
        (r"error \d{1,100}[^\n]{1,100}end", False),  # digits are a narrow class
        (r"error [^\n]{0,300}?got error: (?P<reason>[^\n]{1,120})", False),  # nothing after it can fail
        (r"error [^\n]{0,40}?x(?:[^\n]{0,120}?y)?(?:[^\n]{0,400}?z)?", False),  # failed optional groups are skipped
        (r"error [^\n]{0,40}?x(?:[^\n]{0,120}?y)?end", True),  # ... unless something after them can fail
    ],
)
def test_wide_repeats_in_a_row_are_bounded_by_their_product(pattern: str, refused: bool) -> None:
    assert _refused(pattern, "wide repeats in a row") is refused


@pytest.mark.parametrize(
    ("line", "class_id", "local_rank"),
    [
        (
            "node07: [2024-05-01 12:00:00,123] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', "
            "'train.py', '--local_rank=7', '--deepspeed'] exits with return code = -9",
            "host_oom_killed",
            7,
        ),
        (
            "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', '--local-rank=3']' "
            "returned non-zero exit status 1.",
            "job_failed_unclassified",
            3,
        ),
        (
            "subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGSEGV: 11>.",
            None,
            None,
        ),
    ],
)
def test_a_launchers_report_still_names_the_workers_local_rank(
    line: str, class_id: str | None, local_rank: int | None
) -> None:
    """The launchers' signatures no longer capture `--local_rank=N` themselves (that was the slow shape): it is
    read from the reported command line once a rule has matched."""
    from gpu_triage.diagnosis.training.diagnose import diagnose

    [finding] = diagnose([(None, [line.encode() + b"\n"])]).findings
    assert finding.local_rank == local_rank
    if class_id is not None:
        assert finding.class_id == class_id
