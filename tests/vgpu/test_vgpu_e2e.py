"""End to end: `gpu-triage serve --backend nvml` on the virtual GPU that `gpu-triage vgpu` drives.

The daemon runs unchanged, on the real pynvml and the C library, with the simulator behind the
library instead of a GPU: what it serves must match `--backend sim` on the same scenario, and the
faults injected into the driver must reach /metrics the way a real GPU's would.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, require_tool
from tests.daemon_proc import GPU_TRIAGE, Daemon, Server, free_port, running, serve, wait_for

POLL = ("--collector.interval", "1s", "--collector.slow-interval", "2s")
# Labels whose values differ by design between the two backends: which source or backend it is.
BY_DESIGN = {"source", "backend"}


@contextlib.contextmanager
def vgpu_driver(home: Path, scenario: str = "h100-training") -> Iterator[Server]:
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [GPU_TRIAGE, "vgpu", "--scenario", scenario, "--state", str(home / "vgpu.state")]
    with running(
        [*cmd, f"--web.listen-address=127.0.0.1:{port}"],
        url=url,
        ready=f"{url}/api/v1/sim/faults",
        log=home / "vgpu.log",
    ) as server:
        yield server


@contextlib.contextmanager
def nvml_daemon(home: Path, lib: Path, state: Path) -> Iterator[Daemon]:
    env = {"LD_LIBRARY_PATH": str(lib), "GPU_TRIAGE_VGPU_STATE": str(state)}
    with serve(home, "--backend", "nvml", *POLL, env=env) as daemon:
        yield daemon


@pytest.fixture
def node(tmp_path: Path, vgpu_lib: Path) -> Iterator[tuple[Server, Daemon]]:
    """The driver on h100-training, and the NVML daemon reading its virtual GPUs."""
    with (
        vgpu_driver(tmp_path / "vgpu") as driver,
        nvml_daemon(tmp_path / "nvml", vgpu_lib, tmp_path / "vgpu" / "vgpu.state") as daemon,
    ):
        yield driver, daemon


def shape(page: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Each family's label sets, with the values of labels that differ by design left out."""
    out: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            labels = tuple(sorted((k, "" if k in BY_DESIGN else v) for k, v in sample.labels.items()))
            out.setdefault(sample.name, set()).add(labels)
    return out


