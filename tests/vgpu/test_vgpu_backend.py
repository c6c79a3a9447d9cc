"""gpu-triage's own NVML backend, unchanged, on the virtual GPU: every collector, and XIDs from the event API."""

from __future__ import annotations

from collections.abc import Callable

from tests.vgpu.conftest import COLLECTORS_MODULE, NVML_BACKEND_MODULE, Worker, vs

OPEN_BACKEND = (
    "import importlib\n"
    f"nvml_backend = importlib.import_module({NVML_BACKEND_MODULE!r})\n"
    f"collectors = importlib.import_module({COLLECTORS_MODULE!r})\n"
    "backend = H['backend'] = nvml_backend.NvmlBackend()\n"
    "gpus = H['gpus'] = backend.discover()\n"
)


def test_every_collector_reads_without_a_failed_field(worker: Callable[..., Worker], state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[2].nvlinks[3].state = vs.NVLINK_INACTIVE
    node[2].nvlinks[4].replay_errors = 7
    node[2].remapped_uncorrectable = 1
    state.write(node)
    nvml = worker(state.path)
    got = nvml.run(
        OPEN_BACKEND + "result = {\n"
        "    'gpus': [(g.index, g.uuid, g.pci_bus_id) for g in gpus],\n"
        "    'failed': {c.value: list(backend.read(gpus[2], c).failed_fields) for c in collectors.Collector},\n"
        "    'power': backend.read(gpus[2], collectors.Collector.POWER).reading.usage_watts,\n"
        "    'links': [(k.link, k.state, k.replay_errors)\n"
        "              for k in backend.read(gpus[2], collectors.Collector.NVLINK).reading.links[2:5]],\n"
        "    'remap': backend.read(gpus[2], collectors.Collector.REMAPPING).reading.uncorrectable_rows,\n"
        "}"
    )
    assert [tuple(g) for g in got["gpus"]] == [(i, g.uuid, f"0000:{g.pci_bus:02x}:00.0") for i, g in enumerate(node)]
    assert got["failed"] == {collector: [] for collector in got["failed"]}
    assert len(got["failed"]) >= 12
    assert got["power"] == 70.0  # watts, from 70000 mW
    assert got["links"] == [[2, 1, 0], [3, 0, 0], [4, 1, 7]]
    assert got["remap"] == 1


def test_an_xid_reaches_the_backends_event_wait(worker: Callable[..., Worker], state: vs.StateWriter) -> None:
    nvml = worker(state.path)
    assert nvml.run(OPEN_BACKEND + "result = backend.wait_xids(0.0)") == []  # registers for XIDs
    nvml.send({"code": "result = [(x.gpu, x.code) for x in H['backend'].wait_xids(20.0)]"})
    state.push_xid(4, 79)
    assert nvml.value(nvml.answer()) == [[4, 79]]


def test_an_xid_in_a_mig_instance_keeps_its_instance(worker: Callable[..., Worker], state: vs.StateWriter) -> None:
    """nvml.h: gpuInstanceId and computeInstanceId name the MIG instance an XID is attributable to, and are
    0xFFFFFFFF for one of the whole device."""
    nvml = worker(state.path)
    assert nvml.run(OPEN_BACKEND + "result = backend.wait_xids(0.0)") == []
    state.push_xid(2, 13, gpu_instance_id=5, compute_instance_id=1)
    state.push_xid(3, 48)
    got = nvml.run(
        "result = [(x.gpu, x.code, x.gpu_instance, x.compute_instance) for x in H['backend'].wait_xids(5.0)]"
    )
    assert got == [[2, 13, 5, 1], [3, 48, None, None]]


def test_link_states_pcie_units_and_pstate_as_the_header_gives_them(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    for link, link_state in enumerate([vs.NVLINK_INACTIVE, vs.NVLINK_SLEEP, vs.NVLINK_ACTIVE_TRAFFIC_DISABLED]):
        node[1].nvlinks[link].state = link_state
    node[1].pcie_tx_kbs, node[1].pcie_rx_kbs = 512, 3
    node[1].pstate = 32  # NVML_PSTATE_UNKNOWN
    state.write(node)
    nvml.run("ops.start()")
    links = nvml.run("result = ops.read(1, 'nvlink')")["reading"]["links"]
    assert [k["state"] for k in links] == [0, 2, 3] + [1] * 15  # 18 links present, whatever their state
    pcie = nvml.run("result = ops.read(1, 'pcie')")["reading"]
    assert (pcie["tx_bytes_per_second"], pcie["rx_bytes_per_second"]) == (512_000, 3_000)  # KB/s: 1000 bytes
    assert nvml.run("result = ops.read(1, 'clocks')")["reading"]["performance_state"] is None


def test_a_field_or_link_the_gpu_lacks_is_absent_and_a_failed_link_fails_alone(
    nvml: Worker, state: vs.StateWriter
) -> None:
    node = vs.h100_node()
    node[0].field_overrides = [
        vs.FieldOverride(field_id=163, scope_id=5, nvml_return=999),  # DL CRC errors of link 5: UNKNOWN
        vs.FieldOverride(field_id=82, nvml_return=2),  # memory temperature: INVALID_ARGUMENT, as a field's own code
    ]
    state.write(node)
    nvml.run("ops.start()")
    nvlink = nvml.run("result = ops.read(0, 'nvlink')")
    assert nvlink["failed"] == ["nvlink_5_163"]
    assert [k["crc_errors"] for k in nvlink["reading"]["links"][4:7]] == [0, None, 0]
    thermal = nvml.run("result = ops.read(0, 'thermal')")
    assert thermal["failed"] == [] and thermal["reading"]["memory_celsius"] is None


def test_strings_that_are_not_utf8_do_not_stop_discovery(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[6].serial = b"1654922\xff\xfe0106"
    node[6].name = b"NVIDIA H100 \xc3"
    node[7].uuid = b"GPU-35d30d74-e7ed-4867-96f5-\xff7ab298a59f8"
    state.write(node)
    gpus = nvml.run("result = ops.start()")
    assert len(gpus) == 8 and gpus[7][1] == "GPU-35d30d74-e7ed-4867-96f5-\ufffd7ab298a59f8"
    inventory = nvml.run("result = ops.read(6, 'inventory')")
    assert inventory["failed"] == []
    assert (inventory["reading"]["name"], inventory["reading"]["serial"]) == (
        "NVIDIA H100 \ufffd",
        "1654922\ufffd\ufffd0106",
    )


def test_pcie_throughput_comes_from_the_byte_counters_once_there_are_two_reads(
    nvml: Worker, state: vs.StateWriter
) -> None:
    """nvml.h's NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES are exact bytes; the 20 ms "KB/s" getter only stands in
    until there are two reads, or where the driver lacks the counters."""
    node = vs.h100_node()
    node[0].pcie_tx_kbs, node[0].pcie_rx_kbs = 7, 9  # the getter: what the first read must fall back to
    node[0].pcie_tx_bytes, node[0].pcie_rx_bytes = 10**12, 2 * 10**12
    state.write(node)
    nvml.run("ops.start()")
    first = nvml.run("result = ops.read(0, 'pcie')")["reading"]
    assert (first["tx_bytes_per_second"], first["rx_bytes_per_second"]) == (7_000, 9_000)
    assert (first["tx_bytes"], first["rx_bytes"]) == (10**12, 2 * 10**12)
    node[0].pcie_tx_bytes += 5 * 10**9 * 10  # 10 s at 5 GB/s
    node[0].pcie_rx_bytes += 2 * 10**9 * 10
    state.write(node)
    nvml.run("ops.advance(10)")
    second = nvml.run("result = ops.read(0, 'pcie')")["reading"]
    assert (second["tx_bytes_per_second"], second["rx_bytes_per_second"]) == (5e9, 2e9)
    node[0].unsupported_fields |= {197, 198}  # an older driver: the getter it is, every time
    state.write(node)
    nvml.run("ops.advance(10)")
    older = nvml.run("result = ops.read(0, 'pcie')")["reading"]
    assert (older["tx_bytes_per_second"], older["tx_bytes"]) == (7_000, None)
