"""The simulator: a real backend with scenarios and fault injection, for nodes without a GPU."""

from gpu_triage.exporter.backends.sim.backend import FaultError, SimBackend
from gpu_triage.exporter.backends.sim.faults import ActiveFault, FaultKind, FaultSpec
from gpu_triage.exporter.backends.sim.scenario import Scenario, ScenarioError, builtin_scenarios, load_scenario

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
