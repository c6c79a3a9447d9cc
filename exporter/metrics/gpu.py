"""Snapshot -> Prometheus metric families: names, units and labels as the readings declare them.

Families are built for each snapshot from its readings alone, never kept as long-lived gauges, so a
GPU or a link that disappears takes its series with it (the lines of what did not change since the last
page are kept, see GpuFamilies). Values are what the last background poll read:
`gpu_triage_last_poll_timestamp_seconds` says when. Which value goes to which family is declared
once, in exporter/backends/field_table.py (plain values) or a reading's `more_samples` (the rest).
"""

from __future__ import annotations

import functools
import operator
import platform
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gpu_triage import __version__
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Inventory, Reading, Sample, Value
from gpu_triage.exporter.metrics.exposition import Preformatted, format_number, series_head
from gpu_triage.exporter.metrics.families import FAMILIES, UP, Family
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot

GPU_LABELS = ("gpu", "uuid")
INFO_LABELS = ("pci_bus_id", "model", "serial", "vbios_version", "driver_version", "cuda_driver_version")
_INFO = InfoMetricFamily(
    "nvidia_gpu",
    "Descriptive attributes of each GPU (join them onto other series by uuid); the value is always 1.",
    labels=[*GPU_LABELS, *INFO_LABELS],
)


def _new(family: Family) -> GaugeMetricFamily | CounterMetricFamily:
    cls = CounterMetricFamily if family.counter else GaugeMetricFamily
    return cls(family.name, family.help, labels=[*GPU_LABELS, *family.labels], unit=family.unit)


# Each family as prometheus_client names it (a unit suffix added, a counter's _total taken off), and the name of
# its samples.
_METRICS = {f.name: _new(f) for f in FAMILIES}
_SAMPLE_NAMES = {name: m.name + ("_total" if m.type == "counter" else "") for name, m in _METRICS.items()}
_BY_NAME = {f.name: f for f in FAMILIES}


@functools.lru_cache(maxsize=1 << 16)
def _head(family: str, gpu: str, uuid: str, labels: tuple[str, ...], extra: tuple[tuple[str, str], ...]) -> str:
    """A series' name and labels, written once: a node's series are the same from one page to the next."""
    pairs = [("gpu", gpu), ("uuid", uuid), *zip(_BY_NAME[family].labels, labels, strict=True), *extra]
    return series_head(_SAMPLE_NAMES[family], pairs)


