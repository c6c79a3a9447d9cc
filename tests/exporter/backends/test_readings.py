"""What the readings' metric help says, against the data the verdict is made from."""

from __future__ import annotations

import re

from gpu_triage.diagnosis.xid_data import load_catalog
from gpu_triage.exporter.backends.families import NVLINK_STATE, RECOVERY_ACTION
from gpu_triage.exporter.backends.readings import LinkState
from tests.conftest import REPO


def test_every_recovery_action_the_verdict_knows_is_in_the_help_and_the_readme() -> None:
    values = sorted(load_catalog().mappings.recovery_names)
    assert values == list(range(len(values)))
    readme = next(
        line for line in (REPO / "README.md").read_text().splitlines() if "nvidia_gpu_recovery_action" in line
    )
    for value in values:
        assert re.search(rf"\b{value} [A-Za-z]", RECOVERY_ACTION.help), value
        assert re.search(rf"\b{value} [A-Za-z]", readme), value


def test_every_link_state_is_in_the_help() -> None:
    for state in LinkState:
        assert f"{state.value} {state.name.split('_')[0].lower()}" in NVLINK_STATE.help
