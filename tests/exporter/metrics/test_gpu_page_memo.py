"""The per-GPU families a page keeps from the last one: each page is what prometheus_client writes for the
same snapshot's samples put in ordinary families, whatever came and went between two pages."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import (
    Inventory,
    LinkReading,
    NvLink,
    Processes,
    ProcessReading,
    Profiling,
    Reading,
)
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.metrics.exposition import encode, format_number, format_value
from gpu_triage.exporter.metrics.families import FAMILIES
from gpu_triage.exporter.metrics.gpu import GpuFamilies
from gpu_triage.exporter.polling.poller import FAST, SLOW
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from tests.conftest import FakeClock, settings
from tests.exporter.metrics.test_exposition import reference_encode

_INFO_LABELS = [
    "gpu",
    "uuid",
    "pci_bus_id",
    "model",
    "serial",
    "vbios_version",
    "driver_version",
    "cuda_driver_version",
]


def ordinary_families(snapshot: Snapshot, info_help: str) -> list[Metric]:
    """The per-GPU families built the plain way, with prometheus_client's own classes and sample lists, from
    each reading's samples: a value the GPU lacks left out, a preferred source's series winning over another's."""
    info = InfoMetricFamily("nvidia_gpu", info_help, labels=_INFO_LABELS)
    families = {f.name: Metric(f.name, f.help, "counter" if f.counter else "gauge", f.unit) for f in FAMILIES}
    for state in snapshot.gpus:
        g = state.identity
        inv = state.get(Inventory)
        described = (
            (inv.name, inv.serial, inv.vbios_version, inv.driver_version, inv.cuda_driver_version) if inv else ()
        )
        info.add_metric([str(g.index), g.uuid, g.pci_bus_id, *(d or "" for d in described or [""] * 5)], {})
        families["nvidia_gpu_up"].add_sample("nvidia_gpu_up", {"gpu": str(g.index), "uuid": g.uuid}, float(state.up))
        samples = [s for r in state.readings.values() for s in r.samples() if s.value is not None]
        preferred = {(s.family, s.labels, s.extra) for s in samples if s.preferred}
        for s in samples:
            if not s.preferred and (s.family, s.labels, s.extra) in preferred:
                continue
            labels = {
                "gpu": str(g.index),
                "uuid": g.uuid,
                **dict(zip(s.family.labels, s.labels, strict=True)),
                **dict(s.extra),
            }
            name = s.family.name + ("_total" if s.family.counter else "")
            families[s.family.name].add_sample(name, labels, float(s.value))  # type: ignore[arg-type]
    return [info, *families.values()]


def check_page(builder: GpuFamilies, snapshot: Snapshot) -> bytes:
    """The builder's page for `snapshot`, both formats checked against prometheus_client's; the text one."""
    families = builder.build(snapshot)
    ours = encode(families)
    assert ours == reference_encode(ordinary_families(snapshot, families[0].documentation))
    return ours[0]


@pytest.fixture
def node(tmp_path: Path) -> tuple[Daemon, SimBackend, FakeClock]:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-faults"), clock=clock)
    daemon = Daemon(sim, settings(tmp_path), clock=clock)
    daemon.poller.discover()
    yield daemon, sim, clock
    daemon.stop()


def test_page_after_page_is_what_prometheus_client_writes(node: tuple[Daemon, SimBackend, FakeClock]) -> None:
    daemon, sim, clock = node
    builder = GpuFamilies()
    clock.advance(100)
    check_page(builder, daemon.poller.poll(Collector))
    faults = {
        3: FaultSpec(gpu=2, kind="nvlink_down", link=5),
        5: FaultSpec(gpu=4, kind="ecc_uncorrectable"),
        7: FaultSpec(gpu=6, kind="thermal_slowdown"),
        9: FaultSpec(gpu=7, kind="gpu_lost"),
    }
    for step in range(12):
        clock.advance(5)
        if step in faults:
            sim.inject(faults[step])
        # Mostly the fast collectors, as the poller reads them; now and then the slow ones too.
        page = check_page(builder, daemon.poller.poll(FAST if step % 4 else SLOW))
    assert b'nvidia_gpu_up{gpu="7"' in page and b"nvidia_gpu_nvlink_state" in page


def test_the_same_snapshot_twice_gives_the_same_page(node: tuple[Daemon, SimBackend, FakeClock]) -> None:
    daemon, _, clock = node
    clock.advance(100)
    snapshot = daemon.poller.poll(Collector)
    builder = GpuFamilies()
    assert check_page(builder, snapshot) == check_page(builder, snapshot) == check_page(GpuFamilies(), snapshot)


def _drop(snapshot: Snapshot, **changes: object) -> Snapshot:
    return dataclasses.replace(snapshot, **changes)  # type: ignore[arg-type]


