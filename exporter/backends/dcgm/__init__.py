"""The DCGM backend: telemetry, profiling and health watches from a running DCGM host engine.

Its names load on first use: a daemon on NVML imports only `address` (is a host engine there to ask?),
not the backend and its field tables.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.dcgm.address import Address
    from gpu_triage.exporter.backends.dcgm.backend import DcgmBackend

_WHERE = {"Address": "address", "DcgmBackend": "backend"}

__all__ = ["Address", "DcgmBackend"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
