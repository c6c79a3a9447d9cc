"""What the simulated GPUs' SMs, tensor cores, memory and links do: profiling values from utilization.

They follow the same utilization that drives power and heat, so a dashboard shows one story: SMs are
busy a little less than "a kernel is running" says (some kernels leave SMs idle), tensor cores carry
most of a training step's math, DRAM activity is the memory controller's utilization, and the buses
move data in proportion to the work. PCIe uses the same numbers as the PCIe collector's throughput;
a link that is down carries nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Effective(Protocol):
    """The shape of a GPU's work in one tick, as the activity needs it (model.Effective is one): a
    protocol, so this module imports nothing of the model, which imports it."""

    @property
    def sm_share(self) -> float: ...
    @property
    def occupancy_share(self) -> float: ...
    @property
    def dram_scale(self) -> float: ...
    @property
    def pcie_scale(self) -> float: ...
    @property
    def nvlink_share(self) -> float: ...


# A training step's collectives keep the links a bit under half busy.
_LINK_SHARE = 0.45


def link_rate(utilization: float, speed_mbps: int, share: float = _LINK_SHARE) -> float:
    """Bytes per second one NVLink carries each way at this utilization, from the link's speed (MB/s):
    whole KiB, the unit of NVML's link data counters. `share`: of the speed, at full utilization."""
    return float(round(utilization * share * speed_mbps * 1e6 / 1024) * 1024)


def memory_controller(utilization: float, noise: Callable[[int], float], scale: float = 1.0) -> float:
    """The memory controller's busy fraction: the NVML utilization and DRAM activity share it."""
    return min(1.0, utilization * 0.55 * scale * (1 + 0.1 * noise(2)))


def pcie(utilization: float, noise: Callable[[int], float], load: Effective | None = None) -> tuple[float, float]:
    """(tx, rx) in bytes per second, to the kB. A job whose loader copies much (pcie_scale) moves more host-to-
    device (rx, as the GPU sees it) than back."""
    scale = load.pcie_scale if load is not None else 1.0
    tx = round(utilization * 2.4e9 * (1 + 0.2 * noise(3)) * (1 + (scale - 1) * 0.2), -3)
    return tx, round(utilization * 3.1e9 * scale * (1 + 0.2 * noise(4)), -3)


@dataclass(frozen=True, slots=True)
class Rates:
    """Profiling values as fractions (0..1) and bytes per second: plain data, for both sides of the vGPU."""

    graphics_engine_active: float
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    fp64_active: float
    fp32_active: float
    fp16_active: float
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_links: tuple[tuple[int, float, float], ...] = ()  # (link, tx, rx)


def activity(
    utilization: float,
    noise: Callable[[int], float],
    *,
    links: int = 0,
    link_speed_mbps: int = 0,
    down: frozenset[int] = frozenset(),
    buses: bool = True,
    load: Effective | None = None,
) -> Rates:
    """A GPU's (or, without `buses`, a MIG instance's) profiling values at this utilization."""
    sm = utilization * (load.sm_share if load is not None else 0.9)

    def part(share: float, channel: int) -> float:
        return round(min(1.0, sm * share * (1 + 0.05 * noise(channel))), 3)

    tx, rx = pcie(utilization, noise, load) if buses else (None, None)
    per_link = link_rate(utilization, link_speed_mbps, load.nvlink_share if load is not None else _LINK_SHARE)
    return Rates(
        graphics_engine_active=round(utilization, 3),
        sm_active=round(sm, 3),
        sm_occupancy=part(load.occupancy_share if load is not None else 0.42, 5),
        tensor_active=part(0.62, 6),
        dram_active=round(memory_controller(utilization, noise, load.dram_scale if load is not None else 1.0), 3),
        fp64_active=part(0.01, 7),
        fp32_active=part(0.18, 8),
        fp16_active=part(0.09, 9),
        pcie_tx_bytes_per_second=tx,
        pcie_rx_bytes_per_second=rx,
        nvlink_links=tuple((k, 0.0 if k in down else per_link, 0.0 if k in down else per_link) for k in range(links))
        if buses
        else (),
    )
