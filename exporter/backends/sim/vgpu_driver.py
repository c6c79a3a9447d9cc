"""`gpu-triage vgpu`: the simulator drives the virtual GPU (vgpu/, `make vgpu`).

Every tick (a second) it reads each simulated GPU through the simulator backend's public API, as
any user of a backend does, and writes what it read to the vGPU state file that
build/vgpu/libnvidia-ml.so.1 maps. Any NVML client started with LD_LIBRARY_PATH=build/vgpu and
GPU_TRIAGE_VGPU_STATE=<the file> then sees the scenario's GPUs: `gpu-triage serve --backend nvml`,
nvitop, gpustat.

The values go in NVML's own units, as nvml.h documents each call, not as gpu-triage's NVML backend
converts them back (the pair exists to catch a mistake they would share): watts -> milliwatts,
joules -> millijoules, hertz -> MHz, bytes/s -> KB/s of 1000 bytes, ratios -> percent. Lasting
faults become the record's flags (lost, hung, a reset in flight as an invalid handle); XIDs go to
the file's event ring, where nvmlEventSetWait_v2 finds them. `POST /api/v1/sim/faults` injects
faults, as on `gpu-triage serve --backend sim`.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path

from fastapi import FastAPI

from gpu_triage.exporter.backends.base import Collector, GpuIdentity, GpuLostError
from gpu_triage.exporter.backends.readings import (
    ClockDomain,
    Clocks,
    Ecc,
    Inventory,
    LinkState,
    Memory,
    NvLink,
    Pcie,
    Power,
    Processes,
    Profiling,
    Reading,
    Recovery,
    Remapping,
    Thermal,
    Utilization,
)
from gpu_triage.exporter.backends.sim import vgpu_state as vs
from gpu_triage.exporter.backends.sim.backend import SimBackend
from gpu_triage.exporter.backends.sim.faults import FaultKind

log = logging.getLogger(__name__)
TICK_SECONDS = 1.0
KB = 1000  # nvml.h: nvmlDeviceGetPcieThroughput answers in KB/s
MHZ = 1e6
_CLOCK_TYPE = {ClockDomain.GRAPHICS: 0, ClockDomain.SM: 1, ClockDomain.MEMORY: 2, ClockDomain.VIDEO: 3}
_DEVICE_MEMORY = vs.LOCATION_DEVICE_MEMORY
_MEMORY_TEMP_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP
_FLAGS = {FaultKind.GPU_LOST: "lost", FaultKind.HUNG_CALL: "hung", FaultKind.GPU_RESET: "invalid_handle"}
MIB = 1024 * 1024
# nvml.h NVML_GPM_METRIC_*: activity in percent, traffic in MiB/s; per-link NVLink from L0 RX, then TX.
_GPM_PERCENT = {
    1: "graphics_engine_active", 2: "sm_active", 3: "sm_occupancy", 5: "tensor_active",
    10: "dram_active", 11: "fp64_active", 12: "fp32_active", 13: "fp16_active",
}  # fmt: skip
_GPM_MIB = {
    20: "pcie_tx_bytes_per_second", 21: "pcie_rx_bytes_per_second",
    60: "nvlink_rx_bytes_per_second", 61: "nvlink_tx_bytes_per_second",
}  # fmt: skip
_GPM_LINK_0_RX = 62


def _percent(ratio: float | None) -> int:
    return 0 if ratio is None else round(ratio * 100)


def _milli(value: float | None) -> int:
    return 0 if value is None else round(value * 1000)


def _absent(gpu: vs.Gpu, query: vs.Query, value: object) -> None:
    """A value the simulated GPU does not have answers NOT_SUPPORTED, as it would on the real one."""
    if value is None:
        gpu.unsupported.add(query)
    else:
        gpu.unsupported.discard(query)


def _inventory(gpu: vs.Gpu, r: Inventory) -> None:
    gpu.name = r.name or gpu.name
    gpu.serial = r.serial or ""
    gpu.vbios_version = r.vbios_version or ""
    _absent(gpu, vs.Query.MIG, r.mig_enabled)
    gpu.mig_mode = gpu.mig_mode_pending = bool(r.mig_enabled)


def _utilization(gpu: vs.Gpu, r: Utilization) -> None:
    _absent(gpu, vs.Query.UTILIZATION, r.gpu_ratio)
    gpu.utilization_gpu, gpu.utilization_memory = _percent(r.gpu_ratio), _percent(r.memory_controller_ratio)


def _memory(gpu: vs.Gpu, r: Memory) -> None:
    _absent(gpu, vs.Query.MEMORY, r.total_bytes)
    gpu.memory_total, gpu.memory_used = r.total_bytes or 0, r.used_bytes or 0
    gpu.memory_reserved = r.reserved_bytes or 0


def _power(gpu: vs.Gpu, r: Power) -> None:
    _absent(gpu, vs.Query.POWER_USAGE, r.usage_watts)
    _absent(gpu, vs.Query.POWER_LIMIT, r.limit_watts)
    _absent(gpu, vs.Query.ENERGY, r.energy_joules)
    gpu.power_mw, gpu.energy_mj = _milli(r.usage_watts), _milli(r.energy_joules)
    limit = _milli(r.limit_watts)
    gpu.power_limit_enforced_mw = gpu.power_limit_mw = gpu.power_limit_default_mw = gpu.power_limit_max_mw = limit


def _thermal(gpu: vs.Gpu, r: Thermal) -> None:
    _absent(gpu, vs.Query.TEMPERATURE, r.gpu_celsius)
    _absent(gpu, vs.Query.FAN_SPEED, r.fan_ratio)
    gpu.temperature_gpu = round(r.gpu_celsius or 0)
    gpu.temperature_memory = round(r.memory_celsius or 0)
    if r.memory_celsius is None:
        gpu.unsupported_fields.add(_MEMORY_TEMP_FIELD)
    gpu.fan_speed = _percent(r.fan_ratio)


def _clocks(gpu: vs.Gpu, r: Clocks) -> None:
    for domain, slot in _CLOCK_TYPE.items():
        gpu.clocks_mhz[slot] = round(r.current_hz.get(domain, 0.0) / MHZ)
        gpu.max_clocks_mhz[slot] = round(r.max_hz.get(domain, 0.0) / MHZ)
    _absent(gpu, vs.Query.CLOCK_EVENT_REASONS, r.event_reasons)
    gpu.clocks_event_reasons = r.event_reasons or 0  # the readings' bits are NVML's
    _absent(gpu, vs.Query.PERFORMANCE_STATE, r.performance_state)
    gpu.pstate = r.performance_state or 0


def _pcie(gpu: vs.Gpu, r: Pcie) -> None:
    _absent(gpu, vs.Query.PCIE_THROUGHPUT, r.tx_bytes_per_second)
    gpu.pcie_tx_kbs = round((r.tx_bytes_per_second or 0) / KB)
    gpu.pcie_rx_kbs = round((r.rx_bytes_per_second or 0) / KB)
    gpu.pcie_link_gen, gpu.pcie_link_gen_max = r.link_generation or 0, r.max_link_generation or 0
    gpu.pcie_link_width, gpu.pcie_link_width_max = r.link_width or 0, r.max_link_width or 0
    gpu.pcie_replay_count = r.replay_errors or 0


def _nvlink(gpu: vs.Gpu, r: NvLink) -> None:
    gpu.nvlinks = [
        vs.NvLink(
            state=LinkState.INACTIVE if k.state is None else k.state,
            replay_errors=k.replay_errors or 0,
            recovery_errors=k.recovery_errors or 0,
            crc_flit_errors=k.crc_errors or 0,
        )
        for k in r.links
    ]


def _processes(gpu: vs.Gpu, r: Processes) -> None:
    gpu.processes = [vs.Process(pid=p.pid, used_memory=p.used_bytes) for p in (r.processes or ())[: vs.MAX_PROCESSES]]


def _profiling(gpu: vs.Gpu, r: Profiling) -> None:
    """What GPM would compute from two samples: the simulator gives the rates, the library hands them on."""
    _absent(gpu, vs.Query.GPM, r.gpu)
    if r.gpu is None:
        return
    values: dict[int, float] = {}
    for metric, name in _GPM_PERCENT.items():
        if (ratio := getattr(r.gpu, name)) is not None:
            values[metric] = ratio * 100
    for metric, name in _GPM_MIB.items():
        if (rate := getattr(r.gpu, name)) is not None:
            values[metric] = rate / MIB
    for link in r.gpu.nvlink_links:
        if link.rx_bytes_per_second is not None:
            values[_GPM_LINK_0_RX + 2 * link.link] = link.rx_bytes_per_second / MIB
        if link.tx_bytes_per_second is not None:
            values[_GPM_LINK_0_RX + 2 * link.link + 1] = link.tx_bytes_per_second / MIB
    gpu.gpm = values


def _recovery(gpu: vs.Gpu, r: Recovery) -> None:
    gpu.recovery_action = r.action or 0


def _ecc(gpu: vs.Gpu, r: Ecc) -> None:
    _absent(gpu, vs.Query.ECC, r.enabled)
    gpu.ecc_mode = gpu.ecc_mode_pending = bool(r.enabled)
    counts = {
        (vs.ECC_CORRECTED, vs.ECC_VOLATILE): r.corrected_volatile,
        (vs.ECC_UNCORRECTED, vs.ECC_VOLATILE): r.uncorrected_volatile,
        (vs.ECC_CORRECTED, vs.ECC_AGGREGATE): r.corrected_aggregate,
        (vs.ECC_UNCORRECTED, vs.ECC_AGGREGATE): r.uncorrected_aggregate,
    }
    gpu.ecc = {(kind, counter, _DEVICE_MEMORY): n or 0 for (kind, counter), n in counts.items()}
    gpu.retired_pending = bool(r.retired_pages_pending)


def _remapping(gpu: vs.Gpu, r: Remapping) -> None:
    _absent(gpu, vs.Query.REMAPPED_ROWS, r.pending)
    gpu.remapped_correctable, gpu.remapped_uncorrectable = r.correctable_rows or 0, r.uncorrectable_rows or 0
    gpu.remap_pending, gpu.remap_failure = bool(r.pending), bool(r.failure)


def new_record(identity: GpuIdentity) -> vs.Gpu:
    domain, bus, rest = identity.pci_bus_id.split(":")
    return vs.Gpu(
        uuid=identity.uuid,
        pci_domain=int(domain, 16),
        pci_bus=int(bus, 16),
        pci_device=int(rest.split(".")[0], 16),
        minor_number=identity.index,
    )


def apply(gpu: vs.Gpu, reading: Reading) -> None:
    """Write one reading into the GPU's record, in NVML's units."""
    match reading:
        case Inventory():
            _inventory(gpu, reading)
        case Utilization():
            _utilization(gpu, reading)
        case Memory():
            _memory(gpu, reading)
        case Power():
            _power(gpu, reading)
        case Thermal():
            _thermal(gpu, reading)
        case Clocks():
            _clocks(gpu, reading)
        case Pcie():
            _pcie(gpu, reading)
        case NvLink():
            _nvlink(gpu, reading)
        case Processes():
            _processes(gpu, reading)
        case Profiling():
            _profiling(gpu, reading)
        case Recovery():
            _recovery(gpu, reading)
        case Ecc():
            _ecc(gpu, reading)
        case Remapping():
            _remapping(gpu, reading)
        case _:  # a collector added to the simulator and not here yet: its values stay NVML's defaults
            pass


class VgpuDriver:
    """Reads the simulator every tick and publishes it to the state file; forwards its XIDs."""

    def __init__(self, sim: SimBackend, state: Path) -> None:
        self.sim = sim
        self.gpus = sim.discover()
        if len(self.gpus) > vs.MAX_GPUS:
            raise ValueError(f"the vGPU state file holds at most {vs.MAX_GPUS} GPUs, the scenario has {len(self.gpus)}")
        self.records = [new_record(g) for g in self.gpus]
        self._lock = threading.Lock()  # one writer of the file: ticks and XIDs come from two threads
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._read()  # the first values are in the file from its creation on
        node = sim.scenario.node
        major, minor = (int(p) for p in node.cuda_driver_version.split(".")[:2])
        self.writer = vs.StateWriter(
            state,
            self.records,
            driver_version=node.driver_version,
            nvml_version=f"{major}.{node.driver_version}",
            cuda_driver_version=1000 * major + 10 * minor,
        )

    def tick(self) -> None:
        """Read every GPU and publish the node."""
        self._read()
        with self._lock:
            self.writer.write(self.records)

    def _read(self) -> None:
        """Read every GPU the simulator can answer for into its record."""
        faulty: dict[int, set[str]] = {}
        for fault in self.sim.faults():
            if (flag := _FLAGS.get(fault.spec.kind)) is not None:
                faulty.setdefault(fault.spec.gpu, set()).add(flag)
        for gpu, record in zip(self.gpus, self.records, strict=True):
            flags = faulty.get(gpu.index, set())
            if not flags:  # a lost or reset GPU has no values to read, a hung one would block the tick
                try:
                    for collector in Collector:
                        apply(record, self.sim.read(gpu, collector).reading)
                except GpuLostError:
                    flags = {"lost"}  # a fault that started during this tick
            record.lost, record.hung = "lost" in flags, "hung" in flags
            record.invalid_handle = "invalid_handle" in flags

    def changed(self) -> None:
        """A fault was injected or cleared: publish now rather than at the next tick."""
        self._wake.set()

    def start(self) -> None:
        for target, name in ((self._ticks, "vgpu-ticks"), (self._xids, "vgpu-xids")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.sim.close()
        self.writer.close()

    def _ticks(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(TICK_SECONDS)
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # the next tick tries again; the driver never dies of one bad read
                log.exception("vGPU tick failed")

    def _xids(self) -> None:
        while not self._stop.is_set():
            for xid in self.sim.wait_xids(0.5):
                with self._lock:
                    self.writer.push_xid(xid.gpu, xid.code)


def driver_app(driver: VgpuDriver) -> FastAPI:
    from gpu_triage.exporter.http.sim_faults import sim_router  # the web stack loads only when serving

    async def shown() -> None:
        driver.changed()

    app = FastAPI(title="gpu-triage vgpu", summary="The simulator driving the virtual GPU's state file")
    app.include_router(sim_router(driver.sim, shown))
    return app


def run(scenario: str, state: Path, listen: str) -> int:
    """`gpu-triage vgpu`: drive the state file and serve the fault API until SIGTERM or SIGINT."""
    import uvicorn

    from gpu_triage.exporter.backends.sim.scenario import ScenarioError, load_scenario
    from gpu_triage.exporter.settings import parse_listen_address

    try:
        host, port = parse_listen_address(listen)
        driver = VgpuDriver(SimBackend(load_scenario(scenario)), state)
    except (ScenarioError, ValueError, OSError, RuntimeError) as e:
        print(f"gpu-triage vgpu: cannot start: {e}", file=sys.stderr)
        return 2
    driver.start()
    log.info(
        "driving the virtual GPU",
        extra={"state": str(state), "gpus": len(driver.gpus), "scenario": scenario, "address": listen},
    )
    try:
        uvicorn.run(driver_app(driver), host=host or "0.0.0.0", port=port, log_config=None, access_log=False)
    finally:
        driver.stop()
    return 0
