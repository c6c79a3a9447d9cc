"""What the simulated GPUs' SMs, tensor cores, memory and links do: profiling values from utilization.

They follow the same utilization that drives power and heat, so a dashboard shows one story: SMs are
busy a little less than "a kernel is running" says (some kernels leave SMs idle), tensor cores carry
most of a training step's math, DRAM activity is the memory controller's utilization, and the buses
move data in proportion to the work. PCIe uses the same numbers as the PCIe collector's throughput;
a link that is down carries nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpu_triage.exporter.backends.readings import Activity, LinkThroughput

# Per-direction NVLink 4 bandwidth of one link of an H100 (18 links: 450 GB/s each way); a training
# step's collectives keep the links a bit under half busy.
_LINK_BYTES_PER_SECOND = 25e9
_LINK_SHARE = 0.45


def memory_controller(utilization: float, noise: Callable[[int], float]) -> float:
    """The memory controller's busy fraction: the NVML utilization and DRAM activity share it."""
    return min(1.0, utilization * 0.55 * (1 + 0.1 * noise(2)))


def pcie(utilization: float, noise: Callable[[int], float]) -> tuple[float, float]:
    """(tx, rx) in bytes per second."""
    return utilization * 2.4e9 * (1 + 0.2 * noise(3)), utilization * 3.1e9 * (1 + 0.2 * noise(4))


def activity(
    utilization: float,
    noise: Callable[[int], float],
    *,
    links: int = 0,
    down: frozenset[int] = frozenset(),
    buses: bool = True,
) -> Activity:
    """A GPU's (or, without `buses`, a MIG instance's) profiling values at this utilization."""
    sm = utilization * 0.9

    def part(share: float, channel: int) -> float:
        return round(min(1.0, sm * share * (1 + 0.05 * noise(channel))), 3)

    values = Activity(
        graphics_engine_active=round(utilization, 3),
        sm_active=round(sm, 3),
        sm_occupancy=part(0.42, 5),
        tensor_active=part(0.62, 6),
        dram_active=round(memory_controller(utilization, noise), 3),
        fp64_active=part(0.01, 7),
        fp32_active=part(0.18, 8),
        fp16_active=part(0.09, 9),
    )
    if not buses:
        return values
    tx, rx = pcie(utilization, noise)
    per_link = utilization * _LINK_SHARE * _LINK_BYTES_PER_SECOND
    return replace(
        values,
        pcie_tx_bytes_per_second=round(tx, -3),
        pcie_rx_bytes_per_second=round(rx, -3),
        nvlink_links=tuple(
            LinkThroughput(
                link,
                0.0 if link in down else round(per_link * (1 + 0.1 * noise(30 + link)), -3),
                0.0 if link in down else round(per_link * (1 + 0.1 * noise(70 + link)), -3),
            )
            for link in range(links)
        ),
    )
