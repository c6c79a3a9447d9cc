"""The DCGM backend: GPU telemetry from a running DCGM host engine (nv-hostengine).

It connects to the host engine the node already runs (never an embedded one: that would be a second
engine, and on GPUs before Hopper a second profiler), watches the fields behind every collector, and
reads their latest values. Processes and XID events are NVML's business: DCGM has no process list,
so they come from the NVML backend alongside (the `companion`) when NVML loads, and are absent when
it does not. A host engine that goes away is reconnected to (connection.py); the daemon never exits
over it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_triage.exporter.backends.base import BackendError, DriverXid, GpuIdentity, GpuLostError, Result
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.dcgm import bindings, fields
from gpu_triage.exporter.backends.dcgm.address import Address
from gpu_triage.exporter.backends.dcgm.connection import Connection
from gpu_triage.exporter.backends.dcgm.health import HealthBook
from gpu_triage.exporter.backends.dcgm.readers import READERS, Read

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)


class DcgmBackend:
    name = "dcgm"

    def __init__(
        self,
        address: Address,
        *,
        bindings_dir: Path | None = None,
        interval: float = 5.0,
        slow_interval: float = 60.0,
        companion: NvmlBackend | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.why = "--backend dcgm"
        self.b = bindings.load(bindings_dir)
        self.connection = Connection(self.b, address, interval=interval, slow_interval=slow_interval, clock=clock)
        self.connection.open()
        self.companion = companion
        self.health = HealthBook(clock)

    @property
    def status(self) -> str:
        return self.connection.status

    def discover(self) -> list[GpuIdentity]:
        gpus = list(self.connection.session().identities)
        if self.companion is not None:
            try:
                self.companion.discover()
            except BackendError as e:
                log.warning("NVML beside DCGM is not usable: no processes, no NVML XID events", extra={"error": str(e)})
                self.companion = None
        return gpus

    def read(self, gpu: GpuIdentity, collector: Collector) -> Result:
        session = self.connection.session()  # BackendError, saying why, while the host engine is away
        gpu_id = session.gpu_ids.get(gpu.uuid)
        if gpu_id is None:
            raise GpuLostError(f"the DCGM host engine does not list GPU {gpu.index} ({gpu.uuid})")
        r = Read(self, session, gpu, gpu_id)
        try:
            reading = READERS[collector](r)
        except self.b.structs.DCGMError as e:
            code = self.b.code(e)
            if code in fields.DISCONNECTED:
                self.connection.lost(session, e)
                raise BackendError(self.connection.status) from e
            if code in fields.LOST:
                raise GpuLostError(f"GPU {gpu.index}: {self.b.describe(e)}") from e
            raise BackendError(f"DCGM: {self.b.describe(e)}") from e
        return Result(reading, tuple(r.failed))

    @property
    def reports_xids(self) -> bool:
        return self.companion is not None

    def wait_xids(self, timeout_seconds: float) -> list[DriverXid]:
        """XIDs from NVML's event API beside DCGM (the kernel log has them too)."""
        if self.companion is None:
            time.sleep(min(timeout_seconds, 1.0))
            raise BackendError("no NVML beside DCGM: XIDs come from the kernel log only")
        return self.companion.wait_xids(timeout_seconds)

    def close(self) -> None:
        self.connection.close()
        if self.companion is not None:
            self.companion.close()
