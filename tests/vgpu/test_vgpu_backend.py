"""gpu-triage's own NVML backend, unchanged, on the virtual GPU: every collector, and XIDs from the event API."""

from __future__ import annotations

from collections.abc import Callable

from tests.vgpu.conftest import BACKEND_BASE_MODULE, NVML_BACKEND_MODULE, Worker, vs

OPEN_BACKEND = (
    "import importlib\n"
    f"nvml_backend = importlib.import_module({NVML_BACKEND_MODULE!r})\n"
    f"base = importlib.import_module({BACKEND_BASE_MODULE!r})\n"
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
        "    'failed': {c.value: list(backend.read(gpus[2], c).failed_fields) for c in base.Collector},\n"
        "    'power': backend.read(gpus[2], base.Collector.POWER).reading.usage_watts,\n"
        "    'links': [(k.link, k.active, k.replay_errors)\n"
        "              for k in backend.read(gpus[2], base.Collector.NVLINK).reading.links[2:5]],\n"
        "    'remap': backend.read(gpus[2], base.Collector.REMAPPING).reading.uncorrectable_rows,\n"
        "}"
    )
    assert [tuple(g) for g in got["gpus"]] == [(i, g.uuid, f"0000:{g.pci_bus:02x}:00.0") for i, g in enumerate(node)]
    assert got["failed"] == {collector: [] for collector in got["failed"]}
    assert len(got["failed"]) >= 12
    assert got["power"] == 70.0  # watts, from 70000 mW
    assert got["links"] == [[2, True, 0], [3, False, 0], [4, True, 7]]
    assert got["remap"] == 1


def test_an_xid_reaches_the_backends_event_wait(worker: Callable[..., Worker], state: vs.StateWriter) -> None:
    nvml = worker(state.path)
    assert nvml.run(OPEN_BACKEND + "result = backend.wait_xids(0.0)") == []  # registers for XIDs
    nvml.send({"code": "result = [(x.gpu, x.code) for x in H['backend'].wait_xids(20.0)]"})
    state.push_xid(4, 79)
    assert nvml.value(nvml.answer()) == [[4, 79]]
