"""Choosing a backend by name: the backends are imported only once chosen.

`auto` takes DCGM when a host engine answers at `--dcgm.address` (by default nv-hostengine's TCP port
on localhost, then its unix socket) and its bindings are installed, else NVML; the backend's `why`
says which and why, and it is logged at start. Whichever serves the node, only one profiler runs: the
DCGM backend reads DCGM's profiling fields, and the NVML backend keeps GPM off when a DCGM host engine
already watches them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from gpu_triage.exporter.backends.base import BackendError, GpuBackend

if TYPE_CHECKING:
    from gpu_triage.exporter.backends.dcgm import Address, DcgmBackend
    from gpu_triage.exporter.backends.nvml.backend import NvmlBackend

log = logging.getLogger(__name__)

BackendName = Literal["auto", "nvml", "dcgm", "sim"]


class BackendSettings(Protocol):
    """What choosing a backend takes from the daemon's settings (exporter/settings.py, which imports this
    module for BackendName): a protocol, so the import goes one way."""

    @property
    def backend(self) -> BackendName: ...
    @property
    def sim_scenario(self) -> str: ...
    @property
    def dcgm_address(self) -> str | None: ...
    @property
    def dcgm_bindings_dir(self) -> Path | None: ...
    @property
    def collector_interval(self) -> float: ...
    @property
    def collector_slow_interval(self) -> float: ...
    @property
    def state_dir(self) -> Path: ...


def open_configured(settings: BackendSettings) -> GpuBackend:
    """The backend the settings ask for, ready to `discover()`."""
    return open_backend(
        settings.backend,
        scenario=settings.sim_scenario,
        dcgm_address=settings.dcgm_address,
        dcgm_bindings_dir=settings.dcgm_bindings_dir,
        interval=settings.collector_interval,
        slow_interval=settings.collector_slow_interval,
        state_dir=settings.state_dir,
    )


def open_backend(
    name: BackendName,
    *,
    scenario: str = "h100-training",
    dcgm_address: str | None = None,
    dcgm_bindings_dir: Path | None = None,
    interval: float = 5.0,
    slow_interval: float = 60.0,
    state_dir: Path | None = None,
) -> GpuBackend:
    """The backend called `name`, ready to `discover()`. Raises BackendError with a message for the user.

    Without `dcgm_address`, the host engine is looked for where nv-hostengine listens by default: its TCP
    port on localhost, then its unix socket. `state_dir` is where the NVML backend looks for a request to
    let go of NVML for a GPU reset (`gpu-triage release`).
    """
    if name == "sim":
        from gpu_triage.exporter.backends.sim import ScenarioError, SimBackend, load_scenario

        try:
            return SimBackend(load_scenario(scenario))
        except ScenarioError as e:
            raise BackendError(str(e)) from e
    from gpu_triage.exporter.backends.dcgm.address import DEFAULTS, Address, answering

    try:
        candidates = DEFAULTS if dcgm_address is None else (Address.parse(dcgm_address),)
    except ValueError as e:
        raise BackendError(f"--dcgm.address: {e}") from e
    address, nobody = answering(candidates)
    if name == "dcgm":
        if address is None:
            raise BackendError(nobody)
        return _dcgm(address, dcgm_bindings_dir, interval, slow_interval)
    if name == "nvml":
        return _nvml(address, dcgm_bindings_dir, state_dir)
    why_not = nobody if address is None else _no_bindings(address, dcgm_bindings_dir)
    if address is not None and why_not is None:
        try:
            backend: GpuBackend = _dcgm(address, dcgm_bindings_dir, interval, slow_interval)
            backend.why = f"auto: a DCGM host engine answers at {address}"
        except BackendError as e:
            why_not = f"the DCGM host engine at {address} answers, but: {e}"
    if why_not is not None:
        try:
            backend = _nvml(address, dcgm_bindings_dir, state_dir)
        except BackendError as e:
            raise BackendError(f"no GPU backend could start: {why_not}; {e}") from e
        backend.why = f"auto: {why_not}; NVML instead"
    log.info("backend chosen", extra={"backend": backend.name, "why": backend.why})
    return backend


def _no_bindings(address: Address, bindings_dir: Path | None) -> str | None:
    from gpu_triage.exporter.backends.dcgm import bindings

    if bindings.find(bindings_dir) is None:
        return f"a DCGM host engine answers at {address}, but DCGM's Python bindings are not installed"
    return None


def _dcgm(address: Address, bindings_dir: Path | None, interval: float, slow_interval: float) -> DcgmBackend:
    from gpu_triage.exporter.backends.dcgm import DcgmBackend

    companion = None
    try:
        companion = _nvml_alone()
        companion.gpm.turn_off("the DCGM backend reads profiling from DCGM")
    except BackendError as e:
        log.warning("no NVML beside DCGM: no processes, no NVML XID events", extra={"error": str(e)})
    try:
        return DcgmBackend(
            address, bindings_dir=bindings_dir, interval=interval, slow_interval=slow_interval, companion=companion
        )
    except BackendError:
        if companion is not None:
            companion.close()
        raise


def _nvml_alone(release_dir: Path | None = None) -> NvmlBackend:
    from gpu_triage.exporter.backends.nvml.backend import NvmlBackend

    return NvmlBackend(release_dir=release_dir)


def _nvml(address: Address | None, bindings_dir: Path | None, release_dir: Path | None = None) -> NvmlBackend:
    """NVML, with GPM off when a DCGM host engine already profiles: never two profilers at once."""
    backend = _nvml_alone(release_dir)
    if address is None:
        return backend  # no host engine to ask: DCGM's bindings and field tables stay unloaded
    from gpu_triage.exporter.backends.dcgm.probe import profiling_watched

    if (watcher := profiling_watched(address, bindings_dir)) is not None:
        backend.gpm.turn_off(f"GPM stays off: {watcher}; --backend dcgm reads its profiling fields")
        log.info("GPM off: DCGM profiles this node", extra={"dcgm": watcher})
    return backend
