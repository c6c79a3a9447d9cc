"""The NVML backend: real GPUs through nvidia-ml-py (the `pynvml` module).

Every call goes through `Query` (query.py), so the error policy lives in one place. Calls
name `pynvml.<function>` at call time rather than importing the functions, so the code that
runs in production is also what the tests drive with substituted device functions. What each
collector reads is in readers.py; this module keeps the handles and the events.

A GPU being reset is inaccessible, which nvml.h reports as GPU_IS_LOST: it is down until it answers
again, on the handle it had. A handle that stops naming its GPU (INVALID_ARGUMENT, as after an unbind
and a rebind; nvml.h documents it for GPU-instance handles after a reset) makes the GPU lost until the
next slow poll looks it up again, by UUID, else PCI bus id, else index; fast polls do not call the
driver on it meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from gpu_triage.diagnosis.core.pci import canonical_bus_id
from gpu_triage.exporter.backends.base import BackendError, DriverXid, GpuIdentity, GpuLostError, Result
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.counter_rates import CounterRates
from gpu_triage.exporter.backends.nvml.events import XidEvents
from gpu_triage.exporter.backends.nvml.gpm import GpmProfiler
from gpu_triage.exporter.backends.nvml.kept import Kept
from gpu_triage.exporter.backends.nvml.mig import MigDevice
from gpu_triage.exporter.backends.nvml.plain import BOARD_LIMITS
from gpu_triage.exporter.backends.nvml.query import (
    BROKEN,
    FieldLog,
    HandleLostError,
    Query,
    describe_init_error,
    error_name,
    readable,
    text,
)
from gpu_triage.exporter.backends.nvml.readers import READERS
from gpu_triage.exporter.backends.nvml.release import Hold, ReleaseRequests
from gpu_triage.exporter.backends.per_poll import PerPoll
from gpu_triage.exporter.backends.readings import ClockDomain, ThresholdKind

log = logging.getLogger(__name__)
_READS_END_SECONDS = 30.0  # at most, for reads in flight to end before NVML is shut down for a release
_READS_LOOK_EVERY = 0.01  # seconds between looks, while a release waits for them


def _released(hold: Hold) -> str:
    until = time.strftime("%H:%M:%S", time.localtime(hold.until))
    return f"NVML is let go of for a GPU reset until {until} (gpu-triage release; --resume takes it back)"


# The initial PID namespace's inode number, fixed by the kernel (PROC_PID_INIT_INO, include/linux/proc_ns.h).
_HOST_PID_NAMESPACE = "pid:[4026531836]"


def host_pid_namespace(proc: Path) -> bool:
    """Whether we run in the host's PID namespace, where NVML's PIDs (the host's) name our /proc entries.

    Compared with the initial namespace's fixed inode rather than with /proc/1/ns/pid: in a container
    PID 1 is the container's own init, in the container's namespace, and reading it needs ptrace rights.
    """
    try:
        return str((proc / "self" / "ns" / "pid").readlink()) == _HOST_PID_NAMESPACE
    except OSError:
        return False


class NvmlBackend:
    name = "nvml"
    why = "--backend nvml"

    def __init__(
        self,
        *,
        proc: Path = Path("/proc"),
        monotonic: Callable[[], float] = time.monotonic,
        release_dir: Path | None = None,
    ) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise BackendError(describe_init_error(err)) from err
        self._handles: dict[int, Any] = {}
        self._stale: set[int] = set()  # GPUs whose handle stopped naming them: looked up again when slow
        self._lookup_locks: dict[int, threading.Lock] = {}
        self.link_counts: dict[int, int] = {}  # NVLink links per GPU, once NVML has said
        self.thresholds: dict[int, dict[ThresholdKind, float]] = {}  # the GPU's temperature limits, once read
        self.max_clocks: Kept[dict[ClockDomain, float]] = Kept(monotonic)  # kept a while (kept.py)
        self.board_limits: dict[str, Kept[dict[str, Any]]] = {reading: Kept(monotonic) for reading in BOARD_LIMITS}
        self.mig_profiles: dict[int, list[Any]] = {}  # GPU-instance profile tables, once read
        self.rates = CounterRates(monotonic)  # PCIe and NVLink byte counters between polls
        self._log = FieldLog()
        self._events = XidEvents(lambda: dict(self._handles))
        self.gpm = GpmProfiler()
        self.mig_listings: PerPoll[int, list[MigDevice]] = PerPoll()  # by GPU index (nvml/mig.listed)
        self._proc = proc
        self._gpus: list[GpuIdentity] = []
        self._releases = ReleaseRequests(release_dir)  # `gpu-triage release`, through the state directory
        self._released: Hold | None = None  # NVML let go of until then
        self._reading = 0  # reads in flight: NVML is shut down only once none is
        # A plain lock, not a condition: every read takes it twice, and only a release (rare) waits for none.
        self._reading_lock = threading.Lock()
        # In a container with a PID namespace of its own, /proc/<pid> of an NVML PID is some other
        # process or none: the process label is left out rather than wrong.
        self._names_visible = host_pid_namespace(proc)
        if not self._names_visible:
            log.info("not in the host's PID namespace: GPU processes are listed by PID without names")

    def discover(self) -> list[GpuIdentity]:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            raise BackendError(f"cannot count GPUs: {error_name(err)}") from err
        gpus = []
        for index in range(count):
            self._lookup_locks[index] = threading.Lock()
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as err:
                self._unreadable(index, err)
                # A GPU that is already lost at start still counts: it is reported as down, and looked up
                # again (by index: nothing else is known of it) on the slow polls.
                self._stale.add(index)
                gpus.append(GpuIdentity(index, f"unknown-{index}", f"unknown-{index}"))
                continue
            self._handles[index] = handle
            uuid = self._string(index, "uuid", pynvml.nvmlDeviceGetUUID, handle) or f"unknown-{index}"
            raw_bus = self._string(index, "pci_bus_id", lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, handle) or ""
            gpus.append(GpuIdentity(index, uuid, canonical_bus_id(raw_bus) or raw_bus.lower() or f"unknown-{index}"))
        self._gpus = gpus
        return gpus

    def _unreadable(self, gpu: int, err: pynvml.NVMLError, field: str = "handle") -> None:
        if err.value in BROKEN:
            raise BackendError(f"NVML: {error_name(err)}") from err
        log.error("GPU not readable at discovery", extra={"gpu": gpu, "field": field, "nvml": error_name(err)})

    def _string(self, gpu: int, field: str, fn: Any, handle: Any) -> str | None:
        """An identity string, or None: a GPU whose UUID cannot be read keeps its handle and is read as usual."""
        try:
            return text(fn(handle))
        except UnicodeDecodeError as err:  # a corrupt InfoROM must not stop the daemon from starting
            return readable(err, gpu, field, self._log)
        except pynvml.NVMLError as err:
            self._unreadable(gpu, err, field)
            return None

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        hold = self._releases.wanted() or self._released
        if hold is not None:
            raise BackendError(_released(hold))
        with self._reading_lock:
            self._reading += 1
        try:
            return self._read(gpu, collector)
        finally:
            with self._reading_lock:
                self._reading -= 1

    def _read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        handle = self._handle(gpu, collector)
        q = Query(gpu.index, self._log, handle)
        try:
            reading = READERS[collector](self, q, handle, gpu.index)
        except BaseException as e:
            self.mig_listings.forget(gpu.index)  # a GPU that failed a read is listed afresh
            self.max_clocks.forget(gpu.index)  # and its limits asked again
            for kept in self.board_limits.values():
                kept.forget(gpu.index)
            if isinstance(e, HandleLostError) and gpu.index not in self._stale:
                self._stale.add(gpu.index)
                log.warning(
                    "GPU handle no longer valid (a reset or an unbind?): the GPU is down until the next "
                    "slow poll finds it again",
                    extra={"gpu": gpu.index, "collector": collector},
                )
            raise
        self._events.readmit(gpu.index)
        return Result(reading, tuple(q.failed))

    def _handle(self, gpu: GpuIdentity, collector: Collector) -> Any:
        if gpu.index in self._stale:
            if not collector.slow:
                raise GpuLostError(f"GPU {gpu.index}: waiting for the next slow poll to look its handle up again")
            self._look_up_again(gpu)
        handle = self._handles.get(gpu.index)
        if handle is None:
            raise GpuLostError(f"GPU {gpu.index} has no NVML handle")
        return handle

    def _look_up_again(self, gpu: GpuIdentity) -> None:
        """A fresh handle for a GPU whose old one went stale, by UUID, else by PCI bus id."""
        with self._lookup_locks[gpu.index]:  # the slow collectors of one GPU run at once: look up once
            if gpu.index not in self._stale:
                return
            lookup: Any
            key: str | int
            if not gpu.uuid.startswith("unknown-"):
                by, lookup, key = "uuid", pynvml.nvmlDeviceGetHandleByUUID, gpu.uuid
            elif not gpu.pci_bus_id.startswith("unknown-"):
                # pynvml has no _v2 of its own: nvmlDeviceGetHandleByPciBusId calls the C _v2.
                by, lookup, key = "pci_bus_id", pynvml.nvmlDeviceGetHandleByPciBusId, gpu.pci_bus_id
            else:  # never identified: the index is all there is, and it names the same GPU until a reboot
                by, lookup, key = "index", pynvml.nvmlDeviceGetHandleByIndex, gpu.index
            try:
                handle = lookup(key)
                pynvml.nvmlDeviceGetUUID(handle)  # the new handle must answer, not just exist
            except pynvml.NVMLError as err:
                if err.value in BROKEN:
                    raise BackendError(f"NVML: {error_name(err)}") from err
                raise GpuLostError(f"GPU {gpu.index}: looking its handle up again: {error_name(err)}") from err
            except UnicodeDecodeError:
                pass  # it answered
            self._handles[gpu.index] = handle
            self._stale.discard(gpu.index)
            self._events.renew()  # registrations belong to the old handle
            self.gpm.forget(gpu.index)
            self.rates.forget(gpu.index)
            self.mig_listings.forget(gpu.index)  # listed through the old handle
            self.max_clocks.forget(gpu.index)
            for kept in self.board_limits.values():
                kept.forget(gpu.index)
            log.info("GPU handle looked up again; the GPU answers", extra={"gpu": gpu.index, "by": by})

    def close(self) -> None:
        self.gpm.close()
        self._events.close()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    reports_xids = True

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs from NVML's event API (events.py). This thread, the one that waits on the event set, is
        also the one that lets NVML go for a release and takes it back: no other thread frees the set."""
        hold = self._releases.wanted()
        if hold is not None:
            if self._released is None:
                self._let_go(hold)
            raise BackendError(_released(hold))
        if self._released is not None:
            self._take_back()
        return self._events.wait(timeout_seconds)

    def _let_go(self, hold: Hold) -> None:
        # New reads refuse already; those in flight end by their own deadline.
        give_up = time.monotonic() + _READS_END_SECONDS
        while self._reading and time.monotonic() < give_up:
            time.sleep(_READS_LOOK_EVERY)
        self._events.close()
        self.gpm.close()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
        self._released = hold
        self._releases.answer(hold)
        log.warning(
            "NVML let go of for a GPU reset (gpu-triage release): nothing is read until it is taken back",
            extra={"until": time.strftime("%H:%M:%S", time.localtime(hold.until)), "by": hold.by},
        )

    def _take_back(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:  # the driver is still being reset: try again at the next wait
            raise BackendError(f"taking NVML back after a release: {describe_init_error(err)}") from err
        for gpu in self._gpus:
            self._stale.add(gpu.index)
            with contextlib.suppress(GpuLostError):  # one that does not answer yet is looked up when slow
                self._look_up_again(gpu)
            self.rates.forget(gpu.index)
        self._events.renew()
        self._released = None
        self._releases.answer(None)
        log.info("NVML taken back after a release; the GPUs are read again")

    def process_name(self, pid: int) -> str | None:
        """Read afresh each poll, from /proc/<pid>/stat: a cached name goes stale when the PID is reused."""
        if not self._names_visible:
            return None
        try:
            stat = (self._proc / str(pid) / "stat").read_bytes()
        except OSError:
            return None  # already gone
        # "pid (comm) state ...": comm may itself hold spaces and parentheses, so up to the last ")".
        start, end = stat.find(b"("), stat.rfind(b")")
        return stat[start + 1 : end].decode(errors="replace") or None if 0 <= start < end else None
