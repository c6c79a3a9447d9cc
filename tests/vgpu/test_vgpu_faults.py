"""Faults the simulator injects (lost, hung, reset in flight) and the state file's consistency under a live writer."""

from __future__ import annotations

import queue
import struct
import threading
from collections.abc import Callable

import pytest

from tests.vgpu.conftest import H, Worker, vs

GPU_IS_LOST, INVALID_ARGUMENT, UNKNOWN = 15, 2, 999
READ_DEADLINE = 0.5  # seconds the library retries an inconsistent record before NVML_ERROR_UNKNOWN (state.c)


def test_a_lost_gpu_fails_every_device_call_and_no_other_gpu(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[3].lost = True
    state.write(node)
    for call, args in [
        ("nvmlDeviceGetPowerUsage", ()),
        ("nvmlDeviceGetName", ()),
        ("nvmlDeviceGetUUID", ()),
        ("nvmlDeviceGetMemoryInfo", ()),
        ("nvmlDeviceGetFieldValues", ([83],)),
        ("nvmlDeviceGetMigMode", ()),
        ("nvmlDeviceGetTemperature", (0,)),
    ]:
        assert nvml.error(call, H(3), *args) == GPU_IS_LOST, call
        nvml.call(call, H(2), *args)
    assert nvml.error("nvmlDeviceGetHandleByIndex", 3) == GPU_IS_LOST
    assert nvml.call("nvmlDeviceGetCount") == 8  # the driver still enumerates it


def test_a_reset_in_flight_invalidates_the_handle_until_it_is_over(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[4].invalid_handle = True
    state.write(node)
    assert nvml.error("nvmlDeviceGetPowerUsage", H(4)) == INVALID_ARGUMENT
    assert nvml.call("nvmlDeviceGetPowerUsage", H(5)) == 71_500
    again = nvml.call("nvmlDeviceGetHandleByIndex", 4, save="again")  # handing out a handle still works
    node[4].invalid_handle = False
    node[4].power_mw = 250_000
    state.write(node)
    assert nvml.call("nvmlDeviceGetPowerUsage", H(4)) == 250_000  # the old handle works again
    assert again == nvml.call("nvmlDeviceGetHandleByIndex", 4)


def test_a_hung_call_blocks_until_the_gpu_recovers(
    worker: Callable[..., Worker], writer: Callable[..., vs.StateWriter]
) -> None:
    node = vs.h100_node()
    state = writer(node, hang_max_ms=60_000)
    nvml = worker(state.path)
    nvml.init()
    node[2].hung = True
    state.write(node)
    nvml.send({"call": "nvmlDeviceGetPowerUsage", "args": [H(2)]})
    with pytest.raises(queue.Empty):
        nvml.answer(timeout=0.3)  # still inside the driver
    node[2].hung = False
    node[2].power_mw = 333_000
    state.write(node)
    reply = nvml.answer(timeout=10)
    assert nvml.value(reply) == 333_000  # the value of the recovered GPU
    assert reply["elapsed"] >= 0.2  # blocked in the call itself, not on the way to it


def test_a_hung_call_gives_up_after_the_bound(
    worker: Callable[..., Worker], writer: Callable[..., vs.StateWriter]
) -> None:
    node = vs.h100_node()
    state = writer(node, hang_max_ms=200)
    nvml = worker(state.path)
    nvml.init()
    node[6].hung = True
    state.write(node)
    nvml.send({"call": "nvmlDeviceGetPowerUsage", "args": [H(6)]})
    reply = nvml.answer(timeout=10)
    assert reply.get("nvml") == UNKNOWN
    assert 0.2 <= reply["elapsed"] < 5
    assert nvml.call("nvmlDeviceGetPowerUsage", H(7)) == 72_500


def test_a_record_whose_checksum_does_not_match_is_never_served(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    state.write(node)
    power_offset = vs.HEADER_SIZE + 988  # GPU 0's power_mw (vgpu/README.md, "GPU record")
    with state.path.open("r+b") as f:  # a torn write, as a weakly ordered CPU could show one
        f.seek(power_offset)
        f.write(struct.pack("<I", 123))
    nvml.send({"call": "nvmlDeviceGetPowerUsage", "args": [H(0)]})
    reply = nvml.answer()
    assert reply.get("nvml") == UNKNOWN
    assert reply["elapsed"] >= READ_DEADLINE
    assert nvml.call("nvmlDeviceGetPowerUsage", H(1)) == 69_500
    state.write(node)
    assert nvml.call("nvmlDeviceGetPowerUsage", H(0)) == 69_000


def test_a_writer_that_died_mid_write_is_recovered_by_the_next(
    worker: Callable[..., Worker], writer: Callable[..., vs.StateWriter]
) -> None:
    first = writer()
    nvml = worker(first.path)
    nvml.init()
    first.close()
    with first.path.open("r+b") as f:  # seq left odd: "inside a write" forever
        f.seek(32)
        seq = struct.unpack("<Q", f.read(8))[0]
        f.seek(32)
        f.write(struct.pack("<Q", seq | 1))
    assert nvml.error("nvmlDeviceGetPowerUsage", H(0)) == UNKNOWN
    node = vs.h100_node()
    node[0].power_mw = 99_000
    writer(node)
    assert nvml.call("nvmlDeviceGetPowerUsage", H(0)) == 99_000


def test_readers_never_see_a_torn_record_while_the_writer_updates(nvml: Worker, state: vs.StateWriter) -> None:
    """Every value read is a function of one k; a reader that mixed two writes would see two ks.

    The writer publishes records encoded beforehand, so that it spends its time inside the
    write: a reader that ignores the seqlock (and the checksums) sees hundreds of torn reads
    in these 10000.
    """
    g = vs.h100(0)
    records = []
    for k in range(1, 513):
        g.energy_mj = 10**9 + k
        g.ecc = {(vs.ECC_CORRECTED, vs.ECC_VOLATILE, vs.LOCATION_DEVICE_MEMORY): k}
        g.power_mw = 100_000 + k
        g.nvlinks[17].crc_flit_errors = k
        g.remapped_correctable = k
        g.memory_reserved = 4096 * k
        g.memory_used = 8192 * k
        records.append(vs.encode_gpu(g))
    state.write([records[0]])
    stop = threading.Event()

    def keep_writing() -> None:
        i = 1
        while not stop.is_set():
            state.write([records[i % len(records)]])
            i += 1

    thread = threading.Thread(target=keep_writing)
    thread.start()
    try:
        got = nvml.run(
            "import time\n"
            "h = H['0']\n"
            "ids = [83, 3, 185, (163, 17), 142]\n"
            "seen, torn, reads = set(), [], 0\n"
            "deadline = time.monotonic() + 60\n"
            # Read on until the writes were seen to move under the reads, however slowly a loaded machine lets
            # the writer run: overlap is what the test needs, not a count of reads that happened to have it.
            "while (reads < 10000 or len(seen) < 50) and time.monotonic() < deadline:\n"
            "    f = n.nvmlDeviceGetFieldValues(h, ids)\n"
            "    k = f[1].value.ullVal\n"
            "    ks = {f[0].value.ullVal - 10**9, k, f[2].value.uiVal - 100000, f[3].value.ullVal, f[4].value.uiVal}\n"
            "    m = n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)\n"
            "    if len(ks) != 1 or m.used != 2 * m.reserved or m.free != m.total - m.reserved - m.used:\n"
            "        torn.append(sorted(ks))\n"
            "    seen.add(k)\n"
            "    reads += 1\n"
            "result = {'reads': reads, 'distinct': len(seen), 'torn': torn[:5], 'n_torn': len(torn)}"
        )
    finally:
        stop.set()
        thread.join()
    assert got["torn"] == []
    assert got["reads"] >= 10000
    assert got["distinct"] >= 50  # the reads really did overlap the writes
