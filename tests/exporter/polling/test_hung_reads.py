"""Reads that hang or run slow, per GPU and collector, through the real Poller, poll after poll: what any way
of scheduling the reads must keep. A hung call holds one thread and is not started again while stuck; the
GPU's other collectors and the other GPUs are still read in the same poll, however late in it the call hangs;
the queue does not grow while the hang lasts; the GPU is back at the poll after the call returns."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.exporter.backends.base import GpuIdentity, Result
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.polling.poller import FAST, SLOW, Poller
from gpu_triage.exporter.polling.snapshot import Snapshot
from tests.conftest import FakeClock
from tests.daemon_proc import wait_for

Key = tuple[int, Collector]


class GatedSim(SimBackend):
    """The simulator, with reads a test makes slow (a sleep first) or hang (until released), per GPU and
    collector; it counts the reads started and the reads returned."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(load_scenario("h100-training"), clock=clock)
        self.started: Counter[Key] = Counter()
        self.returned: Counter[Key] = Counter()
        self._count = threading.Lock()
        self._gates: dict[Key, threading.Event] = {}
        self._slow: dict[Key, float] = {}

    def hang(self, gpu: int, collector: Collector) -> None:
        self._gates[(gpu, collector)] = threading.Event()

    def release(self, gpu: int, collector: Collector) -> None:
        self._gates.pop((gpu, collector)).set()

    def release_all(self) -> None:
        for key in list(self._gates):
            self.release(*key)

    def slow(self, gpu: int, collector: Collector, seconds: float) -> None:
        self._slow[(gpu, collector)] = seconds

    def slow_none(self) -> None:
        self._slow.clear()

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        key = (gpu.index, collector)
        with self._count:
            self.started[key] += 1
        try:
            if seconds := self._slow.get(key):
                time.sleep(seconds)
            if (gate := self._gates.get(key)) is not None:
                gate.wait()
            return super().read(gpu, collector)
        finally:
            with self._count:
                self.returned[key] += 1


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[GatedSim]:
    backend = GatedSim(clock)
    yield backend
    backend.release_all()  # no read left hanging in a worker after the test
    backend.close()


def started_poller(sim: GatedSim, clock: FakeClock, timeout: float) -> tuple[Poller, int]:
    """A poller past its first full poll, and the threads alive then."""
    p = Poller(sim, interval=5, slow_interval=60, timeout=timeout, clock=clock)
    p.discover()
    assert all(g.up for g in p.poll(Collector).gpus)
    return p, threading.active_count()


def backlog(p: Poller) -> int:
    assert p._pool is not None
    return p._pool.backlog()


def returned(p: Poller, sim: GatedSim, gpu: int, collector: Collector, reads: int) -> None:
    """Until the backend has returned `reads` reads of (gpu, collector), the last one handed to the poller."""
    wait_for(
        lambda: sim.returned[(gpu, collector)] == reads and p._inflight[(gpu, collector)].done(),
        timeout=5,
        interval=0.01,
        what="the call back",
    )


def threads_back_to(count: int) -> None:
    """A thread written off with a call leaves once the call returns (after its outcome is handed over)."""
    wait_for(lambda: threading.active_count() <= count, timeout=5, interval=0.01, what=f"{count} threads")


def assert_read(snapshot: Snapshot, gpu: int, hung: set[Collector]) -> None:
    """GPU `gpu` is hung on exactly `hung`, and has this poll's readings of every other fast collector."""
    state = snapshot.gpus[gpu]
    assert dict(state.problems) == dict.fromkeys(hung, GpuStatus.HUNG)
    assert set(FAST) - hung <= set(state.readings) and not hung & set(state.readings)


def assert_others_up(snapshot: Snapshot, but: int) -> None:
    for state in snapshot.gpus:
        if state.identity.index != but:
            assert state.up and set(FAST) <= set(state.readings), state.identity.index


