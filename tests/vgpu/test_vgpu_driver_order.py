"""The virtual GPU's driver publishes what the simulator raises in the order a real driver reports it."""

from __future__ import annotations

import struct
from pathlib import Path

from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.backends.sim.faults import FaultKind, FaultSpec
from gpu_triage.exporter.vgpu.driver import VgpuDriver

EVENT_TOTAL_OFFSET = 48  # the header's u64 event_total: events ever published (vgpu/README.md)


def test_an_xid_79_is_in_the_file_by_the_time_the_gpu_reads_as_lost(state_file: Path) -> None:
    """A driver raises Xid 79 ("fallen off the bus") and then the GPU stops answering, so an NVML event waiter
    that finds the GPU lost has the XID queued before it. Here the driver's XID thread is not running: the tick
    that publishes the lost GPU must publish the XID with it, not after."""
    sim = SimBackend(load_scenario("h100-training"))
    driver = VgpuDriver(sim, state_file)
    try:
        sim.inject(FaultSpec(gpu=2, kind=FaultKind.XID, xid=79))
        driver.tick()
        assert driver.records[2].lost
        assert struct.unpack_from("<Q", state_file.read_bytes(), EVENT_TOTAL_OFFSET)[0] == 1
        driver.tick()  # taken once: the next tick publishes no second copy
        assert struct.unpack_from("<Q", state_file.read_bytes(), EVENT_TOTAL_OFFSET)[0] == 1
    finally:
        driver.stop()
