"""Choosing a backend by name: the backends are imported only once chosen."""

from __future__ import annotations

import logging
from typing import Literal

from gpu_triage.exporter.backends.base import BackendError, GpuBackend

log = logging.getLogger(__name__)

BackendName = Literal["auto", "nvml", "dcgm", "sim"]


def open_backend(name: BackendName, *, scenario: str = "h100-training") -> GpuBackend:
    """The backend called `name`, ready to `discover()`. Raises BackendError with a message for the user."""
    if name == "sim":
        from gpu_triage.exporter.backends.sim import ScenarioError, SimBackend, load_scenario

        try:
            return SimBackend(load_scenario(scenario))
        except ScenarioError as e:
            raise BackendError(str(e)) from e
    if name == "dcgm":
        raise BackendError("the DCGM backend is not part of this version yet; --backend nvml reads the same GPUs")
    from gpu_triage.exporter.backends.nvml import NvmlBackend

    if name == "nvml":
        return NvmlBackend()
    # auto: DCGM would come first once it exists; NVML is the backend every driver install has.
    try:
        return NvmlBackend()
    except BackendError as e:
        raise BackendError(f"no GPU backend could start: {e}") from e
