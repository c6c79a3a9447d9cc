"""The telemetry conditions (data/conditions.yaml): what a lost GPU, a pending row remap and the like mean.

The verdict code (diagnosis/xid/health.py) decides when a condition holds; this file says what it means and
what to do. Checked once, at first use, with every problem reported together.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.data_files import DataError, Problems, adopted, parse_yaml, read_data

_FILE = "conditions.yaml"
_KEYS = {"title", "severity", "action", "playbook", "steps"}

# The systems DCGM's health watches report on; each has a condition of its own, dcgm_health_<system>.
DCGM_HEALTH_SYSTEMS = ("pcie", "nvlink", "memory", "inforom", "thermal", "power", "driver")
# The conditions the verdict code raises: a file without one of them cannot be used.
USED = (
    "gpu_lost", "gpu_unresponsive", "recovery_action", "row_remap_failure", "row_remap_pending",
    "ecc_uncorrectable", "retired_pages_pending", "thermal_slowdown", "power_brake_slowdown", "nvlink_down",
    "sxid_fatal", "sxid_nonfatal", *(f"dcgm_health_{system}" for system in DCGM_HEALTH_SYSTEMS),
    "kernel_log_unreadable", "driver_events_down", "journal_unwritable", "no_xid_source", "backend_failing",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Condition:
    id: str
    title: str
    severity: Severity
    action: Action | None  # None: taken from the telemetry value (the NVML recovery action)
    playbook: str
    steps: tuple[str, ...]


def parse_conditions(doc: object, problems: Problems | None = None) -> dict[str, Condition]:
    """The conditions in the parsed YAML `doc`; raises DataError listing every problem (`problems` first)."""
    p = problems if problems is not None else Problems()
    body = p.keys(_FILE, doc, {"conditions"}).get("conditions")
    if not isinstance(body, dict):
        p.fail(_FILE, "`conditions` must be a mapping of condition ids")
        raise DataError("invalid telemetry conditions", p)
    out = {}
    for cid, spec in body.items():
        where = f"{_FILE}: {cid}"
        if not p.complete(where, spec, _KEYS):
            continue
        action = None if spec["action"] is None else p.action(where, spec["action"])
        severity = p.severity(where, spec["severity"])
        title = spec["title"] if isinstance(spec["title"], str) and spec["title"].strip() else None
        if title is None:
            p.fail(where, "`title` must be a non-empty string")
        steps = tuple(p.strings(f"{where}: steps", spec["steps"]))
        playbook = p.playbook(where, spec["playbook"])
        if severity is not None and title is not None and (action is not None or spec["action"] is None):
            out[str(cid)] = Condition(
                id=str(cid), title=title, severity=severity, action=action, playbook=playbook, steps=steps
            )
    for cid in USED:
        if cid not in body:
            p.fail(_FILE, f"no condition {cid!r}, which the verdict code raises")
    p.raise_if_any("invalid telemetry conditions")
    return out


@functools.cache
def load_conditions() -> Mapping[str, Condition]:
    """The shipped conditions, checked once per process."""
    if isinstance(known := adopted("conditions"), dict):
        return MappingProxyType(dict(known))
    problems = Problems()
    doc = parse_yaml(read_data(_FILE), _FILE, problems)
    return MappingProxyType(parse_conditions(doc, problems=problems))
