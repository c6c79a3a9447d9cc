"""The DCGM backend against a fake of DCGM's bindings (tests/dcgm_bindings) answering from the simulator.

The backend loads the fake exactly as it loads the bindings DCGM installs, from a directory, and runs
unchanged. It passes the contract the NVML backend passes (every collector reads what the simulated GPU
has), and the DCGM-specific promises: blanks are absent, a lost host engine is reported and reconnected
to, health watches become incidents, MIG devices are read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpu_triage.exporter.backends.base import BackendError, GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.dcgm import Address, DcgmBackend, bindings
from gpu_triage.exporter.backends.dcgm.connection import initialise
from gpu_triage.exporter.backends.dcgm.health import HOLD_SECONDS
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.backends.readings import (
    ClockDomain,
    HealthIncident,
    HealthWatch,
    Memory,
    NvLink,
    Processes,
    Profiling,
    Recovery,
    Thermal,
)
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.metrics.gpu import gpu_families
from gpu_triage.exporter.polling.poller import Poller
from gpu_triage.exporter.polling.snapshot import GpuStatus
from tests.conftest import REPO, FakeClock, settings
from tests.dcgm_fake import FakeHostEngine, Incident, running
from tests.nvml_fake import FakeNvml
from tests.nvml_gpm_fake import FakeGpmMig

BINDINGS = REPO / "tests" / "dcgm_bindings"
MIB = 1024 * 1024


@pytest.fixture
def engine(sim: SimBackend, clock: FakeClock) -> Iterator[FakeHostEngine]:
    clock.advance(400)  # training
    with running(sim) as e:
        yield e


def companion(sim: SimBackend, monkeypatch: pytest.MonkeyPatch) -> NvmlBackend:
    """NVML beside DCGM, for processes: the NVML fakes on the same simulator."""
    base = FakeNvml(sim)
    base.install(monkeypatch)
    FakeGpmMig(base).install(monkeypatch)
    return NvmlBackend()


def open_dcgm(engine: FakeHostEngine, monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> DcgmBackend:
    backend = DcgmBackend(
        Address.parse(engine.address),
        bindings_dir=BINDINGS,
        interval=5.0,
        slow_interval=60.0,
        companion=companion(engine.sim, monkeypatch),
        clock=clock,
    )
    backend.discover()
    return backend


@pytest.fixture
def dcgm(engine: FakeHostEngine, monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[DcgmBackend]:
    backend = open_dcgm(engine, monkeypatch, clock)
    yield backend
    backend.close()


def in_dcgm_units(collector: Collector, truth: Any) -> dict[str, Any]:
    """The simulator's reading as DCGM can report it: its units' rounding, and the fields it lacks."""
    d = dataclasses.asdict(truth)
    if collector is Collector.CLOCKS:  # DCGM has no graphics-clock field
        for key in ("current_hz", "max_hz"):
            d[key] = {k: v for k, v in d[key].items() if k is not ClockDomain.GRAPHICS}
    if collector is Collector.MEMORY:  # MiB
        for part in (d, *d["instances"]):
            for key in ("used_bytes", "total_bytes", "reserved_bytes"):
                if key in part:
                    part[key] = round(part[key] / MIB) * MIB
    if collector is Collector.PCIE:  # DCGM's PCIe traffic is the profiling fields'; no byte or error counters
        d.update(tx_bytes_per_second=None, rx_bytes_per_second=None, tx_bytes=None, rx_bytes=None, errors={})
    # What the DCGM backend does not read (NVML beside it, or nothing, answers these).
    not_read = {
        Collector.INVENTORY: {"persistence_mode": None, "gsp_firmware": None},
        Collector.THERMAL: {
            "thresholds": {k: v for k, v in d.get("thresholds", {}).items() if k in ("shutdown", "slowdown")}
        },
        Collector.CLOCKS: {"event_seconds": {}},
        Collector.ECC: {"by_location": {}},
        Collector.RECOVERY: {"fabric": None},
    }
    d.update(not_read.get(collector, {}))
    if collector is Collector.NVLINK:
        for link in d["links"]:
            link.update(dict.fromkeys(("tx_bytes", "rx_bytes", "tx_bytes_per_second", "rx_bytes_per_second"), None))
    if collector is Collector.POWER:  # mJ
        d["energy_joules"] = round(d["energy_joules"] * 1000) / 1000
    if collector is Collector.PROCESSES:  # the name comes from /proc, which the simulated pids are not in
        for proc in d["processes"]:
            proc["name"] = None
    if collector is Collector.PROFILING:
        del d["source"], d["status"]
    if collector is Collector.HEALTH:  # the simulator has no health watches; DCGM's report nothing here
        d["incidents"] = ()
    return d


def assert_same(ours: Any, truth: Any, path: str = "") -> None:
    """Equal, floats to within rounding error (DCGM's units have been applied to `truth` already)."""
    if isinstance(truth, dict):
        assert set(ours) == set(truth), path
        for key in truth:
            assert_same(ours[key], truth[key], f"{path}.{key}")
    elif isinstance(truth, list | tuple):
        assert len(ours) == len(truth), path
        for i, (a, b) in enumerate(zip(ours, truth, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(truth, float):
        assert ours == pytest.approx(truth, rel=1e-9, abs=1e-9), path
    else:
        assert ours == truth, path


@pytest.mark.parametrize("collector", list(Collector))
def test_every_collector_reads_what_the_gpu_has(dcgm: DcgmBackend, sim: SimBackend, collector: Collector) -> None:
    for gpu in sim.discover():
        ours = dcgm.read(gpu, collector)
        assert ours.failed_fields == (), collector
        mine = dataclasses.asdict(ours.reading)
        if collector is Collector.PROCESSES:
            for proc in mine["processes"]:
                proc["name"] = None
        if collector is Collector.PROFILING:
            del mine["source"], mine["status"]
        assert_same(mine, in_dcgm_units(collector, sim.read(gpu, collector).reading), collector.value)


def test_one_nvlink_status_call_per_poll_answers_for_every_gpu(
    dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend
) -> None:
    def poll() -> dict[int, list[int]]:
        """Every GPU's NVLink read: the links each says are down, for those with any."""
        out = {}
        for gpu in sim.discover():
            reading = dcgm.read(gpu, Collector.NVLINK).reading
            assert isinstance(reading, NvLink) and len(reading.links) == 18
            if down := [link.link for link in reading.links if not link.up]:
                out[gpu.index] = down
        return out

    assert poll() == {}
    assert engine.calls["dcgmGetNvLinkLinkStatus"] == 1
    sim.inject(FaultSpec(gpu=2, kind="nvlink_down", link=5))
    assert poll() == {2: [5]}  # the next poll asks again
    assert engine.calls["dcgmGetNvLinkLinkStatus"] == 2


def test_gpus_are_found_by_nvml_index_and_uuid_not_dcgm_ids(dcgm: DcgmBackend, sim: SimBackend) -> None:
    assert dcgm.discover() == sim.discover()


def test_blank_values_are_absent_series_not_zeros(dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend) -> None:
    engine.blanks[150] = "blank"  # GPU temperature: DCGM_INT64_BLANK
    engine.blanks[155] = "not_supported"  # power: DCGM_FP64_NOT_SUPPORTED
    engine.blanks[53] = "blank"  # serial: "<<<NULL>>>"
    poller = Poller(dcgm, interval=5, slow_interval=60, timeout=5.0)
    poller.discover()
    snapshot = poller.poll(Collector)
    poller.stop()
    assert all(status.success for status in snapshot.collectors.values())
    names = {f.name: f for f in gpu_families(snapshot)}
    assert names["nvidia_gpu_temperature_celsius"].samples == []
    assert names["nvidia_gpu_power_watts"].samples == []
    assert len(names["nvidia_gpu_power_limit_watts"].samples) == 8
    assert {s.labels["serial"] for s in names["nvidia_gpu"].samples} == {""}
    thermal = dcgm.read(sim.discover()[0], Collector.THERMAL).reading
    assert isinstance(thermal, Thermal) and thermal.gpu_celsius is None and thermal.memory_celsius is not None
    assert thermal.fan_ratio is None  # SXM: the simulator's "not supported" is DCGM's blank


def test_a_field_that_fails_is_named(dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend) -> None:
    engine.field_errors[155] = -3  # DCGM_ST_GENERIC_ERROR
    result = dcgm.read(sim.discover()[0], Collector.POWER)
    assert result.failed_fields == ("dcgm_field_155",) and result.reading.usage_watts is None  # type: ignore[attr-defined]


def test_a_lost_gpu(dcgm: DcgmBackend, sim: SimBackend) -> None:
    sim.inject(FaultSpec(gpu=3, kind="gpu_lost"))
    with pytest.raises(GpuLostError):
        dcgm.read(sim.discover()[3], Collector.POWER)
    assert dcgm.read(sim.discover()[2], Collector.POWER).failed_fields == ()


def test_a_lost_host_engine_is_reported_and_reconnected_to(
    dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend, clock: FakeClock
) -> None:
    poller = Poller(dcgm, interval=5, slow_interval=60, timeout=5.0, clock=clock)
    poller.discover()
    assert poller.poll(Collector).backend_up
    engine.kill()
    down = poller.poll(Collector)
    assert not down.backend_up and not any(s.success for s in down.collectors.values())
    assert all(g.status == GpuStatus.UP for g in down.gpus), "the GPUs are not lost; the host engine is"
    assert dcgm.status.startswith(f"lost the DCGM host engine at {engine.address}")
    assert "not valid any longer" in dcgm.status and "reconnecting" in dcgm.status
    with pytest.raises(BackendError, match="reconnecting"):
        dcgm.read(sim.discover()[0], Collector.POWER)  # during the back-off: at once, no connect attempt
    engine.restart()  # a new host engine: the old groups and watches are gone, the gpuIds differ
    clock.advance(31)
    up = poller.poll(Collector)
    poller.stop()
    assert up.backend_up and all(s.success for s in up.collectors.values())
    assert dcgm.status == f"connected to the DCGM host engine at {engine.address}"
    assert engine.connects == 2 and dcgm.connection.connects == 2
    for gpu in sim.discover():  # each GPU's values are its own, whatever DCGM numbers it now
        ours = dcgm.read(gpu, Collector.MEMORY).reading
        assert dataclasses.asdict(ours) == in_dcgm_units(Collector.MEMORY, sim.read(gpu, Collector.MEMORY).reading)


def test_back_off_between_reconnects(
    dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend, clock: FakeClock
) -> None:
    gpu = sim.discover()[0]
    engine.kill()
    tries = engine.calls["dcgmConnect_v2"]
    for wait in (0, 1, 2, 4, 8, 16, 30, 30):
        clock.advance(wait)
        with pytest.raises(BackendError, match=r"no DCGM host engine answers|not valid"):
            dcgm.read(gpu, Collector.POWER)
        with pytest.raises(BackendError, match="next in"):
            dcgm.read(gpu, Collector.POWER)  # within the back-off: no new attempt
    assert "8 attempt(s) failed" in dcgm.status
    assert engine.calls["dcgmConnect_v2"] == tries, "a closed port is seen without asking DCGM to retry for seconds"


def test_health_watches_report_per_gpu_and_hold_events(
    dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend, clock: FakeClock
) -> None:
    gpus = sim.discover()
    assert all(dcgm.read(g, Collector.HEALTH).reading == HealthWatch(()) for g in gpus)
    sim.inject(FaultSpec(gpu=6, kind="ecc_uncorrectable"))
    sim.inject(FaultSpec(gpu=4, kind="nvlink_down", link=7))
    engine.injected.append(Incident(1, 0x1, 10, 3, "PCIe replay rate exceeded on GPU 1"))
    clock.advance(2)
    health = {g.index: dcgm.read(g, Collector.HEALTH).reading.incidents for g in gpus}  # type: ignore[attr-defined]
    assert health[6] == (HealthIncident("memory", True, f"Detected 1 volatile DBE(s) in GPU {engine.gpu_id(6)}.", 4),)
    assert [(i.system, i.failed, i.code) for i in health[4]] == [("nvlink", True, 14)]
    assert health[1] == (HealthIncident("pcie", False, "PCIe replay rate exceeded on GPU 1", 3),)
    assert health[0] == () and engine.calls["dcgmHealthCheck"] == 2, "one check for all GPUs"
    clock.advance(HOLD_SECONDS - 60)
    assert dcgm.read(gpus[1], Collector.HEALTH).reading.incidents[0].system == "pcie"  # type: ignore[attr-defined]
    clock.advance(120)  # DCGM reported the PCIe event once; the ECC error it reports on every check
    assert dcgm.read(gpus[1], Collector.HEALTH).reading == HealthWatch(())
    assert dcgm.read(gpus[6], Collector.HEALTH).reading.incidents[0].system == "memory"  # type: ignore[attr-defined]


def test_an_older_host_engine_without_the_recovery_field(
    engine: FakeHostEngine, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, sim: SimBackend
) -> None:
    engine.unknown_fields.add(1523)
    backend = open_dcgm(engine, monkeypatch, clock)
    assert backend.read(sim.discover()[0], Collector.RECOVERY) == type(
        backend.read(sim.discover()[0], Collector.RECOVERY)
    )(Recovery(None), ())
    assert backend.read(sim.discover()[0], Collector.POWER).failed_fields == ()
    backend.close()


def test_no_profiling_says_why_and_the_rest_works(
    engine: FakeHostEngine, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, sim: SimBackend
) -> None:
    engine.profiling_error = -37  # DCGM_ST_PROFILING_LIBRARY_ERROR: Nsight holds the profiler (pre-Hopper)
    backend = open_dcgm(engine, monkeypatch, clock)
    result = backend.read(sim.discover()[0], Collector.PROFILING)
    assert result.failed_fields == () and result.reading == Profiling(
        None,
        "DCGM cannot watch the profiling fields here: The third-party Profiling module returned an "
        "unrecoverable error (-37)",
    )
    assert backend.read(sim.discover()[0], Collector.THERMAL).reading.gpu_celsius is not None  # type: ignore[attr-defined]
    backend.close()


def test_mig_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-mig"), clock=clock)
    clock.advance(300)
    with running(sim) as engine:
        backend = open_dcgm(engine, monkeypatch, clock)
        for gpu in sim.discover()[:3]:
            memory = backend.read(gpu, Collector.MEMORY).reading
            assert isinstance(memory, Memory)
            assert_same(
                dataclasses.asdict(memory), in_dcgm_units(Collector.MEMORY, sim.read(gpu, Collector.MEMORY).reading)
            )
            truth = sim.read(gpu, Collector.PROFILING).reading
            ours = backend.read(gpu, Collector.PROFILING).reading
            assert isinstance(ours, Profiling) and isinstance(truth, Profiling)
            assert_same(
                [dataclasses.asdict(p) for p in ours.instances], [dataclasses.asdict(p) for p in truth.instances]
            )
            procs = backend.read(gpu, Collector.PROCESSES).reading
            assert isinstance(procs, Processes) and procs.instances == tuple(m.instance for m in memory.instances)
        assert [m.instance.profile for m in backend.read(sim.discover()[1], Collector.MEMORY).reading.instances] == [  # type: ignore[attr-defined]
            "3g.40gb",
            "4g.40gb",
        ]
        backend.close()


def test_without_nvml_beside_it_there_are_no_processes(
    engine: FakeHostEngine, clock: FakeClock, sim: SimBackend
) -> None:
    backend = DcgmBackend(Address.parse(engine.address), bindings_dir=BINDINGS, clock=clock)
    assert backend.read(sim.discover()[0], Collector.PROCESSES).reading == Processes(None)
    with pytest.raises(BackendError, match="kernel log only"):
        backend.wait_xids(0.01)
    backend.close()


def test_no_host_engine_at_start_is_a_start_up_error(engine: FakeHostEngine, clock: FakeClock) -> None:
    engine.kill()
    with pytest.raises(BackendError, match=f"no DCGM host engine answers at {engine.address} \\(Connection refused\\)"):
        DcgmBackend(Address.parse(engine.address), bindings_dir=BINDINGS, clock=clock)


def test_no_dcgm_library(engine: FakeHostEngine) -> None:
    engine.has_library = False
    b = bindings.load(BINDINGS)
    elsewhere = bindings.Bindings(REPO / "elsewhere", b.structs, b.agent)  # libdcgm loads once per process
    with pytest.raises(BackendError, match="cannot load DCGM's library \\(libdcgm\\): DCGM library could not be found"):
        initialise(elsewhere)


def test_missing_bindings_say_where_they_were_looked_for(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="DCGM's Python bindings are not installed"):
        DcgmBackend(Address(), bindings_dir=tmp_path)


def test_the_daemon_says_the_host_engine_is_gone_and_carries_on(
    dcgm: DcgmBackend, engine: FakeHostEngine, clock: FakeClock, tmp_path: Path
) -> None:
    daemon = Daemon(dcgm, settings(tmp_path, backend="dcgm"), clock=clock, boot_id="boot-1")
    daemon.poller.discover()
    daemon.poller.poll(Collector)
    with TestClient(create_app(daemon)) as client:
        assert client.get("/readyz").status_code == 200
        engine.kill()
        daemon.poller.poll(Collector)
        gpus = client.get("/api/v1/gpus").json()
        assert gpus["backend_reason"] == "--backend dcgm"
        assert gpus["backend_problem"].startswith(f"lost the DCGM host engine at {engine.address}")
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "lost the DCGM host engine" in ready.json()["error"]
        page = {
            (f.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(client.get("/metrics").text)
            for s in f.samples
        }
        assert page[("gpu_triage_backend_up", (("backend", "dcgm"),))] == 0
        assert all(v == 0 for (name, _), v in page.items() if name == "gpu_triage_collector_success")
        engine.restart()
        clock.advance(31)
        daemon.poller.poll(Collector)
        assert client.get("/readyz").status_code == 200
        assert client.get("/api/v1/gpus").json()["backend_problem"] is None
    daemon.stop()


def test_health_incidents_reach_the_verdict_with_their_playbook(
    dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend, clock: FakeClock, tmp_path: Path
) -> None:
    daemon = Daemon(dcgm, settings(tmp_path, backend="dcgm"), clock=clock, boot_id="boot-1")
    daemon.poller.discover()
    engine.injected.append(Incident(1, 0x40, 10, 27, "The InfoROM of GPU 1 is corrupt"))
    sim.inject(FaultSpec(gpu=6, kind="row_remap_pending"))
    daemon.poller.poll(Collector)
    with TestClient(create_app(daemon)) as client:
        findings = {(f["class"], f["gpu"]): f for f in client.get("/api/v1/diagnosis").json()["findings"]}
        inforom = findings[("dcgm_health_inforom", sim.discover()[1].pci_bus_id)]
        assert (inforom["severity"], inforom["action"], inforom["playbook"]) == (
            "warning",
            "UPDATE_SOFTWARE",
            "dcgm-health-inforom",
        )
        assert inforom["evidence"][0]["text"] == "DCGM inforom health: WARN: The InfoROM of GPU 1 is corrupt"
        memory = findings[("dcgm_health_memory", sim.discover()[6].pci_bus_id)]
        assert memory["severity"] == "warning" and "pending row remap" in memory["evidence"][0]["text"]
        page = client.get("/runbooks/dcgm-health-inforom")
        assert page.status_code == 200 and "The InfoROM of GPU 1 is corrupt" in page.text
    daemon.stop()


def test_mig_memory_does_not_depend_on_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-mig"), clock=clock)
    clock.advance(300)
    with running(sim, profiling_error=-36) as engine:  # DCGM_ST_PROFILING_NOT_SUPPORTED
        backend = open_dcgm(engine, monkeypatch, clock)
        memory = backend.read(sim.discover()[0], Collector.MEMORY).reading
        assert isinstance(memory, Memory) and [m.used_bytes is not None for m in memory.instances] == [True, True]
        assert backend.read(sim.discover()[0], Collector.PROFILING).reading.source is None  # type: ignore[attr-defined]
        backend.close()


def test_pcie_traffic_comes_from_the_profiling_fields_not_the_deprecated_ones(
    dcgm: DcgmBackend, engine: FakeHostEngine, sim: SimBackend
) -> None:
    """dcgm_fields.h: 200/201 "Deprecated: Use DCGM_FI_PROF_PCIE_TX_BYTES"; DCGM answers them "not supported"."""
    watched = set().union(*engine._watched.values())
    assert {200, 201}.isdisjoint(watched)
    assert {1009, 1010} <= watched
    gpu = sim.discover()[0]
    for collector in (Collector.PCIE, Collector.PROFILING):
        dcgm.read(gpu, collector)
    truth = sim.read(gpu, Collector.PROFILING).reading
    assert isinstance(truth, Profiling) and truth.gpu is not None
    poller = Poller(dcgm, interval=5, slow_interval=60, timeout=5.0)
    poller.discover()
    snapshot = poller.poll(Collector)
    shown = {
        s.labels["direction"]: s.value
        for family in gpu_families(snapshot)
        for s in family.samples
        if s.name == "nvidia_gpu_pcie_throughput_bytes_per_second" and s.labels["gpu"] == "0"
    }
    assert shown == {"tx": truth.gpu.pcie_tx_bytes_per_second, "rx": truth.gpu.pcie_rx_bytes_per_second}
    poller.stop()
