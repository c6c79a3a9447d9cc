"""Snapshot -> Prometheus metric families: names, units and labels as the readings declare them.

Families are built fresh for each snapshot, never kept as long-lived gauges, so a GPU or a link
that disappears takes its series with it. Values are what the last background poll read:
`gpu_triage_last_poll_timestamp_seconds` says when. Which value goes to which family is declared
once, in exporter/backends/field_table.py (plain values) or a reading's `more_samples` (the rest).
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from gpu_triage import __version__
from gpu_triage.exporter.backends.readings import Inventory
from gpu_triage.exporter.metrics.exposition import Preformatted, format_value, series_head
from gpu_triage.exporter.metrics.families import FAMILIES, UP, Family
from gpu_triage.exporter.polling.snapshot import Snapshot

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


def gpu_families(snapshot: Snapshot) -> list[Metric]:
    """Every per-GPU family, in a stable order; a value the GPU does not have is left out. Written as lines
    directly: on a node of 64 GPUs the page has some 18,000 series."""
    info: list[str] = []
    lines: dict[str, list[str]] = {f.name: [] for f in FAMILIES}
    up = lines[UP.name]
    for state in snapshot.gpus:
        g = state.identity
        gpu = str(g.index)
        inv = state.get(Inventory)
        described = (
            (inv.name, inv.serial, inv.vbios_version, inv.driver_version, inv.cuda_driver_version) if inv else ()
        )
        values = [gpu, g.uuid, g.pci_bus_id, *(d or "" for d in described or ("",) * 5)]
        info.append(series_head("nvidia_gpu_info", zip(_INFO_NAMES, values, strict=True)) + "1.0\n")
        up.append(_head(UP.name, gpu, g.uuid, (), ()) + ("1.0\n" if state.up else "0.0\n"))
        samples = [s for reading in state.readings.values() for s in reading.samples() if s.value is not None]
        # By family name: hashing a Family hashes every field of it, for every sample of the page.
        preferred = {(s.family.name, s.labels, s.extra) for s in samples if s.preferred}
        overridden = {name for name, _, _ in preferred}  # the families to look in `preferred` for
        for family, labels, value, extra, better in samples:
            name = family.name
            if name in overridden and not better and (name, labels, extra) in preferred:
                continue  # a more precise source gave this series
            lines[name].append(f"{_head(name, gpu, g.uuid, labels, extra)}{format_value(float(value))}\n")  # type: ignore[arg-type]
    return [Preformatted(_INFO, info), *(Preformatted(_METRICS[name], rows) for name, rows in lines.items())]


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
