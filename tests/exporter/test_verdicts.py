"""The verdict's view of NVLink: only a link that was up can be down."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import LinkReading, LinkState, NvLink
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.sources.journal import Event, Journal
from gpu_triage.exporter.verdicts import Verdicts

GPU = GpuIdentity(0, "GPU-0", "0000:18:00.0")


def snapshot(states: dict[int, LinkState]) -> Snapshot:
    links = NvLink(tuple(LinkReading(link, state, 0, 0, 0) for link, state in states.items()))
    return Snapshot(1.0, "nvml", (GpuState(GPU, MappingProxyType({Collector.NVLINK: links})),))


def nvlink_findings(verdicts: Verdicts, states: dict[int, LinkState]) -> list[str]:
    node = verdicts.update(snapshot(states), 100.0)
    return [e.text for f in node.gpus[0].findings if f.class_id == "nvlink_down" for e in f.evidence]


def test_an_uncabled_or_sleeping_link_is_not_down_and_a_link_that_dropped_is(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")
    verdicts = Verdicts(journal, "boot-1")
    cabled = {0: LinkState.ACTIVE, 1: LinkState.SLEEP, 2: LinkState.ACTIVE_TRAFFIC_DISABLED}
    # Link 3 is not cabled: inactive from the first poll on.
    assert nvlink_findings(verdicts, {**cabled, 3: LinkState.INACTIVE}) == []
    assert nvlink_findings(verdicts, {**cabled, 0: LinkState.INACTIVE, 3: LinkState.INACTIVE}) == [
        "NVML: NVLink links down: 0"
    ]
    journal.close()


def test_a_storm_of_one_code_does_not_push_out_the_code_that_decides(tmp_path: Path) -> None:
    """An uncorrectable ECC error (Xid 48), then thousands of Xid 13 from the jobs that hit the broken memory:
    the verdict is still the 48's."""
    journal = Journal(tmp_path / "journal.sqlite3")
    verdicts = Verdicts(journal, "boot-1")
    state = Snapshot(1.0, "nvml", (GpuState(GPU),))

    def xid(n: int, code: int, ts: float) -> Event:
        return Event(ts, "boot-1", "kmsg", "xid", code, f"Xid {code}", 0, GPU.uuid, GPU.pci_bus_id, id=n)

    verdicts.add(xid(1, 48, 1000.0))
    before = verdicts.update(state, 1001.0).gpus[0].action
    for n in range(2, 6002):
        verdicts.add(xid(n, 13, 1001.0 + n / 100))
    after = verdicts.update(state, 1100.0).gpus[0]
    assert before in {f.action for f in after.findings if f.class_id == "xid_48"}
    assert after.action == before, "the storm of Xid 13 does not change what the node needs"
    journal.close()
