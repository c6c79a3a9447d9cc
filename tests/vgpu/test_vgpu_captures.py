"""Real nodes' `nvidia-smi -q` captures (tests/fixtures/captures/SOURCES.md) replayed through the virtual GPU.

`gpu-triage vgpu --capture FILE` sets the vGPU from the capture; the NVML backend reads it through the
real pynvml, as it would the real driver; what it exports must be the capture's own figures. Those are
read here with this file's own small reader (regular expressions on the text form, element paths on the
XML), and turned into base units by its own arithmetic: not the capture reader's code, which is under
test with the backend.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from tests.daemon_proc import GPU_TRIAGE
from tests.vgpu.conftest import REPO, Worker

CAPTURES = sorted((REPO / "tests" / "fixtures" / "captures").glob("*.[tx][xm][tl]"))
MIB = 2**20
ABSENT = {"N/A", "Not Supported", "[N/A]", "Requested functionality has been deprecated"}


def num(text: str | None) -> float | None:
    if text is None or text.strip() in ABSENT:
        return None
    m = re.search(r"-?\d+(?:\.\d+)?", text)
    return None if m is None else float(m[0])


# -- the expected figures, per GPU: series name as /metrics has it -> value in base units ---------------


def from_xml(path: Path) -> list[dict[str, float]]:
    root = ElementTree.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", path.read_text(), count=1))
    out = []
    for g in root.findall("gpu"):
        t = g.findtext
        power = t("gpu_power_readings/average_power_draw") or t("gpu_power_readings/power_draw")
        limit = t("gpu_power_readings/current_power_limit") or t("power_readings/enforced_power_limit")
        reasons = g.find("clocks_event_reasons")
        reasons = g.find("clocks_throttle_reasons") if reasons is None else reasons
        e: dict[str, Any] = {
            "nvidia_gpu_power_watts{}": num(power or t("power_readings/power_draw")),
            "nvidia_gpu_power_instant_watts{}": num(t("gpu_power_readings/instant_power_draw")),
            "nvidia_gpu_power_limit_watts{}": num(limit),
            "nvidia_gpu_power_default_limit_watts{}": num(
                t("gpu_power_readings/default_power_limit") or t("power_readings/default_power_limit")
            ),
            "nvidia_gpu_memory_total_bytes{}": mib(t("fb_memory_usage/total")),
            "nvidia_gpu_memory_reserved_bytes{}": mib(t("fb_memory_usage/reserved")),
            "nvidia_gpu_temperature_celsius{}": num(t("temperature/gpu_temp")),
            "nvidia_gpu_memory_temperature_celsius{}": num(t("temperature/memory_temp")),
            "nvidia_gpu_temperature_threshold_celsius{slowdown}": num(t("temperature/gpu_temp_slow_threshold")),
            "nvidia_gpu_temperature_threshold_celsius{shutdown}": num(t("temperature/gpu_temp_max_threshold")),
            "nvidia_gpu_pcie_link_generation{}": num(t("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "nvidia_gpu_pcie_link_max_generation{}": num(t("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "nvidia_gpu_pcie_link_width{}": num(t("pci/pci_gpu_link_info/link_widths/current_link_width")),
            "nvidia_gpu_pcie_replay_errors{}": num(t("pci/replay_counter")),
            # nvidia-smi prints NVML's "KB/s" number; a KB taken as 1000 bytes (nvml.h does not say)
            "nvidia_gpu_pcie_throughput_bytes_per_second{tx}": kb(t("pci/tx_util")),
            "nvidia_gpu_fan_speed_ratio{}": pct(t("fan_speed")),
            "nvidia_gpu_utilization_ratio{}": pct(t("utilization/gpu_util")),
            "nvidia_gpu_encoder_utilization_ratio{}": pct(t("utilization/encoder_util")),
            "nvidia_gpu_ecc_enabled{}": flag(t("ecc_mode/current_ecc")),
            "nvidia_gpu_ecc_location_errors{corrected,dram}": num(t("ecc_errors/volatile/dram_correctable")),
            "nvidia_gpu_remapped_rows{uncorrectable}": num(t("remapped_rows/remapped_row_unc")),
            "nvidia_gpu_row_remap_pending{}": flag(t("remapped_rows/remapped_row_pending")),
            "nvidia_gpu_persistence_mode{}": flag(t("persistence_mode")),
            "nvidia_gpu_mig_enabled{}": flag(t("mig_mode/current_mig")),
        }
        for domain, tag in (("sm", "sm"), ("memory", "mem"), ("graphics", "graphics"), ("video", "video")):
            e[f"nvidia_gpu_clock_hertz{{{domain}}}"] = mhz(t(f"clocks/{tag}_clock"))
            e[f"nvidia_gpu_clock_max_hertz{{{domain}}}"] = mhz(t(f"max_clocks/{tag}_clock"))
        for child in reasons if reasons is not None else ():
            name = re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
            name = {"display_clocks_setting": "display_clock_setting"}.get(name, name)  # NVML's word, not smi's
            e[f"nvidia_gpu_clock_event_reason_active{{{name}}}"] = flag(child.text)
        counters = g.find("clocks_event_reasons_counters")
        for child in counters if counters is not None else ():
            reason = {"sw_power_cap": "sw_power_cap", "hw_therm_slowdown": "hw_thermal_slowdown"}.get(
                child.tag.removeprefix("clocks_event_reasons_counters_")
            )
            if reason:
                e[f"nvidia_gpu_clock_event_duration_seconds{{{reason}}}"] = (num(child.text) or 0) / 1e6
        for m in g.findall("mig_devices/mig_device"):
            gi = m.findtext("gpu_instance_id")
            e[f"mig {gi} total"] = mib(m.findtext("fb_memory_usage/total"))
            e[f"mig {gi} used"] = mib(m.findtext("fb_memory_usage/used"))
        out.append(e)
    return out


def from_text(path: Path) -> list[dict[str, float]]:
    out = []
    for block in re.split(r"^GPU [0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d\s*$", path.read_text(), flags=re.M)[1:]:

        def v(*labels: str, block: str = block) -> str | None:
            """The value under these labels, each one deeper than the one before."""
            pattern = r"".join(rf"^[ \t]*{re.escape(label)}[ \t]*(?::.*)?$[\s\S]*?" for label in labels[:-1])
            m = re.search(pattern + rf"^[ \t]*{re.escape(labels[-1])}[ \t]*:[ \t]*(.*)$", block, re.M)
            return None if m is None else m[m.lastindex or 0].strip()

        e: dict[str, Any] = {
            "nvidia_gpu_power_watts{}": num(v("GPU Power Readings", "Power Draw")),
            "nvidia_gpu_power_limit_watts{}": num(v("GPU Power Readings", "Current Power Limit")),
            "nvidia_gpu_power_default_limit_watts{}": num(v("GPU Power Readings", "Default Power Limit")),
            "nvidia_gpu_memory_total_bytes{}": mib(v("FB Memory Usage", "Total")),
            "nvidia_gpu_memory_used_bytes{}": mib(v("FB Memory Usage", "Used")),
            "nvidia_gpu_memory_reserved_bytes{}": mib(v("FB Memory Usage", "Reserved")),
            "nvidia_gpu_temperature_celsius{}": num(v("Temperature", "GPU Current Temp")),
            "nvidia_gpu_memory_temperature_celsius{}": num(v("Temperature", "Memory Current Temp")),
            "nvidia_gpu_pcie_link_generation{}": num(v("PCIe Generation", "Current")),
            "nvidia_gpu_pcie_link_max_generation{}": num(v("PCIe Generation", "Max")),
            "nvidia_gpu_pcie_link_width{}": num(v("Link Width", "Current")),
            "nvidia_gpu_pcie_replay_errors{}": num(v("Replays Since Reset")),
            "nvidia_gpu_pcie_throughput_bytes_per_second{tx}": kb(v("Tx Throughput")),
            "nvidia_gpu_pcie_throughput_bytes_per_second{rx}": kb(v("Rx Throughput")),
            "nvidia_gpu_utilization_ratio{}": pct(v("Utilization", "Gpu")),
            "nvidia_gpu_ecc_enabled{}": flag(v("ECC Mode", "Current")),
            "nvidia_gpu_ecc_location_errors{corrected,dram}": num(v("Volatile", "DRAM Correctable")),
            "nvidia_gpu_remapped_rows{correctable}": num(v("Remapped Rows", "Correctable Error")),
            "nvidia_gpu_remapped_rows{uncorrectable}": num(v("Remapped Rows", "Uncorrectable Error")),
            "nvidia_gpu_row_remap_pending{}": flag(v("Remapped Rows", "Pending")),
            "nvidia_gpu_persistence_mode{}": flag(v("Persistence Mode")),
            "nvidia_gpu_clock_event_reason_active{hw_power_brake_slowdown}": flag(v("HW Power Brake Slowdown")),
            "nvidia_gpu_clock_event_reason_active{sw_thermal_slowdown}": flag(v("SW Thermal Slowdown")),
            "nvidia_gpu_clock_event_reason_active{gpu_idle}": flag(v("Clocks Event Reasons", "Idle")),
            "nvidia_gpu_fabric_state{completed}": 1.0 if v("Fabric", "State") == "Completed" else None,
        }
        for domain, label in (("sm", "SM"), ("memory", "Memory"), ("video", "Video")):
            e[f"nvidia_gpu_clock_hertz{{{domain}}}"] = mhz(v("Clocks", label))
            e[f"nvidia_gpu_clock_max_hertz{{{domain}}}"] = mhz(v("Max Clocks", label))
        out.append(e)
    return out


def mib(text: str | None) -> float | None:
    n = num(text)
    return None if n is None else n * MIB


def mhz(text: str | None) -> float | None:
    n = num(text)
    return None if n is None else n * 1e6


def pct(text: str | None) -> float | None:
    n = num(text)
    return None if n is None else n / 100


def kb(text: str | None) -> float | None:
    n = num(text)
    return None if n is None else n * 1000


def flag(text: str | None) -> float | None:
    if text is None or text.strip() in ABSENT:
        return None
    return 1.0 if text.strip() in ("Active", "Enabled", "Yes") else 0.0


# -- what the daemon's NVML backend exports from the vGPU set from the capture ---------------------------


def exported(nvml: Worker, gpus: int) -> list[dict[str, float]]:
    nvml.run("ops.start()")
    collectors = ("power", "memory", "thermal", "clocks", "pcie", "utilization", "ecc", "remapping", "inventory",
                  "recovery", "nvlink")  # fmt: skip
    out = []
    for gpu in range(gpus):
        shown: dict[str, float] = {}
        for collector in collectors:
            read = nvml.run(f"result = ops.read({gpu}, {collector!r}, with_series=True)")
            assert read.get("failed") == [], (gpu, collector, read)
            shown.update(read["series"])
        for key, value in list(shown.items()):  # MIG instances by GPU instance id
            if m := re.fullmatch(r"nvidia_gpu_memory_(used|total)_bytes\{gpu_instance=(\d+),.*\}", key):
                shown[f"mig {m[2]} {m[1]}"] = value
        out.append(shown)
    return out


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_the_daemon_exports_the_captures_own_figures(
    worker: Callable[..., Worker], vgpu_lib: Path, tmp_path: Path, capture: Path
) -> None:
    state = tmp_path / "vgpu.state"
    done = subprocess.run(
        [GPU_TRIAGE, "vgpu", "--capture", str(capture), "--state", str(state)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = from_xml(capture) if capture.suffix == ".xml" else from_text(capture)
    shown = exported(worker(state), len(expected))
    checked = 0
    for gpu, (want, got) in enumerate(zip(expected, shown, strict=True)):
        for series, value in want.items():
            if value is None:  # the capture does not say: the daemon must not either
                assert series not in got, (gpu, series, got.get(series))
                continue
            assert got.get(series) == pytest.approx(value, rel=1e-9), (gpu, series)
            checked += 1
        assert not [name for name in got if name.startswith("nvidia_gpu_nvlink")], "the capture has no NVLink"
    assert checked >= 20 * len(expected)


def test_a_capture_of_another_kind_is_refused_with_a_reason(tmp_path: Path) -> None:
    for text, reason in [
        ("hello", "neither nvidia-smi -q -x"),
        ("<?xml version='1.0'?><other/>", "not <nvidia_smi_log>"),
        ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "boom">]><nvidia_smi_log/>', "declares entities"),
        ("<nvidia_smi_log><gpu>", "not well-formed"),
    ]:
        path = tmp_path / "capture"
        path.write_text(text)
        done = subprocess.run(
            [GPU_TRIAGE, "vgpu", "--capture", str(path), "--state", str(tmp_path / "s")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 2 and reason in done.stderr, done.stderr
