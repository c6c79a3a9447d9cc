"""What the readings' metric help says, against the data the verdict is made from."""

from __future__ import annotations

import re

from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.exporter.backends.readings import Clocks, LinkState, Power
from gpu_triage.exporter.metrics.families import CLOCK_EVENT, NVLINK_STATE, POWER, POWER_INSTANT, RECOVERY_ACTION
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


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def test_every_clock_event_bit_pynvml_names_is_decoded_under_its_own_reason() -> None:
    """pynvml 13.615 is the oracle: each nvmlClocks*Reason* bit alone sets exactly the reason it names,
    0x200 (board limit) and 0x400 (reliability) included."""
    import pynvml

    bits = {
        _snake(name.removeprefix("nvmlClocksEventReason").removeprefix("nvmlClocksThrottleReason")): value
        for name, value in vars(pynvml).items()
        if name.startswith(("nvmlClocksEventReason", "nvmlClocksThrottleReason")) and isinstance(value, int)
    }
    names = {"display_clock_setting", "board_limit", "reliability", "gpu_idle", "hw_power_brake_slowdown"}
    assert names <= set(bits)
    for name, bit in bits.items():
        if name in ("none", "all", "user_defined_clocks") or bit & (bit - 1):  # masks and aliases
            continue
        active = {s.labels[0] for s in Clocks({}, {}, bit, None).samples() if s.family is CLOCK_EVENT and s.value}
        assert active == {name}, (name, hex(bit))


def test_power_says_it_is_nvmls_one_second_average_and_the_instant_reading_has_its_own_series() -> None:
    assert "1-second average" in POWER.help and "instant" in POWER.help
    shown = {s.family.name: s.value for s in Power(600.0, 700.0, 1.0, instant_watts=612.345).samples()}
    assert shown["nvidia_gpu_power_watts"] == 600.0 and shown[POWER_INSTANT.name] == 612.345
