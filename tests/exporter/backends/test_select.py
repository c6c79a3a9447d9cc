"""Which backend serves the node, and why: `auto` takes DCGM when a host engine answers, else NVML."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.exporter.backends.base import BackendError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.dcgm import Address, DcgmBackend, address
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.backends.readings import Profiling
from gpu_triage.exporter.backends.select import open_backend
from gpu_triage.exporter.backends.sim import SimBackend
from tests.conftest import REPO, FakeClock
from tests.daemon_proc import free_port
from tests.dcgm_fake import FakeHostEngine, running
from tests.nvml_fake import FakeNvml
from tests.nvml_gpm_fake import FakeGpmMig

BINDINGS = REPO / "tests" / "dcgm_bindings"


@pytest.fixture
def engine(sim: SimBackend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHostEngine]:
    clock.advance(400)
    base = FakeNvml(sim)
    base.install(monkeypatch)
    FakeGpmMig(base).install(monkeypatch)
    with running(sim) as e:
        yield e


def test_auto_takes_dcgm_when_a_host_engine_answers(engine: FakeHostEngine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu_triage.exporter.backends.select")
    backend = open_backend("auto", dcgm_address=engine.address, dcgm_bindings_dir=BINDINGS)
    try:
        assert isinstance(backend, DcgmBackend)
        assert backend.why == f"auto: a DCGM host engine answers at {engine.address}"
        (chosen,) = [r for r in caplog.records if r.message == "backend chosen"]
        assert (chosen.backend, chosen.why) == ("dcgm", backend.why)  # type: ignore[attr-defined]
        assert backend.companion is not None and backend.companion.gpm.off, "one profiler: DCGM's"
    finally:
        backend.close()


def test_auto_takes_nvml_when_none_answers(engine: FakeHostEngine) -> None:
    address = engine.address
    engine.kill()
    backend = open_backend("auto", dcgm_address=address, dcgm_bindings_dir=BINDINGS)
    try:
        assert isinstance(backend, NvmlBackend)
        assert backend.why == f"auto: no DCGM host engine answers at {address} (Connection refused); NVML instead"
        assert backend.gpm.off is None
    finally:
        backend.close()


def test_auto_takes_nvml_without_dcgm_bindings(engine: FakeHostEngine, tmp_path: Path) -> None:
    backend = open_backend("auto", dcgm_address=engine.address, dcgm_bindings_dir=tmp_path)
    try:
        assert isinstance(backend, NvmlBackend)
        assert "DCGM's Python bindings are not installed; NVML instead" in backend.why
    finally:
        backend.close()


def test_nvml_keeps_gpm_off_while_dcgm_profiles(engine: FakeHostEngine, sim: SimBackend) -> None:
    engine.watched_by_another_client([1001, 1002, 1004, 1005])  # dcgm-exporter's profiling watches
    backend = open_backend("nvml", dcgm_address=engine.address, dcgm_bindings_dir=BINDINGS)
    try:
        assert isinstance(backend, NvmlBackend) and backend.why == "--backend nvml"
        backend.discover()
        profiling = backend.read(sim.discover()[0], Collector.PROFILING).reading
        assert isinstance(profiling, Profiling) and profiling.source is None and profiling.gpu is None
        assert profiling.status.startswith(f"GPM stays off: the DCGM host engine at {engine.address} watches")
    finally:
        backend.close()


def test_nvml_profiles_when_the_host_engine_does_not(engine: FakeHostEngine, sim: SimBackend) -> None:
    backend = open_backend("nvml", dcgm_address=engine.address, dcgm_bindings_dir=BINDINGS)
    try:
        backend.discover()
        assert backend.read(sim.discover()[0], Collector.PROFILING).reading.source == "gpm"  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_dcgm_without_a_host_engine_is_a_start_up_error(engine: FakeHostEngine) -> None:
    address = engine.address
    engine.kill()
    with pytest.raises(BackendError, match=f"no DCGM host engine answers at {address}"):
        open_backend("dcgm", dcgm_address=address, dcgm_bindings_dir=BINDINGS)


def test_a_bad_address_is_named() -> None:
    with pytest.raises(BackendError, match=r"--dcgm\.address: 'host:port:x' is not a host engine address"):
        open_backend("auto", dcgm_address="host:port:x")


def test_auto_looks_for_the_host_engine_at_its_port_then_its_socket(
    sim: SimBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = FakeNvml(sim)
    base.install(monkeypatch)
    FakeGpmMig(base).install(monkeypatch)
    with tempfile.TemporaryDirectory(prefix="dcgm-", dir="/tmp") as short:  # a unix socket path is short
        socket_path = f"{short}/nv-hostengine"
        closed_port = Address(port=free_port())
        monkeypatch.setattr(address, "DEFAULTS", (closed_port, Address(socket_path=Path(socket_path))))
        with running(sim, unix_path=socket_path) as engine:
            backend = open_backend("auto", dcgm_bindings_dir=BINDINGS)
            try:
                assert isinstance(backend, DcgmBackend)
                assert backend.why == f"auto: a DCGM host engine answers at {engine.address}"
            finally:
                backend.close()
        backend = open_backend("auto", dcgm_bindings_dir=BINDINGS)
        try:
            assert isinstance(backend, NvmlBackend)
            assert backend.why.startswith(
                f"auto: no DCGM host engine answers at {closed_port} (Connection refused) or unix://{socket_path} ("
            )
        finally:
            backend.close()
