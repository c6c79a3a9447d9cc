"""The GPU products the simulator models (products.yaml), validated when first asked for.

A product is what a board is and reports no matter the workload: its memory and limits, links,
architecture, which queries it answers and its MIG profiles. This module is plain data: the
simulator's readers turn it into readings, the vGPU writer (exporter/vgpu/image.py) into NVML's answers.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Architecture = Literal["ampere", "ada", "hopper", "blackwell"]
MIB = 1024 * 1024
MEMORY_SLICES = 8  # every MIG-capable part cuts its memory in eighths (NVIDIA's MIG user guide)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NvLinkSpec(_Strict):
    links: int = Field(ge=0, le=36)
    version: int = Field(ge=0, le=5)  # NVLink generation: 3 (A100), 4 (H100/H200), 5 (B200); 0 for none
    speed_mbps: int = Field(ge=0)  # NVML_FI_DEV_NVLINK_GET_SPEED: MB/s a direction


class PcieSpec(_Strict):
    generation: int = Field(ge=1, le=6)
    width: int = Field(ge=1, le=32)


class Thresholds(_Strict):
    """The GPU's own temperature limits, degrees C (nvmlTemperatureThresholds_t)."""

    shutdown: int
    slowdown: int
    memory_max: int | None = None
    gpu_max: int | None = None


class MigProfile(_Strict):
    name: str = Field(pattern=r"^[1-7]g\.\d+gb$")  # NVIDIA's name without the "MIG " prefix
    profile: int = Field(ge=0, lt=0x12)  # NVML_GPU_INSTANCE_PROFILE_*
    id: int = Field(ge=0)
    slices: int = Field(ge=1, le=7)
    memory_slices: int = Field(ge=1, le=MEMORY_SLICES)
    sms: int = Field(ge=1)
    memory_mib: int | None = None  # as `nvidia-smi mig -lgip` lists it; else the fraction of the GPU's


class Product(_Strict):
    model: str
    architecture: Architecture
    cuda_capability: tuple[int, int]
    pci_device_id: int
    board_part_number: str = ""
    memory_mib: int = Field(gt=0)
    reserved_mib: int = Field(ge=0)
    power_limit_watts: float = Field(gt=0)
    min_power_limit_watts: float = Field(gt=0)
    idle_power_watts: float = Field(gt=0)
    max_sm_clock_mhz: float = Field(gt=0)
    idle_sm_clock_mhz: float = Field(gt=0)
    max_memory_clock_mhz: float = Field(gt=0)
    max_video_clock_mhz: float = Field(gt=0)
    nvlink: NvLinkSpec
    pcie: PcieSpec
    fan: bool = False  # data-centre boards are passively cooled: NVML says "not supported"
    fabric: bool = False  # in an NVSwitch fabric (HGX, NVL): nvmlDeviceGetGpuFabricInfoV answers
    gpm: bool = False  # GPM profiling: Hopper and later
    power_average: bool = True  # NVML_FI_DEV_POWER_AVERAGE: "Ampere (except GA100) or newer"
    thresholds: Thresholds | None = None
    mig: list[MigProfile] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not (
            self.idle_power_watts < self.power_limit_watts and self.min_power_limit_watts <= self.power_limit_watts
        ):
            raise ValueError("idle power and the minimum limit must be below the power limit")
        if len({p.name for p in self.mig}) != len(self.mig):
            raise ValueError("MIG profile names repeat")
        return self

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig if p.name == name), None)

    def profile_memory_mib(self, profile: MigProfile) -> int:
        if profile.memory_mib is not None:
            return profile.memory_mib
        return self.memory_mib * profile.memory_slices // MEMORY_SLICES


class ProductError(ValueError):
    """An unknown product name, or a catalog that does not validate."""


@functools.cache
def products() -> dict[str, Product]:
    text = resources.files(__package__).joinpath("products.yaml").read_text(encoding="utf-8")
    try:
        return {name: Product.model_validate(spec) for name, spec in yaml.safe_load(text).items()}
    except ValidationError as e:
        raise ProductError(f"products.yaml is invalid: {e}") from e


def product(name: str) -> Product:
    found = products().get(name)
    if found is None:
        raise ProductError(f"no product {name!r}: the simulator models {', '.join(sorted(products()))}")
    return found
