"""The collectors: groups of a GPU's fields read together, each with its own success, duration and interval."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class Collector(StrEnum):
    """A group of fields read together; each reports its own success and duration."""

    INVENTORY = "inventory"
    UTILIZATION = "utilization"
    MEMORY = "memory"
    POWER = "power"
    THERMAL = "thermal"
    CLOCKS = "clocks"
    PCIE = "pcie"
    NVLINK = "nvlink"
    PROCESSES = "processes"
    RECOVERY = "recovery"
    ECC = "ecc"
    REMAPPING = "remapping"
    PROFILING = "profiling"  # SM, tensor, DRAM activity and bus bandwidth: NVML GPM, DCGM profiling fields
    HEALTH = "health"  # DCGM health watches (the other backends have none)

    @property
    def slow(self) -> bool:
        """Fields that change rarely and cost more: read every `--collector.slow-interval`."""
        return self in _SLOW


# Profiling is slow too: each read pairs a new GPM sample with the one the last read kept, so its values
# cover the whole slow interval for the price of one sample per GPU.
_SLOW = frozenset({Collector.INVENTORY, Collector.ECC, Collector.REMAPPING, Collector.PROFILING})


def require_every_collector(readers: Mapping[Collector, object], backend: str) -> None:
    """Called at import by each backend: a collector it cannot read fails at once, not at the first poll."""
    if missing := set(Collector) - readers.keys():
        raise ImportError(f"the {backend} backend has no reader for: {', '.join(sorted(missing))}")
