"""The performance findings' thresholds and windows (data/performance.yaml), checked at load.

Each class's own parameters are declared here with the range they must lie in, because the engine
(diagnosis/performance/engine.py) reads exactly these: a missing, unknown or out-of-range value is a problem in
the file, reported with every other one at start-up, never a surprise in a poll.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_triage.diagnosis.core.actions import Severity
from gpu_triage.diagnosis.core.data_files import Problems, parse_yaml, read_data

_FILE = "performance.yaml"
_COMMON = {"title", "severity", "playbook", "windows"}
_RATIO = (0.0, 1.0)
# class -> parameter -> (lowest, highest) allowed; a pair of ratios is written [low, high].
PARAMETERS: Mapping[str, Mapping[str, tuple[float, float]]] = MappingProxyType({
    "gpu_idle_allocated": {"held_memory_bytes": (0.0, 2.0**50), "idle_activity": _RATIO, "idle_share": _RATIO},
    "input_bound": {"activity_below": _RATIO, "h2d_share": _RATIO, "bursts": (1.0, 1000.0),
                    "burst_idle_share": _RATIO},
    "communication_bound": {"activity_below": _RATIO, "link_share": _RATIO},
    "throttled": {"busy_activity": _RATIO, "reason_share": _RATIO, "clock_ratio_below": _RATIO,
                  "low_clock_share": _RATIO},
    "memory_bound": {"dram_above": _RATIO, "occupancy_below": _RATIO},
    "straggler_gpu": {"busy_activity": _RATIO, "activity_gap": _RATIO, "clock_gap": _RATIO,
                      "hotter_celsius": (0.0, 100.0), "reason_share_gap": _RATIO},
    "mig_policy": {},
})  # fmt: skip
CLASSES = tuple(PARAMETERS)  # the operator's order: is it busy, fed, talking, held down, memory, the odd one out
_PAIRS = {"burst_idle_share"}


@dataclass(frozen=True, slots=True)
class ClassSpec:
    id: str
    title: str
    severity: Severity
    playbook: str
    windows: int
    params: Mapping[str, float | tuple[float, float]]

    def value(self, name: str) -> float:
        v = self.params[name]
        assert isinstance(v, float)
        return v

    def pair(self, name: str) -> tuple[float, float]:
        v = self.params[name]
        assert isinstance(v, tuple)
        return v


@dataclass(frozen=True, slots=True)
class PerformanceData:
    classes: Mapping[str, ClassSpec]
    coverage: float
    buckets_per_window: int
    pcie_lane_bytes_per_second: Mapping[int, float]
    nvlink_link_bytes_per_second: tuple[tuple[str, float], ...]  # (model substring, bytes/s); "default" last

    def nvlink_capacity(self, model: str | None) -> float:
        """Bytes per second one NVLink of a GPU named `model` carries each way."""
        for key, rate in self.nvlink_link_bytes_per_second:
            if key == "default" or (model and key in model):
                return rate
        return self.nvlink_link_bytes_per_second[-1][1]

    def pcie_capacity(self, generation: int | None, width: int | None) -> float | None:
        if generation is None or width is None or generation not in self.pcie_lane_bytes_per_second:
            return None
        return self.pcie_lane_bytes_per_second[generation] * width


def _number(p: Problems, where: str, value: object, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= float(value) <= high:
        p.fail(where, f"must be a number from {low:g} to {high:g}, got {value!r}")
        return None
    return float(value)


def _class(p: Problems, cid: str, spec: object) -> ClassSpec | None:
    where = f"{_FILE}: classes: {cid}"
    wanted = PARAMETERS[cid]
    body = p.keys(where, spec, _COMMON | set(wanted))
    if not body or not all(k in body for k in _COMMON | set(wanted)):
        return None
    params: dict[str, float | tuple[float, float]] = {}
    for name, (low, high) in wanted.items():
        raw = body[name]
        if name in _PAIRS:
            if not isinstance(raw, list) or len(raw) != 2:
                p.fail(f"{where}: {name}", f"must be [low, high], got {raw!r}")
                continue
            a, b = (_number(p, f"{where}: {name}", v, low, high) for v in raw)
            if a is not None and b is not None:
                if a > b:
                    p.fail(f"{where}: {name}", "low must not be above high")
                params[name] = (a, b)
        elif (v := _number(p, f"{where}: {name}", raw, low, high)) is not None:
            params[name] = v
    windows = body["windows"]
    if isinstance(windows, bool) or not isinstance(windows, int) or not 1 <= windows <= 12:
        p.fail(f"{where}: windows", f"must be a whole number from 1 to 12, got {windows!r}")
        return None
    severity = p.severity(where, body["severity"])
    title = body["title"] if isinstance(body["title"], str) and body["title"].strip() else None
    if title is None:
        p.fail(where, "`title` must be a non-empty string")
    if severity not in (Severity.WARNING, Severity.INFO):
        p.fail(where, "a performance finding is a warning or info: it never pages, and never changes health")
        return None
    playbook = p.playbook(where, body["playbook"])
    if title is None or len(params) != len(wanted):
        return None
    return ClassSpec(cid, title, severity, playbook, windows, MappingProxyType(params))


def parse_performance(doc: object, problems: Problems | None = None) -> PerformanceData:
    """The thresholds in the parsed YAML `doc`; raises DataError listing every problem."""
    p = problems if problems is not None else Problems()
    top = {"coverage", "buckets_per_window", "pcie_lane_bytes_per_second", "nvlink_link_bytes_per_second", "classes"}
    body = p.keys(_FILE, doc, top)
    classes: dict[str, ClassSpec] = {}
    found = body.get("classes")
    if not isinstance(found, dict):
        p.fail(_FILE, "`classes` must be a mapping of class ids")
        found = {}
    for cid in sorted(set(found) - set(CLASSES), key=str):
        p.fail(f"{_FILE}: classes", f"unknown class {cid!r} (the engine knows {', '.join(CLASSES)})")
    for cid in CLASSES:
        if cid not in found:
            p.fail(f"{_FILE}: classes", f"no class {cid!r}, which the engine raises")
        elif (spec := _class(p, cid, found[cid])) is not None:
            classes[cid] = spec
    coverage = _number(p, f"{_FILE}: coverage", body.get("coverage"), 0.1, 1.0)
    buckets = body.get("buckets_per_window")
    if isinstance(buckets, bool) or not isinstance(buckets, int) or not 1 <= buckets <= 60:
        p.fail(f"{_FILE}: buckets_per_window", f"must be a whole number from 1 to 60, got {buckets!r}")
    lanes: dict[int, float] = {}
    raw_lanes = body.get("pcie_lane_bytes_per_second")
    for gen, rate in raw_lanes.items() if isinstance(raw_lanes, dict) else ():
        if (v := _number(p, f"{_FILE}: pcie_lane_bytes_per_second: {gen}", rate, 1e6, 1e12)) is not None:
            lanes[int(gen) if isinstance(gen, int) else -1] = v
    if not lanes:
        p.fail(f"{_FILE}: pcie_lane_bytes_per_second", "must map PCIe generations to bytes per second per lane")
    links: list[tuple[str, float]] = []
    raw_links = body.get("nvlink_link_bytes_per_second")
    for model, rate in raw_links.items() if isinstance(raw_links, dict) else ():
        if (v := _number(p, f"{_FILE}: nvlink_link_bytes_per_second: {model}", rate, 1e6, 1e12)) is not None:
            links.append((str(model), v))
    if not any(m == "default" for m, _ in links):
        p.fail(f"{_FILE}: nvlink_link_bytes_per_second", "must have a `default`")
    p.raise_if_any("invalid performance thresholds")
    assert coverage is not None and isinstance(buckets, int)
    links.sort(key=lambda item: item[0] == "default")  # the default only when no model matched
    return PerformanceData(MappingProxyType(classes), coverage, buckets, MappingProxyType(lanes), tuple(links))


@functools.cache
def load_performance() -> PerformanceData:
    """The shipped thresholds, checked once per process."""
    problems = Problems()
    doc = parse_yaml(read_data(_FILE), _FILE, problems)
    return parse_performance(doc, problems)