def test_a_call_that_stays_hung_holds_one_thread_and_nothing_queued_poll_after_poll(
    sim: GatedSim, clock: FakeClock
) -> None:
    p, threads = started_poller(sim, clock, timeout=0.3)
    sim.hang(2, Collector.POWER)
    for _ in range(20):
        snapshot = p.poll(FAST)
        assert_read(snapshot, 2, {Collector.POWER})
        assert_others_up(snapshot, but=2)
        threads_back_to(threads + 1)
        assert backlog(p) == 0, "no read is left waiting for a worker"
    assert sim.started[(2, Collector.POWER)] == 2, "the first poll's read, and the one that hangs: not again"
    for gpu in range(8):
        for c in FAST:
            if (gpu, c) != (2, Collector.POWER):
                assert sim.started[(gpu, c)] == sim.returned[(gpu, c)] == 21, (gpu, c)

    sim.release(2, Collector.POWER)
    returned(p, sim, 2, Collector.POWER, 2)
    back = p.poll(FAST)
    assert back.gpus[2].up and Collector.POWER in back.gpus[2].readings
    assert back.collectors[Collector.POWER].success
    assert sim.started[(2, Collector.POWER)] == 3
    threads_back_to(threads)  # the thread written off with the call has left


def test_a_gpu_whose_every_call_hangs_holds_two_threads_and_a_queue_that_does_not_grow(
    sim: GatedSim, clock: FakeClock
) -> None:
    p, threads = started_poller(sim, clock, timeout=0.3)
    for c in FAST:
        sim.hang(3, c)
    queued = []
    for _ in range(10):
        snapshot = p.poll(FAST)
        assert snapshot.gpus[3].status == GpuStatus.HUNG
        assert_others_up(snapshot, but=3)
        threads_back_to(threads + 2)
        queued.append(backlog(p))
    assert queued == [len(FAST) - 2] * 10, "its reads wait behind its two stuck ones, each once"
    assert sum(sim.started[(3, c)] for c in FAST) == len(FAST) + 2

    sim.release_all()
    wait_for(lambda: backlog(p) == 0, timeout=5, interval=0.01, what="the waiting reads done")
    threads_back_to(threads)
    back = p.poll(FAST)
    assert back.gpus[3].up and set(FAST) <= set(back.gpus[3].readings)


# (GPU, collector) reads slow for a share of the deadline, and the calls that hang after them.
LATE = {
    "at once": ({}, [(5, Collector.UTILIZATION)]),
    "after another GPU's slow read": ({(0, Collector.UTILIZATION): 0.5}, [(5, Collector.UTILIZATION)]),
    "after slow reads of its own": (
        {(5, Collector.UTILIZATION): 0.4, (5, Collector.MEMORY): 0.4},
        [(5, Collector.POWER)],
    ),
    "on its last but one read": ({(0, Collector.UTILIZATION): 0.5}, [(5, Collector.RECOVERY)]),
    "after a slow start in the call itself": ({(5, Collector.POWER): 0.4}, [(5, Collector.POWER)]),
    "on three GPUs": (
        {(0, Collector.MEMORY): 0.3},
        [(2, Collector.CLOCKS), (5, Collector.POWER), (7, Collector.HEALTH)],
    ),
}


@pytest.mark.parametrize("case", LATE)
def test_a_call_that_hangs_late_in_a_poll_holds_up_none_of_the_gpus_other_reads(
    sim: GatedSim, clock: FakeClock, case: str
) -> None:
    timeout = 0.8
    slow, hung = LATE[case]
    p, _ = started_poller(sim, clock, timeout=timeout)
    for (i, c), share in slow.items():
        sim.slow(i, c, share * timeout)
    for i, c in hung:
        sim.hang(i, c)
    started = time.monotonic()
    snapshot = p.poll(FAST)
    assert time.monotonic() - started < timeout + 0.5, "the poll ends at its deadline"
    for i, c in hung:
        assert_read(snapshot, i, {c})
        assert all(sim.started[(i, c)] == 2 for c in FAST), "each read once this poll"
    for state in snapshot.gpus:
        if state.identity.index not in {i for i, _ in hung}:
            assert state.up and set(FAST) <= set(state.readings), state.identity.index


