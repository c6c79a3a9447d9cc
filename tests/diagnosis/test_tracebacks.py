"""Python tracebacks of several processes in one input (diagnosis/training/place/source_state.py): ranks that die
together print theirs interleaved, and each ends with its own printer's exception line."""

from __future__ import annotations

from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.training.diagnose import Report, diagnose
from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.place.source_state import MAX_OPEN, SourceState

HEAD = "Traceback (most recent call last):"
FRAME = '  File "/workspace/train.py", line 3, in <module>'


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


def _deaths(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.class_id == "job_failed_unclassified"]


def test_interleaved_tracebacks_are_each_their_own_ranks_death() -> None:
    report = _text(
        f"[rank0]: {HEAD}",
        f"[rank1]: {HEAD}",
        f"[rank0]: {FRAME}",
        f"[rank1]: {FRAME}",
        "[rank0]:     main()",
        "[rank1]:     main()",
        "[rank0]: KeyError: 'input_ids'",
        "[rank1]: ValueError: bad shape",
    )
    deaths = {f.rank: [e.text for e in f.evidence] for f in _deaths(report)}
    assert deaths == {0: ["[rank0]: KeyError: 'input_ids'"], 1: ["[rank1]: ValueError: bad shape"]}


def test_one_ranks_ignored_exception_does_not_hide_anothers_traceback() -> None:
    """Rank 1's exception in `__del__` kills nothing; rank 0's traceback, printed just after, does."""
    report = _text(
        "[rank1]: Exception ignored in: <function Loader.__del__ at 0x7f3a2c1d0e50>",
        f"[rank0]: {HEAD}",
        f"[rank1]: {HEAD}",
        f"[rank0]: {FRAME}",
        f"[rank1]: {FRAME}",
        "[rank0]: KeyError: 'input_ids'",
        "[rank1]: AttributeError: 'NoneType' object has no attribute 'close'",
    )
    assert [(f.rank, f.evidence[0].text) for f in _deaths(report)] == [(0, "[rank0]: KeyError: 'input_ids'")]


def test_the_last_traceback_to_end_is_told_with_its_own_host_and_exception() -> None:
    report = _text(
        f"node1: {HEAD}",
        f"node2: {HEAD}",
        f"node2: {FRAME}",
        f"node1: {FRAME}",
        "node2: ValueError: bad shape",
        "node1: KeyError: 'input_ids'",
    )
    [death] = _deaths(report)
    assert (death.host, death.evidence[0].text) == ("node1", "node1: KeyError: 'input_ids'")


def test_an_exception_line_that_says_less_than_its_traceback_head_still_ends_it() -> None:
    state = SourceState(0, None)
    state.traceback(1, normalise(f"node1:4242:4300 [0] {HEAD}"))
    state.exception(3, normalise("KeyError: 'input_ids'"))
    [trace] = state.tracebacks
    assert (trace.start, trace.line, trace.host) == (1, 3, "node1")


def test_open_tracebacks_are_bounded_and_the_newest_still_ends() -> None:
    state = SourceState(0, None)
    for rank in range(MAX_OPEN * 4):
        state.traceback(rank, normalise(f"[rank{rank}]: {HEAD}"))
    assert len(state.open_tracebacks) == MAX_OPEN
    last = MAX_OPEN * 4 - 1
    state.exception(last + 1, normalise(f"[rank{last}]: KeyError: 'x'"))
    assert [t.rank for t in state.tracebacks] == [last]
