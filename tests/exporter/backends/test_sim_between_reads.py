"""Reads between the simulator's events change nothing: faults start and run out exactly when due, and a GPU read
four times a second reads as one read once at the same moment.

A read with no scenario fault due, no whole second passed and no fault running out takes no lock and scans
nothing (backend.py `_advance`, faults.py `FaultBook.expire`); these tests hold that shortcut to the long way.
"""

from __future__ import annotations

import contextlib

from gpu_triage.exporter.backends.base import GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import ClockEventReason, Clocks
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.backends.sim.faults import FaultBook, ScheduledFault
from tests.conftest import START, FakeClock

# h100-faults.yaml: a thermal slowdown on GPU 2 from 60 s for 300 s, an NVLink link of GPU 4 down from 180 s for 120 s.
_SLOWDOWN_GPU, _SLOWDOWN_AT, _SLOWDOWN_FOR = 2, 60.0, 300.0
# The seconds its faults start or run out at (and the next), where a shortcut taken wrongly would show first.
_EVENTS = {s + d for s in (60, 90, 120, 180, 300, 301, 360, 420) for d in (0, 1)}


def read_all(sim: SimBackend) -> list[str]:
    out = []
    for gpu in sim.discover():
        for collector in Collector:
            try:
                out.append(repr(sim.read(gpu, collector).reading))
            except Exception as e:  # a lost GPU answers this, the same both ways
                out.append(f"{type(e).__name__}: {e}")
    return out


def touch(sim: SimBackend) -> None:
    """A read of each GPU, as a poll between the moments a test looks at."""
    for gpu in sim.discover():
        with contextlib.suppress(GpuLostError):  # a lost GPU answers this, the same both ways
            sim.read(gpu, Collector.POWER)


def thermal_slowdown(sim: SimBackend) -> bool:
    reading = sim.read(sim.discover()[_SLOWDOWN_GPU], Collector.CLOCKS).reading
    assert isinstance(reading, Clocks)
    return bool(reading.event_reasons & ClockEventReason.HW_THERMAL_SLOWDOWN.bit)


def test_a_scheduled_fault_starts_and_ends_at_its_time_whatever_the_reads_between() -> None:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-faults"), clock=clock)
    clock.advance(_SLOWDOWN_AT - 3)
    while clock.now < START + _SLOWDOWN_AT - 0.25:  # read every GPU four times a second until just before
        clock.advance(0.25)
        touch(sim)
    assert not thermal_slowdown(sim)
    clock.advance(0.25)
    assert thermal_slowdown(sim)
    [fault] = [f for f in sim.faults() if f.spec.kind == "thermal_slowdown"]
    assert fault.started_at == START + _SLOWDOWN_AT
    clock.advance(_SLOWDOWN_FOR - 3)
    while clock.now < START + _SLOWDOWN_AT + _SLOWDOWN_FOR - 0.25:
        clock.advance(0.25)
        touch(sim)
    assert thermal_slowdown(sim)
    clock.advance(0.25)
    assert not thermal_slowdown(sim)
    assert [f for f in sim.faults() if f.spec.kind == "thermal_slowdown"] == []
    sim.close()


def test_a_fault_due_between_two_ticks_starts_at_its_time() -> None:
    """Due within a second already taken: only the fault's own time can send the read the long way."""
    fault = ScheduledFault(at_seconds=10.5, gpu=_SLOWDOWN_GPU, kind="thermal_slowdown", duration_seconds=0.5)
    scenario = load_scenario("h100-training")
    clock = FakeClock()
    sim = SimBackend(scenario.model_copy(update={"faults": [fault]}), clock=clock)
    clock.advance(10.25)
    touch(sim)
    assert sim.faults() == []
    clock.advance(0.25)  # 10.5 s, still in tick 10
    touch(sim)
    [started] = sim.faults()
    assert started.spec.kind == "thermal_slowdown" and started.started_at == START + 10.5
    clock.advance(0.25)
    touch(sim)
    assert len(sim.faults()) == 1
    clock.advance(0.25)  # 11 s: it ran out
    touch(sim)
    assert sim.faults() == []
    sim.close()


def test_reads_four_times_a_second_read_as_one_read_at_each_moment() -> None:
    """Through the scenario's faults (starting, running out, a GPU lost): the dense backend takes the shortcut on
    most reads, the sparse one reads each second once, the long way."""
    dense_clock, sparse_clock = FakeClock(), FakeClock()
    dense = SimBackend(load_scenario("h100-faults"), clock=dense_clock)
    sparse = SimBackend(load_scenario("h100-faults"), clock=sparse_clock)
    for second in range(1, 431):  # past the GPU lost at 420 s
        for _ in range(3):
            dense_clock.advance(0.25)
            touch(dense)
        dense_clock.advance(0.25)
        if second % 5 and second not in _EVENTS:
            continue
        sparse_clock.now = START + second
        assert read_all(dense) == read_all(sparse), f"at {second} s"
        assert [(f.spec, f.started_at) for f in dense.faults()] == [(f.spec, f.started_at) for f in sparse.faults()]
    dense.close()
    sparse.close()


def test_an_injected_fault_runs_out_at_its_end_between_reads(sim: SimBackend, clock: FakeClock) -> None:
    sim.inject(FaultSpec(gpu=_SLOWDOWN_GPU, kind="thermal_slowdown", duration_seconds=2.5))
    for _ in range(9):
        clock.advance(0.25)
        assert thermal_slowdown(sim)
    clock.advance(0.25)  # 2.5 s
    assert not thermal_slowdown(sim)
    assert sim.faults() == []


def test_the_book_expires_each_fault_at_its_end_after_adds_and_removals() -> None:
    book = FaultBook()
    long = book.add(FaultSpec(gpu=0, kind="gpu_lost", duration_seconds=100), 0.0, "api")
    book.expire(1.0)
    short = book.add(FaultSpec(gpu=1, kind="gpu_lost", duration_seconds=10), 0.0, "api")  # ends before `long`
    book.expire(9.9)
    assert {f.id for f in book.all()} == {long.id, short.id}
    book.expire(10.0)
    assert [f.id for f in book.all()] == [long.id]
    assert book.remove(long.id)
    later = book.add(FaultSpec(gpu=2, kind="gpu_lost", duration_seconds=50), 20.0, "api")
    book.expire(69.9)
    assert [f.id for f in book.all()] == [later.id]
    book.expire(70.0)
    assert book.all() == []
    book.clear()
    again = book.add(FaultSpec(gpu=3, kind="gpu_lost", duration_seconds=1), 80.0, "api")
    assert book.on(3, 80.5) == [again]
    book.expire(81.0)
    assert book.all() == [] and book.on(3, 80.5) == []