def test_a_slow_collector_that_hung_is_read_again_at_the_next_fast_poll(sim: GatedSim, clock: FakeClock) -> None:
    p, _ = started_poller(sim, clock, timeout=0.3)
    sim.hang(4, Collector.ECC)
    assert p.poll(SLOW).gpus[4].problems == {Collector.ECC: GpuStatus.HUNG}
    still = p.poll(FAST)
    assert still.gpus[4].problems == {Collector.ECC: GpuStatus.HUNG}, "still stuck: still hung"
    assert sim.started[(4, Collector.ECC)] == 2, "and not started again"
    sim.release(4, Collector.ECC)
    returned(p, sim, 4, Collector.ECC, 2)
    back = p.poll(FAST)
    assert back.gpus[4].up and Collector.ECC in back.gpus[4].readings
    assert back.collectors[Collector.ECC].success
    assert sim.started[(4, Collector.ECC)] == 3, "read once more, at the fast poll"


def test_a_read_that_hangs_after_its_poll_ended_does_not_hold_up_the_next_polls(
    sim: GatedSim, clock: FakeClock
) -> None:
    """A read waiting behind its GPU's two stuck ones starts when one returns, after its poll has ended: if it
    hangs then, no poll is waiting on it (a slow read, and fast polls come next), yet it holds a worker."""
    p, _ = started_poller(sim, clock, timeout=0.4)
    for c in SLOW:
        sim.hang(3, c)
    assert p.poll(SLOW).gpus[3].status == GpuStatus.HUNG
    first, _, late, _ = SLOW  # the first two stuck, the other two waiting behind them
    sim.release(3, first)
    wait_for(lambda: sim.started[(3, late)] == 2, timeout=5, interval=0.01, what="the late read started")
    for _ in range(3):
        assert_others_up(p.poll(FAST), but=3)  # its lane is taken by two stuck calls: it is hung


def test_a_slow_poll_whose_reads_each_wait_a_little_is_read_within_its_deadline(
    sim: GatedSim, clock: FakeClock
) -> None:
    """NVML's GPM pairs two samples 110 ms apart when it has none kept (the first poll, after an error): each
    GPU's profiling read sleeps, short of anything a look writes off; one after another they would take longer
    than the deadline (here: every slow read of every GPU waits a twentieth of it)."""
    timeout = 0.8
    p, _ = started_poller(sim, clock, timeout=timeout)
    for gpu in range(8):
        for c in SLOW:
            sim.slow(gpu, c, timeout / 20)
    assert len(SLOW) * 8 / 20 > 1, "one after another they miss the deadline"
    snapshot = p.poll(Collector)
    assert all(g.up and set(Collector) <= set(g.readings) for g in snapshot.gpus)


def test_the_polls_after_a_slow_poll_that_ran_past_its_deadline_are_read(sim: GatedSim, clock: FakeClock) -> None:
    """The first full poll of a large node can overrun (each GPU's first GPM read waits): its reads still
    queued at the deadline run after it, on the workers it added, and those leave; the fast polls go on."""
    timeout = 0.4
    p, _ = started_poller(sim, clock, timeout=timeout)
    for gpu in range(8):
        for c in Collector:
            sim.slow(gpu, c, timeout / 20)  # short of a look's write-off, and 112 of them: past the deadline
    assert not all(g.up for g in p.poll(Collector).gpus)
    sim.slow_none()
    wait_for(lambda: sim.returned == sim.started and not backlog(p), timeout=5, interval=0.01, what="the reads back")
    for _ in range(3):
        snapshot = p.poll(FAST)
        assert all(g.up and set(FAST) <= set(g.readings) for g in snapshot.gpus)
