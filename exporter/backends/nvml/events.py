"""XIDs from NVML's event API: one event set over the GPUs whose handles the backend holds.

An event names its GPU by handle. It is matched against the handles we hold, with no driver call:
`nvmlDeviceGetIndex` fails for exactly the GPU that fell off the bus, whose XIDs matter most.

A lost GPU in the set makes every wait end in GPU_IS_LOST, which would silence the XIDs of all the
others. So the set is rebuilt without the GPUs that no longer answer (warned about once, not on every
rebuild); the kernel log still reports their XIDs, and a GPU that answers again is let back in.

Only the thread that waits on the set frees it: another thread (a poll that found a handle stale) only
asks for a new one, which the waiter builds when its wait returns. Freeing a set another thread is
waiting on is undefined behaviour in NVML.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from gpu_triage.exporter.backends.base import BackendError, DriverXid
from gpu_triage.exporter.backends.nvml.query import LOST, STALE, error_name

log = logging.getLogger(__name__)
_XID = pynvml.nvmlEventTypeXidCriticalError
_DRAIN_AT_MOST = 1000  # events handed over per call: a stream that never pauses is still delivered
# nvml.h: gpuInstanceId / computeInstanceId hold "a valid GPU instance ID" when the XID "is attributable to a GPU
# instance" in MIG mode, and 0xFFFFFFFF otherwise: the whole device.
_WHOLE_DEVICE = 0xFFFFFFFF


def _instance(value: int) -> int | None:
    return None if value == _WHOLE_DEVICE else int(value)


def address(handle: Any) -> int | None:
    """What identifies an NVML device handle: the address it points at."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


class XidEvents:
    def __init__(self, handles: Callable[[], Mapping[int, Any]]) -> None:
        self._handles = handles  # NVML index -> handle, as the backend holds them now
        self._lock = threading.Lock()
        self._set: Any = None
        self._renew = False  # asked for a new set: the waiter frees the old one and builds it
        self._by_address: dict[int, int] = {}  # handle address -> NVML index, for the GPUs in the set
        self._left_out: set[int] = set()  # GPUs that stopped answering: not in the set

    def wait(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs that arrived, waiting up to `timeout_seconds` for the first. Events are not replayed:
        what came before registration is only in the kernel log."""
        events = self._event_set()
        if events is None:
            raise BackendError("no GPU here can report XID events through NVML")
        out: list[DriverXid] = []
        wait_ms = int(timeout_seconds * 1000)
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(events, wait_ms)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_TIMEOUT or out:
                    return out  # a persistent error comes back on the next call
                self.renew()
                if err.value in LOST and self._leave_out_silent_gpus():
                    # Registered again at once, without them: the others' events keep flowing.
                    if (events := self._event_set()) is None:
                        return out
                    continue
                # The caller backs off before asking again: an error that persists must not spin.
                raise BackendError(f"NVML event wait failed: {error_name(err)}") from err
            if data.eventType == _XID:
                key = address(data.device)
                index = self._by_address.get(key, -1) if key is not None else -1
                out.append(
                    DriverXid(
                        gpu=index,
                        code=int(data.eventData),
                        timestamp=time.time(),
                        gpu_instance=_instance(data.gpuInstanceId),
                        compute_instance=_instance(data.computeInstanceId),
                    )
                )
            if len(out) >= _DRAIN_AT_MOST:
                return out
            wait_ms = 0  # drain whatever else is queued, then return

    def renew(self) -> None:
        """Build the set afresh at the next wait (the handles changed, or a GPU came back)."""
        with self._lock:
            self._renew = True

    def close(self) -> None:
        """At shutdown, once the waiting thread has stopped."""
        with self._lock:
            events, self._set = self._set, None
        _free(events)

    def readmit(self, index: int) -> None:
        """GPU `index` answers again: watch its XIDs again."""
        if index in self._left_out:
            with self._lock:
                self._left_out.discard(index)
            log.info("watching the GPU's XID events again", extra={"gpu": index})
            self.renew()

    def _event_set(self) -> Any:
        """The set to wait on, built anew if asked for; called only by the waiting thread."""
        with self._lock:
            if self._renew:
                self._renew = False
                _free(self._set)
                self._set = None
            if self._set is not None:
                return self._set
            try:
                events = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as err:
                log.warning("NVML events unavailable", extra={"nvml": error_name(err)})
                return None
            by_address = {}
            for index, handle in self._handles().items():
                if index in self._left_out:
                    continue
                try:
                    if pynvml.nvmlDeviceGetSupportedEventTypes(handle) & _XID:
                        pynvml.nvmlDeviceRegisterEvents(handle, _XID, events)
                        if (key := address(handle)) is not None:
                            by_address[key] = index
                except pynvml.NVMLError as err:
                    if err.value in LOST | STALE:
                        self._left_out.add(index)
                    log.warning("cannot watch XID events", extra={"gpu": index, "nvml": error_name(err)})
            if not by_address:
                pynvml.nvmlEventSetFree(events)
                return None
            self._set, self._by_address = events, by_address
            return events

    def _leave_out_silent_gpus(self) -> bool:
        """After GPU_IS_LOST from a wait: find the GPUs that no longer answer and leave them out."""
        silent = set()
        for index, handle in self._handles().items():
            try:
                pynvml.nvmlDeviceGetUUID(handle)
            except pynvml.NVMLError as err:
                if err.value in LOST | STALE:
                    silent.add(index)
            except UnicodeDecodeError:
                pass
        with self._lock:
            new = silent - self._left_out
            self._left_out |= new
        if new:
            log.warning(
                "GPU lost: its XIDs now come from the kernel log only; the other GPUs' NVML events go on",
                extra={"gpus": sorted(new)},
            )
        return bool(new)


def _free(events: Any) -> None:
    if events is not None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlEventSetFree(events)
