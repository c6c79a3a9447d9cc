"""Simulated MIG: a GPU split into instances by profile name, as `nvidia-smi mig -cgi 9,5 -C` would.

A profile is written the way NVML names it, `<slices>g.<memory>gb` (`3g.40gb`); each instance gets one
compute instance the size of its GPU instance. GPU instance ids count from 1 in the order the
profiles are listed, compute instance ids are 0, the MIG device UUIDs follow from the scenario seed.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from gpu_triage.exporter.backends.readings import MigInstance

# A100/H100/H200/B200 have 7 compute slices; their memory is cut in 8 slices, which the gb figure rounds.
COMPUTE_SLICES = 7
_PROFILE = re.compile(r"(?P<slices>[1-7])g\.(?P<gb>\d+)gb")
_NAMESPACE = uuid.UUID("6d1c3a52-0c5e-4b0e-9a37-6a1f3f0e5b21")  # for the simulated MIG device UUIDs


def profile_problem(profile: str) -> str | None:
    """Why `profile` cannot be a simulated MIG profile, or None."""
    if _PROFILE.fullmatch(profile) is None:
        return f"{profile!r} is not a MIG profile such as 3g.40gb (<compute slices>g.<memory>gb)"
    return None


def layout_problem(profiles: list[str], memory_gb: float) -> str | None:
    """Why these instances cannot share one GPU of `memory_gb`, or None."""
    for p in profiles:
        if (problem := profile_problem(p)) is not None:
            return problem
    matches = [_PROFILE.fullmatch(p) for p in profiles]
    slices = sum(int(m["slices"]) for m in matches if m)
    gb = sum(int(m["gb"]) for m in matches if m)
    if slices > COMPUTE_SLICES:
        return f"{' + '.join(profiles)} needs {slices} compute slices; a GPU has {COMPUTE_SLICES}"
    if gb > memory_gb * 1.02:  # the gb figures are rounded up
        return f"{' + '.join(profiles)} needs {gb} GB of memory; the GPU has {memory_gb:.0f}"
    return None


@dataclass(frozen=True, slots=True)
class SimInstance:
    mig: MigInstance
    slices: int
    memory_bytes: int


def instances(seed: int, gpu: int, profiles: list[str], gpu_memory_bytes: int) -> tuple[SimInstance, ...]:
    nominal_gb = round(gpu_memory_bytes / 1024**3)
    out = []
    for i, profile in enumerate(profiles):
        m = _PROFILE.fullmatch(profile)
        assert m is not None, profile  # the scenario was validated
        gi = i + 1
        raw = uuid.uuid5(_NAMESPACE, f"{seed}/{gpu}/{gi}")
        memory = gpu_memory_bytes * int(m["gb"]) // nominal_gb // 1024**2 * 1024**2
        out.append(SimInstance(MigInstance(gi, 0, profile, f"MIG-{raw}"), int(m["slices"]), memory))
    return tuple(out)
