"""Simulated MIG: a GPU split into instances by profile name, as `nvidia-smi mig -cgi 9,5 -C` would.

A profile is one of the product's (products.yaml), named as NVML names it, `<slices>g.<memory>gb`
(`3g.40gb`); each instance gets one compute instance the size of its GPU instance. GPU instance ids
count from 1 in the order the profiles are listed, compute instance ids are 0, the MIG device UUIDs
follow from the scenario seed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gpu_triage.exporter.backends.mig_instance import MigInstance
from gpu_triage.exporter.backends.sim.products import MEMORY_SLICES, MigProfile, Product

# A100/H100/H200/B200 have 7 compute slices; their memory is cut in 8 slices.
COMPUTE_SLICES = 7
_NAMESPACE = uuid.UUID("6d1c3a52-0c5e-4b0e-9a37-6a1f3f0e5b21")  # for the simulated MIG device UUIDs


def layout_problem(profiles: list[str], spec: Product) -> str | None:
    """Why these instances cannot share one GPU of this product, or None."""
    if not spec.mig:
        return f"a {spec.model} has no MIG"
    found: list[MigProfile] = []
    for name in profiles:
        p = spec.profile(name)
        if p is None:
            return f"{name!r} is not a MIG profile of a {spec.model} ({', '.join(q.name for q in spec.mig)})"
        found.append(p)
    slices, memory = sum(p.slices for p in found), sum(p.memory_slices for p in found)
    if slices > COMPUTE_SLICES:
        return f"{' + '.join(profiles)} needs {slices} compute slices; a GPU has {COMPUTE_SLICES}"
    if memory > MEMORY_SLICES:
        return f"{' + '.join(profiles)} needs {memory} memory slices; a GPU has {MEMORY_SLICES}"
    return None


@dataclass(frozen=True, slots=True)
class SimInstance:
    mig: MigInstance
    profile: MigProfile
    memory_bytes: int

    @property
    def slices(self) -> int:
        return self.profile.slices


def instances(seed: int, gpu: int, profiles: list[str], spec: Product) -> tuple[SimInstance, ...]:
    out = []
    for i, name in enumerate(profiles):
        p = spec.profile(name)
        assert p is not None, name  # the scenario was validated
        gi = i + 1
        raw = uuid.uuid5(_NAMESPACE, f"{seed}/{gpu}/{gi}")
        memory = spec.profile_memory_mib(p) * 1024**2
        out.append(SimInstance(MigInstance(gi, 0, name, f"MIG-{raw}"), p, memory))
    return tuple(out)
