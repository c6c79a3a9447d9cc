"""The node's verdict beyond its GPUs: what it cannot see, and XIDs on devices that are none of its GPUs."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.core.actions import Action, GpuStatus, Health
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.health import Telemetry, assess_gpu
from gpu_triage.diagnosis.xid.incidents import Occurrence
from gpu_triage.diagnosis.xid.node_verdict import OTHER_DEVICES, Blind, assess_node, unknown_device_findings

NOW = 1_764_600_000.0
BLIND = Blind("kmsg", "Permission denied (/dev/kmsg)")


def gpu(xids: list[int] = [], telemetry: Telemetry | None = None, bus: str = "0000:18:00.0"):  # noqa: B006
    occurrences = [
        Occurrence(code, f"NVRM: Xid (PCI:{bus[5:-2]}): {code}, x", NOW - 60, "b1", i) for i, code in enumerate(xids)
    ]
    return assess_gpu(bus, occurrences, telemetry or Telemetry(), boot_id="b1", now=NOW)


def test_a_daemon_that_cannot_see_never_calls_the_node_healthy() -> None:
    assert assess_node([gpu(), gpu()]).health is Health.HEALTHY
    node = assess_node([gpu(), gpu()], incomplete=[BLIND])
    assert node.health is Health.UNKNOWN and node.incomplete == (BLIND,)
    [finding] = node.findings
    assert (finding.class_id, finding.playbook, finding.details["source"]) == (
        "kernel_log_unreadable",
        "kernel-log-unreadable",
        "kmsg",
    )
    assert [e.text for e in finding.evidence] == ["Permission denied (/dev/kmsg)"]
    assert assess_node([gpu([13])], incomplete=[BLIND]).health is Health.UNKNOWN, "degraded is not enough to say"


def test_what_it_did_see_still_counts() -> None:
    node = assess_node([gpu([79]), gpu()], incomplete=[BLIND])
    assert (node.health, node.action) == (Health.UNHEALTHY, Action.REBOOT_NODE)


@pytest.mark.parametrize("source", ["kmsg", "nvml", "dcgm", "journal", "xid", "backend"])
def test_every_source_has_a_condition_and_a_playbook(source: str) -> None:
    [finding] = assess_node([gpu()], incomplete=[Blind(source, "down")]).findings
    assert finding.playbook and finding.action is Action.FIX_CONFIG


@pytest.mark.parametrize("code", [13, 31, 43, 48, 79, 94, 119])
def test_an_unknown_devices_xid_is_judged_by_its_code(code: int) -> None:
    entry = load_catalog().get(code)
    assert entry is not None
    line = f"NVRM: Xid (PCI:0000:ee:00): {code}, pid=1, name=x, y"
    [found] = unknown_device_findings("0000:ee:00.0", [Occurrence(code, line, NOW - 5, "b1", 7)], boot_id="b1", now=NOW)
    assert (found.class_id, found.gpu, found.action, found.severity) == (
        "unknown_device",
        None,
        entry.action,
        entry.severity,
    )
    assert [(e.line, e.text) for e in found.evidence] == [(7, line)], "the kernel's line is the only evidence"
    assert found.details["pci_bus_id"] == "0000:ee:00.0" and found.details["xid"] == code
    assert found.playbook == entry.playbook


def test_an_unknown_device_is_no_gpu_of_the_node() -> None:
    found = unknown_device_findings("0000:ee:00.0", [Occurrence(13, "x", NOW, "b1")], boot_id="b1", now=NOW)
    node = assess_node([gpu()], found)
    assert [g.gpu for g in node.gpus] == ["0000:18:00.0"] and node.gpus[0].health is Health.HEALTHY
    assert (node.health, node.action) == (Health.DEGRADED, Action.CHECK_APP)
    assert "not list" in found[0].title and "0000:ee:00.0" in found[0].title


def test_the_bucket_of_other_devices_says_what_it_is() -> None:
    [found] = unknown_device_findings(OTHER_DEVICES, [Occurrence(43, "x", NOW, "b1")], boot_id="b1", now=NOW)
    assert "more unknown devices than gpu-triage keeps apart" in found.title


def test_a_lost_gpu_says_since_when_and_what_the_backend_answered() -> None:
    lost = Telemetry(
        status=GpuStatus.LOST, lost_since=NOW - 300, lost_answer="GPU 5: NVML_ERROR_GPU_IS_LOST (reading power)"
    )
    [finding] = gpu(telemetry=lost).findings
    assert finding.class_id == "gpu_lost" and finding.details["first_seen"] == int(NOW - 300)
    assert [(e.line, e.text) for e in finding.evidence] == [(None, "GPU 5: NVML_ERROR_GPU_IS_LOST (reading power)")]


def test_a_gpu_lost_with_its_xid_79_is_one_finding() -> None:
    lost = Telemetry(status=GpuStatus.LOST, lost_since=NOW - 50, lost_answer="GPU 0: NVML_ERROR_GPU_IS_LOST")
    verdict = gpu([79], lost)
    [finding] = verdict.findings
    assert finding.class_id == "xid_79" and verdict.action is Action.REBOOT_NODE
    assert finding.evidence[-1].text == "GPU 0: NVML_ERROR_GPU_IS_LOST"
