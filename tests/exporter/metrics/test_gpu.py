"""/metrics content: the golden page, promtool's lint, and our encoder against prometheus_client's."""

from __future__ import annotations

import gzip
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_triage.exporter.backends.base import DriverXid, GpuIdentity
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Activity, Pcie, Processes, ProcessReading, Profiling
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.metrics.exposition import MetricsCache, encode
from gpu_triage.exporter.metrics.families import FAMILIES
from gpu_triage.exporter.metrics.gpu import daemon_families, gpu_families
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.sources.pipeline import DriverBatch, KernelBatch
from gpu_triage.exporter.sources.records import Record
from tests.conftest import REPO, FakeClock, require_tool, settings
from tests.exporter.metrics.test_exposition import reference_encode

GOLDEN = REPO / "tests" / "golden" / "metrics-sim.prom"
# Families whose values depend on the machine or the moment, not on the scenario.
_VOLATILE = re.compile(r"^(process_|python_|gpu_triage_collector_duration_seconds|gpu_triage_build_info)")

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def faulty_node_page(state_dir: Path) -> bytes:
    """The full /metrics page of the fault scenario 250 s in, with one GPU lost on top."""
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-faults"), clock=clock)
    daemon = Daemon(sim, settings(state_dir), clock=clock, boot_id="boot-1")
    daemon.poller.discover()
    clock.advance(250)
    sim.inject(FaultSpec(gpu=7, kind="gpu_lost"))
    daemon.poller.poll(Collector)
    # The XID 13 the scenario injected at 120 s, and kernel-log lines: an XID the driver events also
    # reported (one event, not two), an XID on a GPU NVML does not know, and an NVSwitch SXID.
    daemon.pipeline.process(
        [
            DriverBatch("sim", sim.wait_xids(0.0)),
            DriverBatch("sim", [DriverXid(gpu=6, code=94, timestamp=clock.now - 2)]),
            KernelBatch("kmsg:boot-1", [
                Record(101, clock.now - 1, "NVRM: Xid (PCI:0000:ba:00): 94, pid=41102, name=python3, Ch 00000008"),
                Record(102, clock.now, "NVRM: Xid (PCI:0000:e1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
                Record(103, clock.now, "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error (First)"),
            ]),
        ]
    )  # fmt: skip
    daemon.refresh()
    page = daemon.metrics.text
    daemon.stop()
    return page


def stable(page: bytes) -> str:
    return "".join(line + "\n" for line in page.decode().splitlines() if not _VOLATILE.match(line))


def test_golden_page(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    page = stable(faulty_node_page(tmp_path))
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(page)
    assert GOLDEN.exists(), "no golden file yet: run pytest --update-golden and review the diff"
    assert page == GOLDEN.read_text(), "the /metrics page changed: if on purpose, run pytest --update-golden"


def test_page_shows_the_faults(tmp_path: Path) -> None:
    families = {f.name: f for f in text_string_to_metric_families(faulty_node_page(tmp_path).decode())}

    def value(name: str, **labels: str) -> float:
        matches = [s.value for s in families[name].samples if labels.items() <= s.labels.items()]
        assert len(matches) == 1, (name, labels, matches)
        return matches[0]

    assert value("nvidia_gpu_up", gpu="7") == 0 and value("nvidia_gpu_up", gpu="6") == 1
    assert not [s for s in families["nvidia_gpu_power_watts"].samples if s.labels["gpu"] == "7"]
    assert len([s for s in families["nvidia_gpu_info"].samples if s.labels["gpu"] == "7"]) == 1
    assert value("nvidia_gpu_clock_event_reason_active", gpu="2", reason="hw_thermal_slowdown") == 1
    assert value("nvidia_gpu_clock_event_reason_active", gpu="1", reason="hw_thermal_slowdown") == 0
    assert value("nvidia_gpu_ecc_errors", gpu="5", error="corrected") == 3  # parser drops _total
    assert value("nvidia_gpu_nvlink_up", gpu="4", link="7") == 0
    assert value("nvidia_gpu_nvlink_up", gpu="4", link="6") == 1
    assert "nvidia_gpu_fan_speed_ratio" not in families or not families["nvidia_gpu_fan_speed_ratio"].samples
    assert value("nvidia_gpu_xid_errors", gpu="1", xid="13") == 1
    assert value("nvidia_gpu_xid_errors", gpu="6", xid="94") == 1, "kernel log and driver events: one fault"
    assert value("nvidia_gpu_xid_errors", gpu="0000:e1:00.0", uuid="", xid="79") == 1, "no index: the bus id"
    assert value("nvidia_nvswitch_sxid_errors", pci_bus_id="0000:85:00.0", sxid="12028") == 1


def test_every_family_has_help_and_base_units() -> None:
    for family in FAMILIES:
        assert family.help.endswith(".") and len(family.help) > 20, family.name
        assert family.name.startswith("nvidia_gpu_")
        assert not re.search(r"_(percent|mhz|mb|ms|milli\w+)($|_)", family.name), family.name
        if family.unit:
            assert family.name.endswith("_" + family.unit), family.name


def test_promtool_accepts_the_page(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=faulty_node_page(tmp_path),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode() == "", result.stdout.decode()  # no lint warnings either


def _tricky_snapshot() -> Snapshot:
    gpu = GpuIdentity(0, "GPU-0000", "0000:18:00.0")
    odd = Processes((ProcessReading(1, 'we"ird\\name\nwith newline', 10), ProcessReading(2, "", None)))
    return Snapshot(1.5, "sim", (GpuState(gpu, {Collector.PROCESSES: odd}),))


@pytest.mark.parametrize("snapshot", ["faulty", "tricky"])
def test_our_encoder_matches_prometheus_client(snapshot: str, tmp_path: Path) -> None:
    if snapshot == "tricky":
        snap = _tricky_snapshot()
    else:
        clock = FakeClock()
        sim = SimBackend(load_scenario("h100-faults"), clock=clock)
        daemon = Daemon(sim, settings(tmp_path), clock=clock)
        daemon.poller.discover()
        clock.advance(400)
        snap = daemon.poller.poll(Collector)
        daemon.stop()
    families = [*gpu_families(snap), *daemon_families(snap)]
    assert encode(families) == reference_encode(families)


def test_content_negotiation_and_gzip() -> None:
    cache = MetricsCache()
    cache.update([*gpu_families(_tricky_snapshot())])
    plain = cache.get(None, None)
    assert plain.content_type.startswith("text/plain; version=0.0.4") and not plain.gzipped
    om = cache.get(PROMETHEUS_ACCEPT, "gzip")
    assert om.content_type.startswith("application/openmetrics-text; version=1.0.0") and om.gzipped
    assert gzip.decompress(om.body).endswith(b"# EOF\n")
    assert cache.get("text/plain;version=0.0.4", "gzip, deflate").content_type.startswith("text/plain")
    assert cache.get(PROMETHEUS_ACCEPT, "gzip").body is om.body, "compressed once per render"


def mig_node_page(state_dir: Path) -> bytes:
    clock = FakeClock()
    sim = SimBackend(load_scenario("h100-mig"), clock=clock)
    daemon = Daemon(sim, settings(state_dir), clock=clock, boot_id="boot-1")
    daemon.poller.discover()
    clock.advance(300)
    daemon.poller.poll(Collector)
    page = daemon.metrics.text
    daemon.stop()
    return page


def test_mig_instances_are_series_of_the_same_families_with_four_more_labels(tmp_path: Path) -> None:
    families = {f.name: f for f in text_string_to_metric_families(mig_node_page(tmp_path).decode())}
    mig = {"gpu_instance", "compute_instance", "mig_profile", "mig_uuid"}
    for name in ("nvidia_gpu_memory_used_bytes", "nvidia_gpu_sm_active_ratio", "nvidia_gpu_processes"):
        samples = families[name].samples
        whole = [s for s in samples if "gpu_instance" not in s.labels]
        parts = [s for s in samples if "gpu_instance" in s.labels]
        assert sorted(s.labels["gpu"] for s in whole) == [str(g) for g in range(8)], name
        assert all(set(s.labels) == {"gpu", "uuid"} for s in whole), name  # whole GPUs: the labels they always had
        assert sorted((s.labels["gpu"], s.labels["mig_profile"]) for s in parts) == [
            ("0", "3g.40gb"), ("0", "4g.40gb"), ("1", "3g.40gb"), ("1", "4g.40gb"),
        ], name  # fmt: skip
        assert all(set(s.labels) == {"gpu", "uuid"} | mig for s in parts), name
    processes = families["nvidia_gpu_process_memory_used_bytes"].samples
    assert {s.labels.get("mig_profile") for s in processes if s.labels["gpu"] in "01"} == {"3g.40gb", "4g.40gb"}
    utilization = {s.labels["gpu"] for s in families["nvidia_gpu_utilization_ratio"].samples}
    assert utilization == {"2", "3", "4", "5", "6", "7"}, "NVML has no utilization for a MIG GPU"
    enabled = {s.labels["gpu"]: s.value for s in families["nvidia_gpu_mig_enabled"].samples}
    assert enabled == {"0": 1, "1": 1, "2": 0, "3": 0, "4": 0, "5": 0, "6": 0, "7": 0}


def test_promtool_accepts_the_mig_page(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    page = mig_node_page(tmp_path)
    result = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, timeout=30, check=False)
    assert result.returncode == 0 and result.stdout.decode() == "", result.stdout.decode() + result.stderr.decode()


def test_pcie_bandwidth_from_profiling_replaces_the_20ms_window() -> None:
    gpu = GpuIdentity(0, "GPU-0000", "0000:18:00.0")
    pcie = Pcie(5, 5, 16, 16, 0, tx_bytes_per_second=1000.0, rx_bytes_per_second=2000.0)

    def page(profiling: Profiling) -> dict[str, float]:
        snap = Snapshot(1.5, "sim", (GpuState(gpu, {Collector.PCIE: pcie, Collector.PROFILING: profiling}),))
        (family,) = [f for f in gpu_families(snap) if f.name == "nvidia_gpu_pcie_throughput_bytes_per_second"]
        return {s.labels["direction"]: s.value for s in family.samples}

    measured = Activity(pcie_tx_bytes_per_second=5e9, pcie_rx_bytes_per_second=6e9)
    assert page(Profiling("gpm", "sampling", measured)) == {"tx": 5e9, "rx": 6e9}
    assert page(Profiling(None, "GPM is not supported on this GPU")) == {"tx": 1000.0, "rx": 2000.0}
    partial = Activity(pcie_tx_bytes_per_second=5e9)  # one direction measured: the other from NVML's window
    assert page(Profiling("dcgm", "watching", partial)) == {"tx": 5e9, "rx": 2000.0}
