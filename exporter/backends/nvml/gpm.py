"""Profiling through NVML's GPM (GPU Performance Monitoring, Hopper and later) for the NVML backend.

GPM computes its metrics from two samples of a GPU's (or MIG device's) counters taken at least
100 ms apart. Each collection takes one new sample per GPU and MIG device and pairs it with the
sample the previous collection kept, so the values are averages over the whole collection interval
and a collection costs one sample call and one metrics call per target, without waiting. Only when
there is nothing to pair with (the first collection, a new MIG device, after an error) does the read
take two samples, 110 ms apart, in the read's own worker thread: the fast poll's reads run on.
At most one sample per target is kept between collections; the rest are freed at once, all of them
on close().

GPM does not use the profiler lock that Nsight and DCGM's own profiling module contend for, but
gpu-triage still never profiles next to a DCGM host engine that does: `turn_off(reason)`.
Units: GPM gives percent and MiB/s; the readings want ratios and bytes/s.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import pynvml

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.backends.nvml.mig import MigDevice, MigState, listed
from gpu_triage.exporter.backends.nvml.query import Query
from gpu_triage.exporter.backends.readings import Activity, InstanceActivity, LinkThroughput, Profiling

MIN_GAP_SECONDS = 0.11  # NVML: the two samples "should be greater than 100ms" apart
MIB = 1024 * 1024
MAX_LINKS = 18  # per-link metrics NVML_GPM_METRIC_NVLINK_L0..L17; every driver with GPM has these ids

_PERCENT = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics_engine_active",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm_active",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64_active",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32_active",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16_active",
}
_MIB_PER_SECOND = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx_bytes_per_second",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx_bytes_per_second",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx_bytes_per_second",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx_bytes_per_second",
}
# Per link: RX is L0_RX + 2 * link, TX the id after it.
_LINK_RX = [pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC + 2 * link for link in range(MAX_LINKS)]
_GPU_METRICS = [*_PERCENT, *_MIB_PER_SECOND, *_LINK_RX, *(rx + 1 for rx in _LINK_RX)]
_INSTANCE_METRICS = list(_PERCENT)  # the buses belong to the whole GPU


@dataclass(frozen=True, slots=True)
class _Target:
    key: tuple[int, str]  # (GPU index, "" for the GPU or the MIG device's UUID)
    handle: Any
    instance: MigInstance | None


@dataclass(frozen=True, slots=True)
class _Sample:
    sample: Any  # an nvmlGpmSample_t
    taken: float  # monotonic seconds


@dataclass
class _Round:
    targets: set[tuple[int, str]] = field(default_factory=set)  # the GPU and its MIG devices this time
    taken: dict[tuple[int, str], _Sample] = field(default_factory=dict)  # the newest sample of each target
    spent: list[_Sample] = field(default_factory=list)  # to free once the read is done


class GpmProfiler:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._kept: dict[tuple[int, str], _Sample] = {}
        self._supported: dict[int, str | None] = {}  # GPU -> None (supported) or why not
        self._lock = threading.Lock()
        self.off: str | None = None  # why GPM is off on this node, when it is

    def forget(self, gpu: int) -> None:
        """The GPU was reset: a sample from before must not be paired with one from after."""
        with self._lock:
            gone = [self._kept.pop(k) for k in [k for k in self._kept if k[0] == gpu]]
        for s in gone:
            _free(s.sample)

    def turn_off(self, reason: str) -> None:
        """No GPM on this node from now on (another profiler is there); keep the reason for the API."""
        self.off = reason
        self.close()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for s in kept:
            _free(s.sample)

    def read(self, q: Query, h: Any, gpu: int, migs: Callable[[], list[MigDevice]]) -> Profiling:
        """`migs` lists the GPU's MIG devices, when they are needed."""
        if self.off is not None:
            return Profiling(None, self.off)
        if (why_not := self._why_unsupported(q, h, gpu)) is not None:
            return Profiling(None, why_not)
        with self._round(gpu) as this:
            targets = [_Target((gpu, ""), h, None)]
            targets += [_Target((gpu, mig.uuid), mh, mig) for mig, mh in migs()]
            this.targets = {t.key for t in targets}
            pairs = self._pairs(q, targets, this)
            whole, parts = None, []
            for target in targets:
                pair = pairs.get(target.key)
                if pair is None:
                    continue
                values = _activity(q, *pair, metrics=_INSTANCE_METRICS if target.instance else _GPU_METRICS)
                if target.instance is None:
                    whole = values
                elif values is not None:
                    parts.append(InstanceActivity(target.instance, values))
        if whole is None and not parts:
            return Profiling("gpm", "no GPM sample this time (see the daemon's log)")
        return Profiling("gpm", "sampling", whole, tuple(parts))

    def _why_unsupported(self, q: Query, h: Any, gpu: int) -> str | None:
        if gpu in self._supported:
            return self._supported[gpu]
        failed = len(q.failed)
        support = q("gpm_support", pynvml.nvmlGpmQueryDeviceSupport, h)
        if len(q.failed) > failed:
            return "the GPM support query failed; asking again next time"
        if support is None:
            why: str | None = "this driver has no GPM (NVML answered not supported)"
        elif not support.isSupportedDevice:
            why = "GPM is not supported on this GPU (Hopper and later have it)"
        else:
            why = None
        self._supported[gpu] = why
        return why

    @contextmanager
    def _round(self, gpu: int) -> Iterator[_Round]:
        """One read's samples: the newest of each target is kept for the next read, the rest freed."""
        this = _Round()
        failed = False
        try:
            yield this
        except BaseException:
            failed = True  # a lost GPU or a broken library: start over next time
            raise
        finally:
            with self._lock:
                gone = [k for k in self._kept if k[0] == gpu and (failed or k in this.taken or k not in this.targets)]
                this.spent += [self._kept.pop(k) for k in gone]
                if failed:
                    this.spent += this.taken.values()
                else:
                    self._kept.update(this.taken)
            for s in this.spent:
                _free(s.sample)

    def _pairs(self, q: Query, targets: list[_Target], this: _Round) -> dict[tuple[int, str], tuple[Any, Any]]:
        """(earlier, later) samples per target, at least MIN_GAP_SECONDS apart."""
        with self._lock:
            kept = {t.key: self._kept.get(t.key) for t in targets}
        for t in targets:
            if (now := self._sample(q, t.handle)) is not None:
                this.taken[t.key] = now
        earlier: dict[tuple[int, str], _Sample] = {k: s for k, s in kept.items() if s is not None}
        young = [t for t in targets if t.key in this.taken and _too_close(kept[t.key], this.taken[t.key])]
        if young:  # nothing (old enough) to pair with: take a second sample after the minimum gap
            oldest = min(this.taken[t.key].taken for t in young)
            self._sleep(max(0.0, MIN_GAP_SECONDS - (self._clock() - oldest)))
            for t in young:
                earlier[t.key] = first = this.taken.pop(t.key)
                this.spent.append(first)  # used below, freed when the read is done
                if (later := self._sample(q, t.handle)) is not None:
                    this.taken[t.key] = later
        return {k: (earlier[k].sample, s.sample) for k, s in this.taken.items() if k in earlier}

    def _sample(self, q: Query, handle: Any) -> _Sample | None:
        sample = q("gpm_sample_alloc", pynvml.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        try:
            if q("gpm_sample", pynvml.nvmlGpmSampleGet, handle, sample) is None:
                _free(sample)
                return None
        except BaseException:
            _free(sample)
            raise
        return _Sample(sample, self._clock())


def _too_close(earlier: _Sample | None, later: _Sample) -> bool:
    """True when there is no earlier sample, or it is too recent to pair with `later`."""
    return earlier is None or later.taken - earlier.taken < MIN_GAP_SECONDS


def _free(sample: Any) -> None:
    # A failed free cannot be helped, and the read's result stands.
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlGpmSampleFree(sample)


def _activity(q: Query, earlier: Any, later: Any, *, metrics: list[int]) -> Activity | None:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metrics)
    request.sample1, request.sample2 = earlier, later
    for slot, metric in zip(request.metrics, metrics, strict=False):
        slot.metricId = metric
    if q("gpm_metrics", pynvml.nvmlGpmMetricsGet, request) is None:
        return None
    got: dict[int, float] = {}
    for slot in request.metrics[: len(metrics)]:
        # A metric this GPU does not have (a link it lacks) fails alone; NaN means no value either.
        if slot.nvmlReturn == pynvml.NVML_SUCCESS and not math.isnan(slot.value):
            got[int(slot.metricId)] = float(slot.value)
    values: dict[str, Any] = {name: _scaled(got.get(m), 0.01) for m, name in _PERCENT.items()}
    values |= {name: _scaled(got.get(m), MIB) for m, name in _MIB_PER_SECOND.items()}
    links = tuple(
        LinkThroughput(link, _scaled(got.get(rx + 1), MIB), _scaled(got.get(rx), MIB))
        for link, rx in enumerate(_LINK_RX)
        if rx in got or rx + 1 in got
    )
    if links:  # per link where the GPU reports links: then the total would count twice
        values |= {"nvlink_tx_bytes_per_second": None, "nvlink_rx_bytes_per_second": None}
    return Activity(**values, nvlink_links=links)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


class GpmState(MigState, Protocol):
    """What the profiling reader keeps in the backend: the GPM sampler, and the MIG devices it samples."""

    gpm: GpmProfiler


def read_profiling(backend: GpmState, q: Query, h: Any, gpu: int) -> Profiling:
    """The NVML backend's profiling reader."""
    return backend.gpm.read(q, h, gpu, lambda: listed(backend, q, h, Collector.PROFILING))
