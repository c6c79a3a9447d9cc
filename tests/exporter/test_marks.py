"""Acknowledgements and resets (the operator's and the driver's marks): the verdict keeps them
incrementally, a bounded few per GPU, and a pile of them slows neither an acknowledgement nor a poll
(bench/bench_marks.py measures that)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpu_triage.diagnosis.xid.health import GpuVerdict
from gpu_triage.exporter import verdicts
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.sources.journal import Event, Mark
from gpu_triage.exporter.verdicts import MARKS_PER_GPU
from tests.conftest import FakeClock
from tests.daemon_proc import wait_for

JSON = {"content-type": "application/json"}


def health(client: TestClient, gpu: int) -> str:
    body = client.get("/api/v1/diagnosis").json()
    return str(next(g for g in body["gpus"] if g["gpu"] == gpu)["health"])


def test_polls_and_acknowledgements_do_not_reread_every_mark(client: TestClient, daemon: Daemon) -> None:
    reads = []
    marks = daemon.journal.marks
    daemon.journal.marks = lambda: reads.append(1) or marks()  # type: ignore[method-assign]
    for _ in range(5):
        daemon.refresh()  # what every poll does
    assert client.post("/api/v1/gpus/2/acknowledge").status_code == 200
    assert reads == []


def test_an_acknowledgement_closes_what_came_before_it_only(
    client: TestClient, daemon: Daemon, clock: FakeClock
) -> None:
    client.post("/api/v1/sim/faults", json={"gpu": 4, "kind": "xid", "xid": 48})
    wait_for(lambda: health(client, 4) == "unhealthy", 10, interval=0.02, what="the XID")
    clock.advance(10)
    for _ in range(3 * MARKS_PER_GPU):  # more than are kept: the newest is what counts
        assert client.post("/api/v1/gpus/4/acknowledge").status_code == 200
    assert health(client, 4) == "healthy"
    clock.advance(10)
    client.post("/api/v1/sim/faults", json={"gpu": 4, "kind": "xid", "xid": 48})
    wait_for(lambda: health(client, 4) == "unhealthy", 10, interval=0.02, what="the later XID to count")


def test_a_reset_seen_in_the_kernel_log_while_running_closes_what_a_reset_cures(
    client: TestClient, daemon: Daemon, clock: FakeClock
) -> None:
    three = daemon.snapshot.gpus[3].identity
    bus = three.pci_bus_id.removeprefix("0000:")[:-2]  # 5d:00.0 -> 5d:00, as the driver prints it
    kmsg = daemon.settings.kmsg_path
    with kmsg.open("a") as f:
        f.write(f"NVRM: Xid (PCI:0000:{bus}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error\n")
    wait_for(lambda: health(client, 3) == "unhealthy", 10, interval=0.02, what="the XID from the kernel log")
    clock.advance(30)
    with kmsg.open("a") as f:
        f.write(f"NVRM: GPU at PCI:0000:{bus}: {three.uuid}\n")  # the driver brought the GPU up again
    wait_for(lambda: health(client, 3) == "healthy", 10, interval=0.02, what="the reset to close the finding")


def test_marks_journaled_before_a_start_are_loaded_once_and_the_newest_count(
    daemon: Daemon, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = daemon.snapshot.gpus[1].identity
    uuid = gpu.uuid
    times = [clock.now - 1000 + i for i in range(10 * MARKS_PER_GPU)]
    for t in times:
        daemon.journal.mark(Mark(t, uuid, "init", "x"))
    daemon.verdicts.load(clock.now)
    # Resets bear on a GPU's XIDs only: one of those, so that the GPU is judged with them (without any its
    # verdict is its telemetry's, and an unchanged one is not judged again).
    xid = Event(clock.now - 10, daemon.boot_id, "kmsg", "xid", 48, "Xid 48", gpu.index, uuid, gpu.pci_bus_id, id=1)
    daemon.verdicts.add(xid)
    given: dict[str, list[float]] = {}

    def assess_gpu(bus: str, *args: Any, resets: list[float], **kwargs: Any) -> GpuVerdict:
        given[bus] = resets
        return real(bus, *args, resets=resets, **kwargs)

    real = verdicts.assess_gpu
    monkeypatch.setattr(verdicts, "assess_gpu", assess_gpu)
    daemon.refresh()
    assert given[daemon.snapshot.gpus[1].identity.pci_bus_id] == times[-MARKS_PER_GPU:]
