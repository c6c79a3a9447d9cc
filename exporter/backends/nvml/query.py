"""The one place where NVML errors are turned into what the rest of gpu-triage understands.

- "not supported", "function not found" (an older driver), "not found", "no permission": the field
  is absent (None). Expected on many GPUs, so logged once per GPU and field, never every poll.
- GPU_IS_LOST / RESET_REQUIRED: the GPU is gone -> GpuLostError; the other GPUs carry on.
- INVALID_ARGUMENT from a device call: the arguments we pass are valid, so it is the handle that no
  longer names a GPU (a reset or an unbind) -- once a second call on the handle confirms it; then,
  and for GPU_NOT_FOUND, HandleLostError. As a field's own return code it means a field or link the
  GPU does not have: absent.
- UNINITIALIZED / DRIVER_NOT_LOADED / LIB_RM_VERSION_MISMATCH / LIBRARY_NOT_FOUND: the whole
  backend is broken -> BackendError.
- anything else (UNKNOWN, TIMEOUT, ...): the field failed; it is named in `failed` and the
  collector reports failure for this poll.
- A string that is not UTF-8 (a corrupt InfoROM or name; pynvml decodes strictly): read with the
  bad bytes replaced, and warned about once.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import pynvml

from gpu_triage.exporter.backends.base import BackendError, GpuLostError
from gpu_triage.exporter.backends.nvml.field_values import Answers, FieldRequest, field_values

log = logging.getLogger(__name__)
T = TypeVar("T")
Call = tuple[str, Callable[..., T], tuple[Any, ...]]  # field name, pynvml function, its arguments


class HandleLostError(GpuLostError):
    """The NVML handle no longer names the GPU (a reset or an unbind): look it up again."""


ABSENT = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_PERMISSION,
    }
)
LOST = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED})
STALE = frozenset({pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_GPU_NOT_FOUND})
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
        # (GPU, field, return code) a batched field answered before, that the policy took as absent: answered
        # the same again, it is absent again, with nothing to log. A GPU without some NVLink counters answers
        # dozens of them so at every poll.
        self.absent: set[tuple[int, str, int]] = set()
        # (GPU, request) -> the return codes of an answer whose every field that did not answer was absent: the
        # same codes again need no look at each field.
        self.quiet: dict[tuple[int, FieldRequest], tuple[int, ...]] = {}

    def first(self, gpu: int, field: str, error: str) -> bool:
        key = (gpu, field, error)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True


class Query:
    """Reads the fields of one GPU for one collector, applying the error policy above."""

    def __init__(self, gpu: int, log_once: FieldLog, handle: Any = None) -> None:
        self.gpu = gpu
        self.failed: list[str] = []
        self._log = log_once
        self._handle = handle
        self._expected: dict[str, str] = {}  # field -> why NO_PERMISSION is expected there

    def expect_no_permission(self, why: str, fields: Sequence[str]) -> None:
        """NO_PERMISSION from these fields is how the GPU is set up: log `why` once per GPU at INFO."""
        self._expected.update(dict.fromkeys(fields, why))

    def __call__(self, field: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            # The handle still answers: the argument, then, names something this GPU does not have.
            self._fail(field, err, absent=err.value == pynvml.NVML_ERROR_INVALID_ARGUMENT and self._handle_answers())
            return None
        except UnicodeDecodeError as err:
            return cast(T, readable(err, self.gpu, field, self._log))

    def first(self, *calls: Call[T]) -> T | None:
        """The first of `calls` that answers: a newer call, then the older one a driver may have instead.
        A call that a later one stands in for is not a failed field."""
        failed = len(self.failed)
        for field, fn, args in calls:
            value = self(field, fn, *args)
            if value is not None:
                del self.failed[failed:]
                return value
        return None

    def fields(self, handle: Any, request: FieldRequest) -> list[float | None]:
        """Batched field values (one driver call); each field's own return code gets the policy."""
        answered = self._answered(handle, request)
        if answered is None:
            return [None] * len(request)
        numbers = answered.numbers
        if answered.answered_all:
            return list(map(float, cast(list[float], numbers)))
        return [None if n is None else float(n) for n in numbers]

    def counts(self, handle: Any, request: FieldRequest) -> list[int | None]:
        """`fields` as integers, for counters: an integer type's value exactly as NVML gave it, not by way of
        a float (exact above 2**53 too); a double's truncated, as int() of `fields` would."""
        answered = self._answered(handle, request)
        if answered is None:
            return [None] * len(request)
        numbers = answered.numbers
        for i in answered.doubles:
            numbers[i] = int(cast(float, numbers[i]))
        return cast(list[int | None], numbers)

    def _answered(self, handle: Any, request: FieldRequest) -> Answers | None:
        """The driver's answer, after the policy for each field that did not answer; None if the call failed."""
        answered: Answers | None = self("field_values", field_values(), handle, request)
        if answered is None or answered.answered_all:
            return answered
        # A request answered with the very codes it had when every field that did not answer was absent has
        # nothing new to say: a GPU without some NVLink counters answers dozens of them so at every poll.
        codes, quiet, key, names = answered.codes, self._log.quiet, (self.gpu, request), request.names
        if quiet.get(key) == codes:
            return answered
        absent = self._log.absent
        failed = len(self.failed)
        for i in [i for i, code in enumerate(codes) if code != _SUCCESS]:
            code, name = codes[i], names[i]
            if (self.gpu, name, code) in absent:
                continue
            before = len(self.failed)
            # A field's own INVALID_ARGUMENT: a field or link this GPU does not have.
            self._fail(name, _error(code), absent=code == _INVALID_ARGUMENT)
            if len(self.failed) == before:  # neither raised nor failed: absent
                absent.add((self.gpu, name, code))
        if len(self.failed) == failed:
            quiet[key] = codes
        return answered

    def _handle_answers(self) -> bool:
        """After INVALID_ARGUMENT: does the handle itself still answer? Raises if the GPU is gone."""
        if self._handle is None:
            return True
        try:
            pynvml.nvmlDeviceGetUUID(self._handle)
        except pynvml.NVMLError as err:
            if err.value in STALE:
                return False
            self._fail("uuid", err)  # lost or broken: raises; anything else is that call's own failure
        except UnicodeDecodeError:
            pass
        return True

    def _fail(self, field: str, err: pynvml.NVMLError, *, absent: bool = False) -> None:
        code, name = err.value, error_name(err)
        if code in STALE and not absent:
            raise HandleLostError(f"GPU {self.gpu}: its NVML handle is no longer valid ({name})") from err
        if code in LOST:
            raise GpuLostError(f"GPU {self.gpu}: {name} (reading {field})") from err
        if code in BROKEN:
            raise BackendError(f"NVML: {name}") from err
        if code == pynvml.NVML_ERROR_NO_PERMISSION and (why := self._expected.get(field)) is not None:
            if self._log.first(self.gpu, why, name):
                log.info(why, extra={"gpu": self.gpu})
            return
        first = self._log.first(self.gpu, field, name)
        if code in ABSENT or absent:
            if first:
                level = logging.WARNING if code == pynvml.NVML_ERROR_NO_PERMISSION else logging.DEBUG
                log.log(level, "field not available", extra={"gpu": self.gpu, "field": field, "nvml": name})
            return
        self.failed.append(field)
        if first:
            log.warning("field read failed", extra={"gpu": self.gpu, "field": field, "nvml": name})


def readable(err: UnicodeDecodeError, gpu: int, field: str, log_once: FieldLog) -> str:
    """The text pynvml could not decode, with the bad bytes replaced: a corrupt serial still names the GPU."""
    if log_once.first(gpu, field, "UnicodeDecodeError"):
        log.warning("NVML string is not UTF-8; bad bytes replaced", extra={"gpu": gpu, "field": field})
    raw = err.object
    return bytes(raw).decode(errors="replace").rstrip("\0")


def text(value: Any) -> str | None:
    """A string NVML returned (pynvml gives str or bytes by version)."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_SUCCESS, _INVALID_ARGUMENT = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INVALID_ARGUMENT


@functools.cache
def _error(code: int) -> pynvml.NVMLError:
    """The error of a field's return code, made once per code: a GPU without NVLink answers a dozen fields
    INVALID_ARGUMENT at every poll, and only the first is logged."""
    return pynvml.NVMLError(code)
