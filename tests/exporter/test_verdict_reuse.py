"""A GPU with no XID history is judged again only when its telemetry changes, and the verdict kept is the verdict
a full judgement gives: on the simulator's own telemetry, through faults that come and go and an XID."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.diagnosis.core.actions import Health
from gpu_triage.diagnosis.xid.node_verdict import NodeVerdict
from gpu_triage.exporter import verdicts as verdicts_module
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.polling.poller import FAST, SLOW, Poller
from gpu_triage.exporter.sources.journal import Event, Journal
from gpu_triage.exporter.verdicts import Verdicts
from tests.conftest import FakeClock


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[SimBackend]:
    backend = SimBackend(load_scenario("h100-training"), clock=clock)
    yield backend
    backend.close()


class Judged:
    """Counts the judgements made (assess_gpu calls)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = verdicts_module.assess_gpu

        def counting(*args: object, **kwargs: object) -> object:
            self.count += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(verdicts_module, "assess_gpu", counting)


def _as_shown(node: NodeVerdict) -> tuple[object, ...]:
    return (node.health, node.action, node.gpus, node.findings, node.incomplete)


def test_a_kept_verdict_is_the_one_a_full_judgement_gives(
    tmp_path: Path, sim: SimBackend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged = Judged(monkeypatch)
    journals = [Journal(tmp_path / f"{name}.sqlite3") for name in ("kept", "full")]
    kept, full = (Verdicts(j, "boot-1") for j in journals)
    poller = Poller(sim, interval=5, slow_interval=60, timeout=5.0, clock=clock)
    gpus = poller.discover()
    poller.poll(SLOW)

    def both(step: str) -> NodeVerdict:
        snapshot = poller.poll(FAST)
        full._quiet.clear()  # judged afresh every time
        got, want = kept.update(snapshot, clock.now), full.update(snapshot, clock.now)
        assert _as_shown(got) == _as_shown(want), step
        clock.advance(5)
        return got

    both("first poll")
    judged.count = 0
    node = both("the same telemetry again")
    assert judged.count == len(gpus), "the full judgement judged every GPU; the kept one none"
    assert node.health is Health.HEALTHY

    thermal = sim.inject(FaultSpec(gpu=2, kind="thermal_slowdown"))
    judged.count = 0
    node = both("a GPU slows down for heat")
    assert judged.count == len(gpus) + 1, "only the GPU whose telemetry changed is judged again"
    assert [f.class_id for f in node.gpus[2].findings] == ["thermal_slowdown"]
    shown = node.gpus[2].findings[0]
    again = both("still slowed down")
    assert again.gpus[2].findings[0] is not shown, "a kept finding is a copy: the last frame's stays as shown"
    assert again.gpus[2].findings[0].details == shown.details

    sim.inject(FaultSpec(gpu=5, kind="gpu_lost"))
    both("a GPU falls off the bus")
    lost = both("still lost")
    assert lost.gpus[5].health is Health.UNHEALTHY

    sim.clear_fault(thermal.id)
    assert both("cool again").gpus[2].findings == ()

    # An XID: that GPU has history now, and is judged every time (the clock bears on its findings).
    g = gpus[1]
    for verdicts in (kept, full):
        verdicts.add(Event(clock.now, "boot-1", "kmsg", "xid", 48, "Xid 48", g.index, g.uuid, g.pci_bus_id, id=1))
    judged.count = 0
    node = both("an XID on GPU 1")
    assert judged.count == len(gpus) + 1, "GPU 1 judged again; the others kept"
    assert node.gpus[1].health is Health.UNHEALTHY
    for journal in journals:
        journal.close()
