"""Scenario files: the built-in ones load, bad ones are refused with a message that says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_triage.exporter.backends.sim import ScenarioError, builtin_scenarios, load_scenario
from gpu_triage.exporter.backends.sim.scenario import parse_scenario


def test_builtin_scenarios_load_and_describe_themselves() -> None:
    names = {s.name for s in builtin_scenarios()}
    assert {"h100-training", "h100-faults", "b200-training", "h200-mig", "a100-training", "l40s-inference"} <= names
    for s in builtin_scenarios():
        scenario = load_scenario(s.name)
        assert scenario.name == s.name and s.description
        gpus = scenario.node.gpus
        assert gpus.model == gpus.spec.model  # the product's name, which NVML would report
        assert gpus.count == (4 if gpus.product == "l40s" else 8)


def test_a_product_fills_in_its_limits_and_a_scenario_can_override_them() -> None:
    b200 = parse_scenario("name: x\nnode: {gpus: {product: b200}}\nworkload: [{duration_seconds: 1, utilization: 1}]")
    assert (b200.node.gpus.power_limit_watts, b200.node.gpus.nvlink_links) == (1000.0, 18)
    assert b200.node.gpus.memory_bytes == 183359 * 2**20
    capped = parse_scenario(
        "name: x\nnode: {gpus: {product: b200, power_limit_watts: 700}}\nworkload: [{duration_seconds: 1, utilization: 1}]"
    )
    assert capped.node.gpus.power_limit_watts == 700.0
    with pytest.raises(ScenarioError, match=r"no product 'b300'.*a100-sxm4-80gb, b200"):
        parse_scenario("name: x\nnode: {gpus: {product: b300}}\nworkload: [{duration_seconds: 1, utilization: 1}]")
    with pytest.raises(ScenarioError, match="a NVIDIA L40S has no MIG"):
        parse_scenario(
            "name: x\nnode: {gpus: {product: l40s, count: 1, mig_instances: {0: [1g.10gb]}}}\n"
            "workload: [{duration_seconds: 1, utilization: 1}]"
        )
    assert load_scenario("h100-faults").faults, "the fault scenario has faults"
    assert not load_scenario("h100-training").faults, "the healthy scenario has none"


def test_scenario_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(
        """
        name: small
        node: {gpus: {count: 2, nvlink_links: 4}}
        workload: [{duration_seconds: 10, utilization: 0.5}]
        """
    )
    scenario = load_scenario(str(path))
    assert scenario.node.gpus.count == 2 and scenario.cycle_seconds == 10


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\n", "workload: Field required"),
        ("name: x\nworkload: []\n", "workload: List should have at least 1 item"),
        ("name: x\nworkload: [{duration_seconds: 1, utilization: 2}]\n", "less than or equal to 1"),
        ("name: x\nworkload: [{duration_seconds: 1, utilization: 1}]\nspeed: fast\n", "speed: Extra inputs"),
        (
            "name: x\nworkload: [{duration_seconds: 1, utilization: 1}]\n"
            "faults: [{at_seconds: 1, gpu: 9, kind: gpu_lost}]\n",
            "gpu 9 does not exist",
        ),
        (
            "name: x\nworkload: [{duration_seconds: 1, utilization: 1}]\n"
            "faults: [{at_seconds: 1, gpu: 0, kind: nvlink_down, link: 40}]\n",
            "link 40 does not exist",
        ),
        (
            "name: x\nnode: {gpus: {idle_power_watts: 800}}\nworkload: [{duration_seconds: 1, utilization: 1}]\n",
            "idle_power_watts must be below",
        ),
        ("[1, 2]", "must be a YAML mapping"),
        ("name: [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_scenarios_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(text, "test scenario")


def test_missing_and_unreadable_scenarios(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no scenario 'nope': not a file, and the built-in ones are"):
        load_scenario("nope")
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(str(tmp_path / "missing.yaml"))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(str(binary))


@pytest.mark.parametrize(
    ("mig", "message"),
    [
        ("{8: [3g.40gb]}", "GPU 8 does not exist"),
        ("{0: [3g.40]}", "'3g.40' is not a MIG profile of a NVIDIA H100 80GB HBM3"),
        ("{0: [3g.80gb]}", "'3g.80gb' is not a MIG profile of a NVIDIA H100 80GB HBM3 .*3g.40gb"),
        ("{0: [4g.40gb, 4g.40gb]}", "needs 8 compute slices; a GPU has 7"),
        ("{0: [1g.20gb, 1g.20gb, 1g.20gb, 1g.20gb, 1g.20gb]}", "needs 10 memory slices; a GPU has 8"),
    ],
)
def test_impossible_mig_layouts_are_refused(mig: str, message: str) -> None:
    text = f"name: x\nnode: {{gpus: {{mig_instances: {mig}}}}}\nworkload: [{{duration_seconds: 1, utilization: 1}}]\n"
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(text, "test scenario")
