"""Tallies that turn out to be one place merge without losing what code decides on."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.training.findings.collapse import Collapser, Seen, Spec
from gpu_triage.diagnosis.training.place.facts import Who

SEGFAULT = Spec(
    class_id="process_segfault",
    severity=Severity.WARNING,
    action=Action.CHECK_APP,
    title="A worker crashed (segmentation fault, bus error, abort)",
    playbook="nccl-process-segfault",
    steps=(),
    tier=1.0,
)


@pytest.mark.parametrize("aborted_first", [True, False])
def test_a_sigabrt_death_stays_one_when_its_tally_is_merged_into_another(aborted_first: bool) -> None:
    """A rank's SIGABRT report and its plain crash line, first told apart by what each line named (a pid, then
    the rank), merged once the pid turns out to be that rank's: the merged tally is still an abort, whichever
    was held and whichever moved."""
    collapser = Collapser()
    by_pid, by_rank = Who(0, host="n1", pid=41), Who(0, host="n1", rank=3)
    seen = [Seen(0, n, f"line {n}", None) for n in (1, 2)]
    collapser.add(by_pid, SEGFAULT, seen[0], {"signal": "SIGABRT"}, aborted=aborted_first)
    collapser.add(by_rank, SEGFAULT, seen[1], {}, aborted=not aborted_first)
    collapser.rebind(lambda _cls, who, _t: by_rank if who == by_pid else None)
    [(_, who, tally)] = list(collapser.tallies())
    assert who == by_rank
    assert tally.count == 2
    assert tally.aborted
