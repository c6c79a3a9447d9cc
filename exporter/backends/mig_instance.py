"""A MIG device as the metrics name it: its own module, so that the simulator's NVML writer can use it
without importing the readings (whose constants it must not share)."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_triage.exporter.metrics.families import MIG_LABELS


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG device: a compute instance inside a GPU instance, as NVML numbers them."""

    gpu_instance: int
    compute_instance: int
    profile: str  # "3g.40gb", or "1c.3g.40gb" for a compute instance smaller than its GPU instance
    uuid: str  # "MIG-…"

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        values = (str(self.gpu_instance), str(self.compute_instance), self.profile, self.uuid)
        return tuple(zip(MIG_LABELS, values, strict=True))