def test_what_is_gone_takes_its_series_with_it(node: tuple[Daemon, SimBackend, FakeClock]) -> None:
    daemon, _, clock = node
    clock.advance(100)
    full = daemon.poller.poll(Collector)
    builder = GpuFamilies()
    assert b'gpu="3"' in check_page(builder, full)

    # A GPU that disappears.
    without_gpu = _drop(full, gpus=tuple(g for g in full.gpus if g.identity.index != 3))
    assert b'gpu="3"' not in check_page(builder, without_gpu)

    # A link that disappears, and a process that ends, on GPU 0; GPU 1 loses its ECC reading (its collector failed).
    g0, g1 = full.gpus[0], full.gpus[1]
    nvlink = g0.readings[Collector.NVLINK]
    assert isinstance(nvlink, NvLink) and len(nvlink.links) > 1
    last_link = nvlink.links[-1].link
    fewer = {**g0.readings, Collector.NVLINK: NvLink(nvlink.links[:-1])}
    busy = Processes((ProcessReading(4242, "python3", 1 << 30),))
    fewer[Collector.PROCESSES] = busy
    no_ecc = {c: r for c, r in g1.readings.items() if c is not Collector.ECC}
    changed = _drop(
        full,
        gpus=(GpuState(g0.identity, fewer), GpuState(g1.identity, no_ecc, g1.problems), *full.gpus[2:]),
    )
    page = check_page(builder, changed)
    link_lines = [line for line in page.splitlines() if line.startswith(b"nvidia_gpu_nvlink_state")]
    assert len(link_lines) == len(nvlink.links) * len(full.gpus[1:]) + len(nvlink.links) - 1  # GPU 0: one fewer
    assert not any(b'gpu="0"' in line and f'link="{last_link}"'.encode() in line for line in link_lines)
    assert b'pid="4242"' in page
    assert not any(b"nvidia_gpu_ecc_errors" in line and b'gpu="1"' in line for line in page.splitlines())

    # Back as it was: the process is gone, the link, the ECC series and the GPU are back.
    page = check_page(builder, full)
    assert b'pid="4242"' not in page and b'gpu="3"' in page
    assert any(b"nvidia_gpu_ecc_errors" in line and b'gpu="1"' in line for line in page.splitlines())


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 1.0, -1.0, 0.5, 999999.0, 1e6, 1234567.0, 9999999.5, 6262997788672.0, 2.0**53 + 2, 1e16, 1.5e16,
     1e300, -1234567.0, 1e-5, 5e-324, math.inf, -math.inf, math.nan],
)  # fmt: skip
def test_format_value_is_prometheus_clients(value: float) -> None:
    assert format_value(value) == floatToGoString(value)  # type: ignore[no-untyped-call]
    assert format_number(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    "value",
    [0, 1, -1, 7, 999999, 10**6, 10**6 + 1, 1234567, 9999999, 10**7, 12 * 10**6, 807102904320, 6262997788672,
     10**15, 2**53 - 1, 2**53, 2**53 + 1, 10**16 - 1, 10**16, 10**16 + 1, 10**17 + 3, 2**64 + 5, -999999,
     -(10**6), -1234567, -(2**53) + 1, -(2**53) - 1, -(10**16) - 1, True, False],
)  # fmt: skip
def test_an_int_is_written_as_prometheus_client_writes_it(value: int) -> None:
    assert format_number(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


def test_a_source_that_stops_overriding_and_a_new_gpu_in_an_old_place(
    node: tuple[Daemon, SimBackend, FakeClock],
) -> None:
    """The profiling reading going away alone (its per-link figures no longer win over NVLink's own rates, whose
    key did not change), and another GPU at the same index (a swap, or a reset that renumbered): each page is
    still prometheus_client's for its snapshot."""
    daemon, _, clock = node
    clock.advance(100)
    full = daemon.poller.poll(Collector)
    builder = GpuFamilies()
    before = check_page(builder, full)
    g0 = full.gpus[0]
    assert Collector.PROFILING in g0.readings
    unprofiled = {c: r for c, r in g0.readings.items() if c is not Collector.PROFILING}
    page = check_page(builder, _drop(full, gpus=(GpuState(g0.identity, unprofiled), *full.gpus[1:])))
    assert page != before  # the preferred set did change
    assert check_page(builder, full) == before
    swapped = dataclasses.replace(g0.identity, uuid="GPU-00000000-0000-0000-0000-0000000000aa")
    page = check_page(builder, _drop(full, gpus=(GpuState(swapped, g0.readings), *full.gpus[1:])))
    assert g0.identity.uuid.encode() not in page and swapped.uuid.encode() in page


def test_rates_that_give_way_while_they_move(node: tuple[Daemon, SimBackend, FakeClock]) -> None:
    """NVLink's own per-link rates move at every poll while profiling's, read less often, win over them; they are
    written again when profiling goes and comes back, when it covers only some of the links, and when the links
    change under it: each page is still prometheus_client's for its snapshot."""
    daemon, _, clock = node
    clock.advance(100)
    builder = GpuFamilies()
    full = daemon.poller.poll(Collector)
    check_page(builder, full)
    profiling = full.gpus[0].readings[Collector.PROFILING]
    assert isinstance(profiling, Profiling) and profiling.gpu is not None
    activity = profiling.gpu
    covered = activity.nvlink_links
    # Profiling has a rate for every link: NVLink's own give way to it entirely.
    assert {t.link for t in covered} == {link.link for link in _links(full)}

    def on_gpu0(snapshot: Snapshot, collector: Collector, reading: Reading | None) -> Snapshot:
        g0 = snapshot.gpus[0]
        readings = {c: r for c, r in g0.readings.items() if c is not collector}
        if reading is not None:
            readings[collector] = reading
        return _drop(snapshot, gpus=(GpuState(g0.identity, readings, g0.problems), *snapshot.gpus[1:]))

    def unprofiled(snapshot: Snapshot) -> Snapshot:
        return on_gpu0(snapshot, Collector.PROFILING, None)

    def partly_profiled(snapshot: Snapshot) -> Snapshot:  # the last two links without profiling's rates
        some = dataclasses.replace(activity, nvlink_links=covered[:-2])
        return on_gpu0(snapshot, Collector.PROFILING, dataclasses.replace(profiling, gpu=some))

    def fewer_links(n: int) -> Callable[[Snapshot], Snapshot]:
        return lambda snapshot: on_gpu0(snapshot, Collector.NVLINK, NvLink(_links(snapshot)[:-n]))

    def both(snapshot: Snapshot) -> Snapshot:  # only the links profiling has rates for, then the others are back
        return fewer_links(2)(partly_profiled(snapshot))

    def kept(snapshot: Snapshot) -> Snapshot:
        return snapshot

    rates: list[tuple[float | None, ...]] = []
    for change in (kept, kept, unprofiled, unprofiled, kept, kept, partly_profiled, partly_profiled, kept,
                   fewer_links(1), fewer_links(1), kept, both, both, partly_profiled, kept):  # fmt: skip
        clock.advance(5)
        snapshot = daemon.poller.poll(FAST)
        rates.append(tuple(link.tx_bytes_per_second for link in _links(snapshot)))
        check_page(builder, change(snapshot))
    assert len(set(rates)) == len(rates), "NVLink's rates moved at every poll"


def _links(snapshot: Snapshot) -> tuple[LinkReading, ...]:
    nvlink = snapshot.gpus[0].readings[Collector.NVLINK]
    assert isinstance(nvlink, NvLink)
    return nvlink.links


def _distinct(value: object, counter: itertools.count[int]) -> object:
    """`value` with each number in it (but flags and enums) a different one: a key in the wrong order shows."""
    if isinstance(value, bool | enum.Enum) or value is None:
        return value
    if isinstance(value, int | float):
        return type(value)(next(counter))
    if isinstance(value, tuple):
        return tuple(_distinct(v, counter) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _distinct(getattr(value, f.name), counter) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value


@pytest.mark.parametrize("scenario", ["h100-faults", "h100-mig", "b200-training", "l40s-inference"])
def test_a_part_with_known_series_is_keyed_by_its_values(scenario: str, tmp_path: Path) -> None:
    """What lets a page write only the values of such a part (Reading.parts): its key is its samples' values,
    and equal series are the same series in the same order."""
    clock = FakeClock()
    daemon = Daemon(SimBackend(load_scenario(scenario), clock=clock), settings(tmp_path), clock=clock)
    daemon.poller.discover()
    series_of: dict[tuple[int, Collector, int], tuple[object, list[tuple[object, ...]]]] = {}
    known = 0
    counter = itertools.count(1)
    for _ in range(3):
        clock.advance(100)
        for state in daemon.poller.poll(Collector).gpus:
            for collector, read in state.readings.items():
                for reading in (read, _distinct(read, counter)):
                    assert isinstance(reading, Reading)
                    for i, (key, make, series) in enumerate(reading.parts()):
                        if series is None:
                            continue
                        known += 1
                        samples = list(make())
                        assert key == tuple(s.value for s in samples), (collector, i)
                        names = [(s.family.name, s.labels, s.extra, s.preferred) for s in samples]
                        before = series_of.setdefault((state.identity.index, collector, i), (series, names))
                        assert before[0] != series or before[1] == names, (collector, i)
    daemon.stop()
    assert known
