"""The one place where NVML errors are turned into what the rest of gpu-triage understands.

- "not supported", "function not found" (an older driver), "invalid argument" (a link the GPU
  does not have), "not found", "no permission": the field is absent (None). Expected on many
  GPUs, so logged once per GPU and field, never every poll.
- GPU_IS_LOST / RESET_REQUIRED: the GPU is gone -> GpuLostError; the other GPUs carry on.
- UNINITIALIZED / DRIVER_NOT_LOADED / LIB_RM_VERSION_MISMATCH / LIBRARY_NOT_FOUND: the whole
  backend is broken -> BackendError.
- anything else (UNKNOWN, TIMEOUT, ...): the field failed; it is named in `failed` and the
  collector reports failure for this poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

from gpu_triage.exporter.backends.base import BackendError, GpuLostError

log = logging.getLogger(__name__)
T = TypeVar("T")

ABSENT = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    }
)
LOST = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED})
BROKEN = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    }
)


def error_name(err: pynvml.NVMLError) -> str:
    return type(err).__name__.removeprefix("NVMLError_")


def describe_init_error(err: pynvml.NVMLError) -> str:
    """What to tell a user whose nvmlInit failed."""
    code = err.value
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return (
            "NVML was not found (libnvidia-ml.so.1): no NVIDIA driver on this machine. "
            "To try gpu-triage without a GPU, run it on simulated GPUs: --backend sim"
        )
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA driver is installed but not loaded (check `nvidia-smi` and `lsmod | grep nvidia`)"
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "the NVIDIA driver was upgraded but the old kernel module is still loaded: reboot the node"
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return "no permission to open /dev/nvidia*: run as a user that can access the GPU devices"
    return f"NVML initialisation failed: {error_name(err)}"


class FieldLog:
    """Remembers which (GPU, field, error) it has already reported, so each is logged once."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, str, str]] = set()
        self._lock = threading.Lock()

    def first(self, gpu: int, field: str, error: str) -> bool:
        key = (gpu, field, error)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True


class Query:
    """Reads the fields of one GPU for one collector, applying the error policy above."""

    def __init__(self, gpu: int, log_once: FieldLog) -> None:
        self.gpu = gpu
        self.failed: list[str] = []
        self._log = log_once

    def __call__(self, field: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            self._fail(field, err)
            return None

    def fields(self, handle: Any, ids: Sequence[tuple[int, int]], names: Sequence[str]) -> list[float | None]:
        """Batched field values (one driver call); each field's own return code gets the policy."""
        values = self("field_values", pynvml.nvmlDeviceGetFieldValues, handle, list(ids))
        if values is None:
            return [None] * len(ids)
        out: list[float | None] = []
        for name, fv in zip(names, values, strict=True):
            if fv.nvmlReturn != pynvml.NVML_SUCCESS:
                self._fail(name, pynvml.NVMLError(fv.nvmlReturn))
                out.append(None)
            else:
                out.append(field_value(fv))
        return out

    def _fail(self, field: str, err: pynvml.NVMLError) -> None:
        code, name = err.value, error_name(err)
        if code in LOST:
            raise GpuLostError(f"GPU {self.gpu}: {name}") from err
        if code in BROKEN:
            raise BackendError(f"NVML: {name}") from err
        first = self._log.first(self.gpu, field, name)
        if code in ABSENT:
            if first:
                level = logging.WARNING if code == pynvml.NVML_ERROR_NO_PERMISSION else logging.DEBUG
                log.log(level, "field not available", extra={"gpu": self.gpu, "field": field, "nvml": name})
            return
        self.failed.append(field)
        if first:
            log.warning("field read failed", extra={"gpu": self.gpu, "field": field, "nvml": name})


_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(fv: Any) -> float:
    """The number in a c_nvmlFieldValue_t, read by its value type."""
    return float(getattr(fv.value, _VALUE_MEMBER.get(fv.valueType, "ullVal")))