_Key = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]  # a series of a GPU: (family, labels, extra)
_NONE: frozenset[_Key] = frozenset()
_NO_NAMES: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the values of a part with known series (Reading.parts' `series`) go, once its series are known."""

    # By family, in the order they come: (its name, its values out of the part's key, then for each of its series
    # the value's place in the key and the series' name and labels). A series that gives way has no place.
    rows: tuple[tuple[str, Callable[[tuple[Value, ...]], object], tuple[tuple[int, str], ...]], ...]


@dataclass(frozen=True, slots=True)
class _Written:
    """The lines one part of a reading (Reading.parts) gave a page, kept for the next page."""

    key: object
    preferred: frozenset[_Key]  # its series that beat another source's (Sample.preferred)
    # (family name, its lines joined and encoded), in the order they come; with a layout, one per row of it.
    chunks: tuple[tuple[str, bytes], ...]
    series: object = None  # the part's own (Reading.parts)
    layout: _Layout | None = None  # where the part has series and none of them is preferred

    @property
    def hidden(self) -> bool:
        """No line, whatever the values: every series gave way to another source's."""
        return self.layout is not None and not self.layout.rows


@dataclass(frozen=True, slots=True)
class _Gpu:
    overridden: frozenset[_Key]  # the GPU's preferred series: the other sources' samples of them are left out
    families: frozenset[str]  # the families of `overridden`: most samples are of none of them
    parts: dict[Collector, list[_Written]]
    readings: Mapping[Collector, Reading]  # what they were written from


class GpuFamilies:
    """Builds the per-GPU families of each page, writing again only what changed since the last one.

    A part of a reading (Reading.parts: its plain values, the rest of it, NVLink's link states, byte counters or
    rates) whose key equals that of the same part of the last page keeps its lines: the slow collectors'
    readings (ECC, inventory, profiling...) stay the same objects for a minute, and many of the fast ones'
    values do not move between two polls. A part whose series are known and the same as on the last page
    writes only its values that moved, into the lines laid out when it was first written (_Layout), or
    nothing while every one of its series gives way to another source's (NVLink's own rates to profiling's).
    Only what the current snapshot holds is kept, so a GPU, a link or a collector that is gone takes its
    series with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: dict[tuple[int, str], _Gpu] = {}

    def build(self, snapshot: Snapshot) -> list[Metric]:
        """Every per-GPU family, in a stable order; a value the GPU does not have is left out. Written as lines
        directly: on a node of 64 GPUs the page has some 18,000 series."""
        with self._lock:
            info: list[str] = []
            lines: dict[str, list[bytes]] = {f.name: [] for f in FAMILIES}
            up: list[str] = []
            written: dict[tuple[int, str], _Gpu] = {}
            for state in snapshot.gpus:
                g = state.identity
                gpu = str(g.index)
                inv = state.get(Inventory)
                described = (
                    (inv.name, inv.serial, inv.vbios_version, inv.driver_version, inv.cuda_driver_version)
                    if inv
                    else ()
                )
                info.append(_info_line((gpu, g.uuid, g.pci_bus_id, *(d or "" for d in described or ("",) * 5))))
                up.append(_head(UP.name, gpu, g.uuid, (), ()) + ("1.0\n" if state.up else "0.0\n"))
                mine = written[(g.index, g.uuid)] = _gpu(state, gpu, self._written.get((g.index, g.uuid)))
                for parts in mine.parts.values():
                    for part in parts:
                        for name, chunk in part.chunks:
                            lines[name].append(chunk)
            self._written = written
            lines[UP.name].append("".join(up).encode())
        info_family = Preformatted(_INFO, "".join(info).encode())
        return [info_family, *(Preformatted(_METRICS[name], b"".join(rows)) for name, rows in lines.items())]


def _gpu(state: GpuState, gpu: str, before: _Gpu | None) -> _Gpu:
    """One GPU's lines by collector and part, from the last page's where a part's key is the same."""
    last = before.parts if before is not None else {}
    read = before.readings if before is not None else {}
    # As it was: it seldom changes, and every part kept was written with it.
    overridden, families = (before.overridden, before.families) if before is not None else (_NONE, _NO_NAMES)
    uuid = state.identity.uuid
    out: dict[Collector, list[_Written]] = {}
    for collector, reading in state.readings.items():
        if read.get(collector) is reading:  # a slow collector's, between two of its reads
            out[collector] = last[collector]
            continue
        old = last.get(collector, ())
        parts = out[collector] = []
        for i, (key, make, series) in enumerate(reading.parts()):
            kept = old[i] if i < len(old) else None
            if kept is None or kept.series != series:
                parts.append(_fresh(key, make, series, gpu, uuid, overridden, families))
            elif kept.key is key or kept.key == key or kept.hidden:
                parts.append(kept)
            elif kept.layout is not None:  # the same series: only the values are new
                parts.append(_fill(key, series, kept.layout, kept))
            else:
                parts.append(_write(key, series, make(), gpu, uuid, overridden, families))
    now = frozenset().union(*(p.preferred for parts in out.values() for p in parts)) or _NONE
    if now != overridden:  # another source's preferred series came or went: every line is written again
        overridden, families = now, frozenset(name for name, _, _ in now) or _NO_NAMES
        out = {
            c: [_fresh(key, make, series, gpu, uuid, overridden, families) for key, make, series in r.parts()]
            for c, r in state.readings.items()
        }
    return _Gpu(overridden, families, out, state.readings)


def _fresh(
    key: object,
    make: Callable[[], Iterable[Sample]],
    series: object,
    gpu: str,
    uuid: str,
    overridden: frozenset[_Key],
    families: frozenset[str],
) -> _Written:
    """A part none of whose lines can be kept."""
    if series is not None and (layout := _layout(key, make(), gpu, uuid, overridden, families)) is not None:
        return _fill(key, series, layout, None)
    return _write(key, series, make(), gpu, uuid, overridden, families)


def _write(
    key: object,
    series: object,
    samples: Iterable[Sample],
    gpu: str,
    uuid: str,
    overridden: frozenset[_Key],
    families: frozenset[str],
) -> _Written:
    """A part's lines, joined by family in the order they come; a value the GPU does not have is left out."""
    rows: dict[str, list[str]] = {}
    preferred: list[_Key] = []
    for family, labels, value, extra, better in samples:
        if value is None:
            continue
        name = family.name  # by name: hashing a Family hashes every field of it
        if better:
            preferred.append((name, labels, extra))
        elif name in families and (name, labels, extra) in overridden:
            continue  # a more precise source gave this series
        line = f"{_head(name, gpu, uuid, labels, extra)}{format_number(value)}\n"
        if (row := rows.get(name)) is None:
            rows[name] = [line]
        else:
            row.append(line)
    chunks = tuple((name, "".join(row).encode()) for name, row in rows.items())
    return _Written(key, frozenset(preferred) if preferred else _NONE, chunks, series)


def _layout(
    key: object,
    samples: Iterable[Sample],
    gpu: str,
    uuid: str,
    overridden: frozenset[_Key],
    families: frozenset[str],
) -> _Layout | None:
    """Where a part's values go while its series stay the same; None where one of them is preferred (whether it
    wins depends on its value) or the key is not the samples' values (Reading.parts), so each page writes it."""
    rows: dict[str, list[tuple[int, str]]] = {}
    values = []
    for i, (family, labels, value, extra, better) in enumerate(samples):
        if better:
            return None
        values.append(value)
        name = family.name
        if name in families and (name, labels, extra) in overridden:
            continue
        rows.setdefault(name, []).append((i, _head(name, gpu, uuid, labels, extra)))
    if key != tuple(values):
        return None
    return _Layout(tuple((name, operator.itemgetter(*(i for i, _ in row)), tuple(row)) for name, row in rows.items()))


def _fill(key: object, series: object, layout: _Layout, before: _Written | None) -> _Written:
    """A part's lines from its layout and its values (its key), a family's kept from `before` (the part's last,
    with this layout) where its values are the same; a value the GPU does not have is left out."""
    values = cast(tuple[Value, ...], key)
    last = cast(tuple[Value, ...], before.key) if before is not None else None
    chunks: list[tuple[str, bytes]] = []
    for row, (name, pick, heads) in enumerate(layout.rows):
        if last is not None and pick(values) == pick(last):  # most rows are one value, and many do not move
            chunks.append(before.chunks[row])  # type: ignore[union-attr]
        elif len(heads) == 1:
            i, head = heads[0]
            v = values[i]
            chunks.append((name, b"" if v is None else f"{head}{format_number(v)}\n".encode()))
        else:
            lines = [f"{head}{format_number(v)}\n" for i, head in heads if (v := values[i]) is not None]
            chunks.append((name, "".join(lines).encode()))
    return _Written(key, _NONE, tuple(chunks), series, layout)


@functools.lru_cache(maxsize=1 << 10)
def _info_line(values: tuple[str, ...]) -> str:
    return series_head("nvidia_gpu_info", zip(_INFO_NAMES, values, strict=True)) + "1.0\n"


def gpu_families(snapshot: Snapshot) -> list[Metric]:
    """Every per-GPU family of `snapshot`, all written afresh (see GpuFamilies for a page after page)."""
    return GpuFamilies().build(snapshot)


_INFO_NAMES = (*GPU_LABELS, *INFO_LABELS)


def daemon_families(snapshot: Snapshot) -> Iterator[Metric]:
    """The daemon's own health: build, backend, each collector, the last poll."""
    build = InfoMetricFamily("gpu_triage_build", "gpu-triage version and the Python that runs it; always 1.")
    build.add_metric([], {"version": __version__, "python_version": platform.python_version()})
    yield build
    backend = GaugeMetricFamily(
        "gpu_triage_backend_up", "1 if the GPU backend (NVML, DCGM, sim) works, else 0.", labels=["backend"]
    )
    backend.add_metric([snapshot.backend], 1.0 if snapshot.backend_up else 0.0)
    yield backend
    success = GaugeMetricFamily(
        "gpu_triage_collector_success",
        "1 if the collector's last run read every GPU in time and without errors, else 0.",
        labels=["collector"],
    )
    duration = GaugeMetricFamily(
        "gpu_triage_collector_duration_seconds",
        "Wall time of the collector's slowest GPU read in its last run, in seconds.",
        labels=["collector"],
        unit="seconds",
    )
    last = GaugeMetricFamily(
        "gpu_triage_collector_last_success_timestamp_seconds",
        "Unix time of the collector's last successful run, in seconds.",
        labels=["collector"],
        unit="seconds",
    )
    for collector, status in sorted(snapshot.collectors.items()):
        success.add_metric([collector.value], 1.0 if status.success else 0.0)
        duration.add_metric([collector.value], status.duration_seconds)
        if status.last_success is not None:
            last.add_metric([collector.value], status.last_success)
    yield from (success, duration, last)
    if snapshot.taken_at:
        poll = GaugeMetricFamily(
            "gpu_triage_last_poll_timestamp_seconds",
            "Unix time of the poll that this page's GPU values come from (they are cached), in seconds.",
            unit="seconds",
        )
        poll.add_metric([], snapshot.taken_at)
        yield poll
