"""Next steps filled from what a finding knows (diagnosis/training/rules/next_steps.py), and checked when the rules load."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.diagnosis.training.rules.load import parse_rules_text
from gpu_triage.diagnosis.training.rules.next_steps import fill, unless

STEPS = [
    "Start at the straggler, {straggler_where}.",
    unless("straggler_where", "Enable the flight recorder to find the rank that never joined."),
    "Drain {host} if the fault comes back.",
    "Always shown.",
]


def test_a_step_is_shown_only_when_every_name_it_uses_is_known() -> None:
    assert fill(STEPS, {"straggler_where": "rank 5 on node1", "host": "node1"}) == [
        "Start at the straggler, rank 5 on node1.",
        "Drain node1 if the fault comes back.",
        "Always shown.",
    ]


def test_the_generic_step_stands_in_when_the_specific_one_cannot_be_given() -> None:
    assert fill(STEPS, {"host": ""}) == [
        "Enable the flight recorder to find the rank that never joined.",
        "Always shown.",
    ]


RULES = """
version: 1
rules:
  - class: {cls}
    severity: warning
    action: CHECK_APP
    playbook: nccl-{dash}
    title: t
    steps:
      - {step}
    signatures: ['Some distinctive text']
    examples: ['Some distinctive text']
"""


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        ("'Look at {hots} first'", "unknown name {hots}"),
        ("{unless: straggler_rank}", "`unless` must name a field"),
    ],
)
def test_the_loader_refuses_steps_that_name_what_no_finding_carries(step: str, problem: str) -> None:
    with pytest.raises(DataError) as err:
        parse_rules_text(RULES.format(cls="cuda_oom", dash="cuda-oom", step=step))
    assert any(problem in p for p in err.value.problems)
