"""The poller: one sick GPU or a hung call never stops the others, the next poll, or the snapshot."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.exporter.backends.base import BackendError, GpuIdentity, Result
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Power
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.polling.poller import FAST, SLOW, Poller
from tests.conftest import FakeClock
from tests.daemon_proc import wait_for


class CountingSim(SimBackend):
    """The simulator, counting the reads it is asked for."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(load_scenario("h100-training"), clock=clock)
        self.calls: Counter[tuple[int, Collector]] = Counter()

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        self.calls[(gpu.index, collector)] += 1
        return super().read(gpu, collector)


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[CountingSim]:
    backend = CountingSim(clock)
    yield backend
    backend.close()


def poller(sim: SimBackend, clock: FakeClock, timeout: float = 5.0) -> Poller:  # a loaded machine is slow
    p = Poller(sim, interval=5, slow_interval=60, timeout=timeout, clock=clock)
    p.discover()
    return p


def test_a_full_poll_reads_every_collector_of_every_gpu(sim: SimBackend, clock: FakeClock) -> None:
    snapshot = poller(sim, clock).poll(Collector)
    assert snapshot.taken_at == clock.now and len(snapshot.gpus) == 8
    for gpu in snapshot.gpus:
        assert gpu.up and set(gpu.readings) == set(Collector)
    assert all(status.success for status in snapshot.collectors.values())
    assert set(snapshot.collectors) == set(Collector)


def test_fast_and_slow_polls_merge(sim: SimBackend, clock: FakeClock) -> None:
    p = poller(sim, clock)
    p.poll(SLOW)
    clock.advance(5)
    snapshot = p.poll(FAST)
    assert set(snapshot.gpus[0].readings) == set(Collector)
    assert snapshot.collectors[Collector.ECC].last_success == clock.now - 5
    assert snapshot.collectors[Collector.POWER].last_success == clock.now


def test_lost_gpu_is_marked_and_the_others_keep_reporting(sim: SimBackend, clock: FakeClock) -> None:
    p = poller(sim, clock)
    p.poll(Collector)
    sim.inject(FaultSpec(gpu=3, kind="gpu_lost"))
    snapshot = p.poll(FAST)
    lost = snapshot.gpus[3]
    assert lost.status == GpuStatus.LOST and not lost.up
    assert set(lost.readings) == {Collector.INVENTORY}, "a lost GPU keeps only its descriptive inventory"
    assert all(g.up and g.get(Power) is not None for i, g in enumerate(snapshot.gpus) if i != 3)
    # A lost GPU is the GPU's problem, reported per GPU; the collectors themselves still work.
    assert snapshot.collectors[Collector.POWER].success


def test_hung_call_fails_its_collector_within_the_deadline(sim: CountingSim, clock: FakeClock) -> None:
    p = poller(sim, clock, timeout=0.3)
    p.poll(Collector)
    fault = sim.inject(FaultSpec(gpu=2, kind="hung_call", collector="power"))
    started = time.monotonic()
    snapshot = p.poll(FAST)
    assert time.monotonic() - started < 1.0, "the poll returns at its deadline"
    assert not snapshot.collectors[Collector.POWER].success
    assert snapshot.collectors[Collector.THERMAL].success, "other collectors are not held up"
    hung = snapshot.gpus[2]
    assert hung.status == GpuStatus.HUNG and Collector.POWER not in hung.readings
    assert Collector.THERMAL in hung.readings
    assert snapshot.gpus[1].get(Power) is not None

    # While it stays stuck, later polls neither start another call to it nor grow the threads.
    threads = threading.active_count()
    for _ in range(5):
        p.poll(FAST)
    assert threading.active_count() == threads
    assert sim.calls[(2, Collector.POWER)] == 2  # the first poll's read, and the one that hangs

    sim.clear_fault(fault.id)
    # The hung call returns and its worker, a surplus now, leaves the pool (freeing the GPU's lane first).
    wait_for(lambda: threading.active_count() <= threads - 1, timeout=5, interval=0.01, what="the hung call back")
    recovered = p.poll(FAST)
    assert recovered.gpus[2].up and recovered.collectors[Collector.POWER].success
    assert threading.active_count() == threads - 1, "the replacement worker leaves once the call returns"


class _BrokenAfterDiscovery(SimBackend):
    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        raise BackendError("NVML: DriverNotLoaded")


def test_broken_backend_is_reported_not_raised(clock: FakeClock) -> None:
    backend = _BrokenAfterDiscovery(load_scenario("h100-training"), clock=clock)
    p = Poller(backend, interval=5, slow_interval=60, timeout=0.5, clock=clock)
    p.discover()
    snapshot = p.poll(Collector)
    assert not snapshot.backend_up
    assert not any(status.success for status in snapshot.collectors.values())
    assert all(status.last_success is None for status in snapshot.collectors.values())


def test_snapshot_listener_sees_every_snapshot(sim: SimBackend, clock: FakeClock) -> None:
    seen = []
    p = Poller(sim, interval=5, slow_interval=60, timeout=0.3, clock=clock, on_snapshot=seen.append)
    p.discover()
    first = p.poll(Collector)
    second = p.poll(FAST)
    assert seen == [first, second]


def test_a_gpu_whose_every_call_hangs_does_not_take_the_others_down(sim: CountingSim, clock: FakeClock) -> None:
    """Its reads would fill every worker; lanes keep them to two, and the other GPUs are read in time."""
    p = poller(sim, clock, timeout=0.5)
    p.poll(Collector)
    threads = threading.active_count()
    fault = sim.inject(FaultSpec(gpu=3, kind="hung_call"))
    snapshot = p.poll(FAST)
    assert [g.identity.index for g in snapshot.gpus if not g.up] == [3]
    assert sum(sim.calls[(3, c)] for c in FAST) - len(FAST) == 2, "two of its reads started (and hang)"
    sim.clear_fault(fault.id)
    # Both hung calls return and the workers written off with them leave: the pool is as it was.
    wait_for(lambda: threading.active_count() <= threads, timeout=5, interval=0.01, what="the hung calls back")
    assert all(g.up for g in p.poll(FAST).gpus)


def test_a_slow_collector_written_off_is_read_again_at_the_next_fast_poll(sim: CountingSim, clock: FakeClock) -> None:
    """Once its hung call returns, the GPU is back at the next fast poll, not the next slow one."""
    p = poller(sim, clock, timeout=0.3)
    p.poll(Collector)
    fault = sim.inject(FaultSpec(gpu=4, kind="hung_call", collector="ecc"))
    assert p.poll(SLOW).gpus[4].status == GpuStatus.HUNG
    assert p.poll(FAST).gpus[4].status == GpuStatus.HUNG, "still stuck: not read again, still hung"
    sim.clear_fault(fault.id)
    wait_for(lambda: sim.calls[(4, Collector.ECC)] == 2 and not p._inflight[(4, Collector.ECC)].running(), 5)
    recovered = p.poll(FAST)
    assert recovered.gpus[4].up and Collector.ECC in recovered.gpus[4].readings
    assert sim.calls[(4, Collector.ECC)] == 3, "read once more, at the fast poll"
    assert recovered.collectors[Collector.ECC].success