def gauge(page: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def page(server: Server) -> str:
    return httpx.get(f"{server.url}/metrics", timeout=10).text


def inject(driver: Server, **fault: object) -> None:
    reply = httpx.post(f"{driver.url}/api/v1/sim/faults", json=fault, timeout=10)
    assert reply.status_code == 201, reply.text


def test_the_same_families_and_labels_as_the_simulator_and_promtool_clean(
    tmp_path: Path, node: tuple[Server, Daemon]
) -> None:
    promtool = require_tool("promtool")
    _, nvml = node
    with serve(tmp_path / "sim", "--sim.scenario", "h100-training", *POLL) as sim:
        # Both read the scenario's idle start: the same GPUs, links, clocks and (no) processes.
        ours, theirs = shape(page(nvml)), shape(page(sim))
    assert sorted(ours) == sorted(theirs)
    assert {name: labels for name, labels in ours.items() if name.startswith(("nvidia_", "gpu_triage_"))} == {
        name: labels for name, labels in theirs.items() if name.startswith(("nvidia_", "gpu_triage_"))
    }
    assert gauge(page(nvml), "gpu_triage_collector_success", collector="nvlink") == 1.0
    check = subprocess.run(
        [promtool, "check", "metrics"], input=page(nvml), capture_output=True, text=True, check=False
    )
    assert check.returncode == 0 and check.stdout == "", check.stdout + check.stderr


def test_a_lost_gpu_is_down_and_only_that_one(node: tuple[Server, Daemon]) -> None:
    driver, nvml = node
    inject(driver, gpu=3, kind="gpu_lost")
    ups = wait_for(
        lambda: (ups := {g: gauge(page(nvml), "nvidia_gpu_up", gpu=str(g)) for g in range(8)})[3] == 0.0 and ups,
        what="GPU 3 to read as down",
    )
    assert ups == {g: 0.0 if g == 3 else 1.0 for g in range(8)}


def test_an_nvml_xid_and_the_kernel_line_for_it_count_once(node: tuple[Server, Daemon]) -> None:
    driver, nvml = node
    inject(driver, gpu=2, kind="xid", xid=79)
    wait_for(lambda: gauge(page(nvml), "nvidia_gpu_xid_errors_total", gpu="2", xid="79"), what="the NVML XID")
    with nvml.kmsg.open("a") as kmsg:  # GPU 2 of the HGX layout sits at bus 0x3a
        kmsg.write("NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
    wait_for(lambda: gauge(page(nvml), "gpu_triage_xid_merged_reports_total") == 1.0, what="the two reports to merge")
    assert gauge(page(nvml), "nvidia_gpu_xid_errors_total", gpu="2", xid="79") == 1.0
    events = httpx.get(f"{nvml.url}/api/v1/events", timeout=10).json()["events"]
    assert [e["sources"] for e in events if e.get("xid") == 79] == [["kmsg", "nvml"]]


@pytest.mark.parametrize(
    ("kind", "looked_up"),
    [
        ("gpu_reset", False),  # GPU_IS_LOST while it lasts (nvml.h's word for an inaccessible GPU); same handle after
        ("stale_handle", True),  # INVALID_ARGUMENT: the handle no longer names the GPU, which is looked up again
    ],
)
def test_a_reset_and_a_stale_handle_are_noticed_and_recovered_from(
    node: tuple[Server, Daemon], kind: str, looked_up: bool
) -> None:
    driver, nvml = node
    inject(driver, gpu=5, kind=kind, duration_seconds=3)
    wait_for(lambda: gauge(page(nvml), "nvidia_gpu_up", gpu="5") == 0.0, what="GPU 5 to read as down")
    wait_for(lambda: gauge(page(nvml), "nvidia_gpu_up", gpu="5") == 1.0, timeout=30, what="GPU 5 to come back")
    assert ("GPU handle looked up again" in nvml.output()) is looked_up
    # The poll that finds the GPU again says it is up; its readings follow at the next fast poll.
    wait_for(lambda: gauge(page(nvml), "nvidia_gpu_power_watts", gpu="5") is not None, what="GPU 5's readings")


def _names(page_text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(page_text) for s in family.samples}


def _samples(page_text: str, name: str) -> list[dict[str, str]]:
    return [s.labels for f in text_string_to_metric_families(page_text) for s in f.samples if s.name == name]


@pytest.mark.parametrize("scenario", ["b200-training", "a100-training", "l40s-inference"])
def test_each_product_exports_what_it_has_and_nothing_it_lacks(tmp_path: Path, vgpu_lib: Path, scenario: str) -> None:
    promtool = require_tool("promtool")
    with (
        vgpu_driver(tmp_path / "vgpu", scenario),
        nvml_daemon(tmp_path / "nvml", vgpu_lib, tmp_path / "vgpu" / "vgpu.state") as daemon,
    ):
        # Two polls of the NVLink collector: a rate needs two reads of the counters.
        wait_for(lambda: gauge(page(daemon), "gpu_triage_collector_success", collector="nvlink") == 1.0, what="a poll")
        wait_for(
            lambda: (
                scenario == "l40s-inference" or _samples(page(daemon), "nvidia_gpu_nvlink_throughput_bytes_per_second")
            ),
            what="NVLink rates",
        )
        text = page(daemon)
    names = _names(text)
    errors = {labels["error"] for labels in _samples(text, "nvidia_gpu_nvlink_errors_total")}
    if scenario == "b200-training":  # Blackwell: the NVLink5 counters, and not the ones it does not support
        assert errors == {"recovery", "recovery_failed", "recovery_successful", "effective", "symbol"}
    if scenario == "a100-training":  # no GPM: NVLink throughput from NVML's link counters, per link
        assert "nvidia_gpu_sm_active_ratio" not in names
        assert {lab["link"] for lab in _samples(text, "nvidia_gpu_nvlink_throughput_bytes_per_second")} == {
            str(n) for n in range(12)
        }
        assert errors == {"replay", "recovery", "crc"}
    if scenario == "l40s-inference":  # PCIe only
        assert not {n for n in names if n.startswith("nvidia_gpu_nvlink")}
        assert "nvidia_gpu_mig_enabled" not in names and "nvidia_gpu_fabric_state" not in names
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert check.returncode == 0 and check.stdout == "", check.stdout + check.stderr


def test_the_daemon_serves_a_real_nodes_capture(tmp_path: Path, vgpu_lib: Path) -> None:
    """The README's steps: a capture into the state file, then `serve --backend nvml` on it."""
    capture = REPO / "tests" / "fixtures" / "captures" / "gpud-h100-535.161.08.txt"
    state = tmp_path / "vgpu.state"
    done = subprocess.run([GPU_TRIAGE, "vgpu", "--capture", str(capture), "--state", str(state)], check=False)
    assert done.returncode == 0
    with nvml_daemon(tmp_path / "nvml", vgpu_lib, state) as daemon:
        wait_for(lambda: gauge(page(daemon), "nvidia_gpu_power_watts", gpu="0") is not None, what="a poll")
        text = page(daemon)
    assert gauge(text, "nvidia_gpu_power_watts", gpu="0") == 67.74  # "Power Draw : 67.74 W" in the capture
    assert gauge(text, "nvidia_gpu_clock_event_reason_active", gpu="0", reason="hw_power_brake_slowdown") == 1.0
    assert gauge(text, "nvidia_gpu_up", gpu="7") == 1.0
