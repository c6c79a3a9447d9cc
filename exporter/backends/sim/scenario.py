"""Scenario files: the simulated node's shape, its workload over time, and its timed faults.

A scenario is YAML, validated strictly (unknown keys are errors). Built-in scenarios ship in
`scenarios/`; `--sim.scenario` takes one of their names or a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpu_triage.exporter.backends.sim.faults import ScheduledFault
from gpu_triage.exporter.backends.sim.mig import layout_problem
from gpu_triage.exporter.backends.sim.products import Product, ProductError, product

GIB = 1024**3


class ScenarioError(Exception):
    """A scenario that cannot be used: missing, unreadable or invalid. The message says why."""


# The GpuShape fields a product fills in when the scenario leaves them out.
def _product_defaults(spec: Product) -> dict[str, Any]:
    return {
        "model": spec.model,
        "memory_bytes": spec.memory_bytes,
        "reserved_memory_bytes": spec.reserved_mib * 1024**2,
        "power_limit_watts": spec.power_limit_watts,
        "idle_power_watts": spec.idle_power_watts,
        "max_sm_clock_mhz": spec.max_sm_clock_mhz,
        "idle_sm_clock_mhz": spec.idle_sm_clock_mhz,
        "max_memory_clock_mhz": spec.max_memory_clock_mhz,
        "max_video_clock_mhz": spec.max_video_clock_mhz,
        "nvlink_links": spec.nvlink.links,
        "fan": spec.fan,
        "pcie_generation": spec.pcie.generation,
        "pcie_width": spec.pcie.width,
    }


class GpuShape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The GPU product (products.yaml): its limits are the defaults of the fields below.
    product: str = "h100-sxm"
    count: int = Field(default=8, ge=1, le=256)
    model: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = Field(default=81559 * 1024**2, gt=0)
    reserved_memory_bytes: int = Field(default=527 * 1024**2, ge=0)
    power_limit_watts: float = Field(default=700.0, gt=0)
    idle_power_watts: float = Field(default=70.0, gt=0)
    max_sm_clock_mhz: float = Field(default=1980.0, gt=0)
    idle_sm_clock_mhz: float = Field(default=345.0, gt=0)
    max_memory_clock_mhz: float = Field(default=2619.0, gt=0)
    max_video_clock_mhz: float = Field(default=1755.0, gt=0)
    nvlink_links: int = Field(default=18, ge=0, le=36)
    # GPU index -> the MIG instances it is split into, by profile (3g.40gb); the other GPUs run whole.
    mig_instances: dict[int, list[str]] = Field(default_factory=dict)
    fan: bool = False  # SXM boards are passively cooled: NVML says "not supported"
    pcie_generation: int = Field(default=5, ge=1, le=6)
    pcie_width: int = Field(default=16, ge=1, le=32)
    ambient_celsius: float = 28.0
    celsius_per_watt: float = Field(default=0.065, gt=0)
    thermal_time_constant_seconds: float = Field(default=40.0, gt=0)
    pci_bus_ids: list[str] | None = None  # default: the HGX H100 baseboard layout

    @model_validator(mode="before")
    @classmethod
    def _from_product(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        try:
            spec = product(str(data.get("product", "h100-sxm")))
        except ProductError as e:
            raise ValueError(str(e)) from e
        return {**_product_defaults(spec), **data}

    @property
    def spec(self) -> Product:
        return product(self.product)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.idle_power_watts >= self.power_limit_watts:
            raise ValueError("idle_power_watts must be below power_limit_watts")
        if self.pci_bus_ids is not None and len(self.pci_bus_ids) != self.count:
            raise ValueError(f"pci_bus_ids lists {len(self.pci_bus_ids)} ids for {self.count} GPUs")
        for gpu, profiles in self.mig_instances.items():
            if not 0 <= gpu < self.count:
                raise ValueError(f"mig_instances: GPU {gpu} does not exist ({self.count} GPUs)")
            if problem := layout_problem(profiles, self.spec):
                raise ValueError(f"mig_instances of GPU {gpu}: {problem}")
        return self


class NodeShape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    driver_version: str = "570.172.08"
    cuda_driver_version: str = "12.8"
    vbios_version: str = "96.00.99.00.01"
    gpus: GpuShape = GpuShape()


class Load(BaseModel):
    """How a job's work looks on the GPU, beyond how busy it is: each unset value keeps the simulator's usual
    shape (model.py's Effective), a phase sets it for every GPU and `gpus` for one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sm_share: float | None = Field(default=None, ge=0, le=1)  # SM activity as a share of utilization
    occupancy_share: float | None = Field(default=None, ge=0, le=1)  # warps resident, as a share of SM activity
    dram_scale: float | None = Field(default=None, ge=0, le=5)  # DRAM activity against the usual
    pcie_scale: float | None = Field(default=None, ge=0, le=50)  # PCIe traffic against the usual
    nvlink_share: float | None = Field(default=None, ge=0, le=1)  # each link's share of its speed at full load
    clock_ratio: float | None = Field(default=None, gt=0, le=1)  # SM clock against its maximum, no reason given
    power_cap: bool | None = None  # the job draws more than the cap: clocks down, sw_power_cap
    hold_memory: bool | None = None  # memory stays allocated (and the process there) while idle
    burst_seconds: int | None = Field(default=None, ge=1)  # work and idle alternate this often (a starved loader)
    temperature_offset_celsius: float | None = Field(default=None, ge=-20, le=60)  # a hot slot


class GpuLoad(Load):
    utilization: float | None = Field(default=None, ge=0, le=1)


class Phase(Load):
    """A stretch of the workload: every GPU near `utilization`, give or take `jitter`."""

    name: str | None = None
    duration_seconds: float = Field(gt=0)
    utilization: float = Field(ge=0, le=1)
    memory_used_ratio: float = Field(default=0.0, ge=0, le=1)
    jitter: float = Field(default=0.02, ge=0, le=0.5)
    idle_gpus: list[int] = Field(default_factory=list, description="GPUs that sit idle in this phase")
    gpus: dict[int, GpuLoad] = Field(default_factory=dict, description="one GPU's load, where it differs")


class SimWorkload(BaseModel):
    """A pod or Slurm job the simulated node runs, on these GPUs: what the kubelet or the cgroups would say."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["pod", "slurm_job"]
    name: str = Field(min_length=1, max_length=253)
    namespace: str = ""  # a pod's
    user: str = ""  # a job's
    gpus: list[int] = Field(min_length=1)


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    seed: int = 0
    node: NodeShape = NodeShape()
    workload: list[Phase] = Field(min_length=1)
    repeat: bool = True  # loop the workload; otherwise hold the last phase
    faults: list[ScheduledFault] = Field(default_factory=list)
    workloads: list[SimWorkload] = Field(default_factory=list)

    @model_validator(mode="after")
    def _faults_fit_node(self) -> Self:
        gpus = self.node.gpus
        problems = []
        for i, w in enumerate(self.workloads):
            if bad := [g for g in w.gpus if not 0 <= g < gpus.count]:
                problems.append(f"workloads[{i}]: GPUs {bad} do not exist ({gpus.count} GPUs)")
        for i, phase in enumerate(self.workload):
            if bad := [g for g in phase.gpus if not 0 <= g < gpus.count]:
                problems.append(f"workload[{i}].gpus: GPUs {bad} do not exist ({gpus.count} GPUs)")
        for i, fault in enumerate(self.faults):
            if fault.gpu >= gpus.count:
                problems.append(f"faults[{i}]: gpu {fault.gpu} does not exist ({gpus.count} GPUs)")
            if fault.link is not None and fault.link >= gpus.nvlink_links:
                problems.append(f"faults[{i}]: link {fault.link} does not exist ({gpus.nvlink_links} links)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def cycle_seconds(self) -> float:
        return sum(p.duration_seconds for p in self.workload)


@dataclass(frozen=True, slots=True)
class BuiltinScenario:
    name: str
    description: str


def builtin_scenarios() -> list[BuiltinScenario]:
    out = []
    for entry in sorted(resources.files(__package__).joinpath("scenarios").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            doc = yaml.safe_load(entry.read_text(encoding="utf-8"))
            out.append(BuiltinScenario(entry.name.removesuffix(".yaml"), str(doc.get("description", ""))))
    return out


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file by path."""
    builtin = resources.files(__package__).joinpath("scenarios", f"{name_or_path}.yaml")
    if "/" not in name_or_path and builtin.is_file():
        text, origin = builtin.read_text(encoding="utf-8"), f"built-in scenario {name_or_path!r}"
    else:
        path = Path(name_or_path)
        if not path.exists() and "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
            names = ", ".join(s.name for s in builtin_scenarios())
            raise ScenarioError(f"no scenario {name_or_path!r}: not a file, and the built-in ones are {names}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ScenarioError(f"cannot read scenario file {path}: {e}") from e
        origin = f"scenario file {path}"
    return parse_scenario(text, origin)


def parse_scenario(text: str, origin: str = "scenario") -> Scenario:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{origin} is not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ScenarioError(f"{origin} must be a YAML mapping")
    try:
        return Scenario.model_validate(doc)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in e.errors())
        raise ScenarioError(f"{origin} is invalid: {problems}") from e
