"""The simulator: a real backend with scenarios and fault injection, for nodes without a GPU.

Its names load on first use: the vGPU writer's modules (exporter/vgpu/image.py and what it takes) must import
without the backend, whose readings share constants with the NVML backend they are there to check.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.sim.backend import FaultError, SimBackend
    from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultKind, FaultSpec
    from gpu_triage.exporter.backends.sim.scenario import Scenario, ScenarioError, builtin_scenarios, load_scenario

_WHERE = {
    "FaultError": "backend",
    "SimBackend": "backend",
    "ActiveFault": "faults",
    "FaultKind": "faults",
    "FaultSpec": "faults",
    "Scenario": "scenario",
    "ScenarioError": "scenario",
    "builtin_scenarios": "scenario",
    "load_scenario": "scenario",
}

__all__ = [
    "ActiveFault",
    "FaultError",
    "FaultKind",
    "FaultSpec",
    "Scenario",
    "ScenarioError",
    "SimBackend",
    "builtin_scenarios",
    "load_scenario",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
