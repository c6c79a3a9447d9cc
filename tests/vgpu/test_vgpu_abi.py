"""The library as pynvml meets it: loading, the default node, lifetime, and NVML's argument rules."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.vgpu.conftest import H, Worker, vs

# Every entry point the library promises (vgpu/README.md): gpu-triage's, nvitop's and gpustat's.
_ENTRY_POINTS = """
nvmlInit nvmlInit_v2 nvmlInitWithFlags nvmlShutdown nvmlErrorString
nvmlSystemGetDriverVersion nvmlSystemGetNVMLVersion nvmlSystemGetCudaDriverVersion nvmlSystemGetCudaDriverVersion_v2
nvmlDeviceGetCount nvmlDeviceGetCount_v2 nvmlDeviceGetHandleByIndex nvmlDeviceGetHandleByIndex_v2
nvmlDeviceGetHandleByUUID nvmlDeviceGetHandleByPciBusId nvmlDeviceGetHandleByPciBusId_v2
nvmlDeviceGetIndex nvmlDeviceGetName nvmlDeviceGetUUID nvmlDeviceGetSerial nvmlDeviceGetBoardPartNumber
nvmlDeviceGetVbiosVersion nvmlDeviceGetInforomImageVersion nvmlDeviceGetMinorNumber nvmlDeviceGetArchitecture
nvmlDeviceGetBrand nvmlDeviceGetCudaComputeCapability
nvmlDeviceGetPciInfo nvmlDeviceGetPciInfo_v2 nvmlDeviceGetPciInfo_v3 nvmlDeviceGetPciInfoExt
nvmlDeviceGetUtilizationRates nvmlDeviceGetEncoderUtilization nvmlDeviceGetDecoderUtilization
nvmlDeviceGetMemoryInfo nvmlDeviceGetMemoryInfo_v2 nvmlDeviceGetBAR1MemoryInfo
nvmlDeviceGetPowerUsage nvmlDeviceGetTotalEnergyConsumption nvmlDeviceGetEnforcedPowerLimit
nvmlDeviceGetPowerManagementLimit nvmlDeviceGetPowerManagementLimitConstraints nvmlDeviceGetPowerManagementDefaultLimit
nvmlDeviceGetTemperature nvmlDeviceGetTemperatureV nvmlDeviceGetTemperatureThreshold nvmlDeviceGetFanSpeed
nvmlDeviceGetClockInfo nvmlDeviceGetMaxClockInfo nvmlDeviceGetClock nvmlDeviceGetApplicationsClock
nvmlDeviceGetCurrentClocksEventReasons nvmlDeviceGetCurrentClocksThrottleReasons nvmlDeviceGetPerformanceState
nvmlDeviceGetPcieThroughput nvmlDeviceGetCurrPcieLinkGeneration nvmlDeviceGetCurrPcieLinkWidth
nvmlDeviceGetMaxPcieLinkGeneration nvmlDeviceGetMaxPcieLinkWidth nvmlDeviceGetPcieReplayCounter
nvmlDeviceGetTotalEccErrors nvmlDeviceGetMemoryErrorCounter nvmlDeviceGetEccMode nvmlDeviceGetRemappedRows
nvmlDeviceGetRetiredPages nvmlDeviceGetRetiredPages_v2 nvmlDeviceGetRetiredPagesPendingStatus
nvmlDeviceGetComputeMode nvmlDeviceGetPersistenceMode nvmlDeviceGetDisplayMode nvmlDeviceGetDisplayActive
nvmlDeviceGetNvLinkState nvmlDeviceGetNvLinkVersion nvmlDeviceGetNvLinkErrorCounter nvmlDeviceGetFieldValues
nvmlDeviceGetComputeRunningProcesses nvmlDeviceGetComputeRunningProcesses_v2 nvmlDeviceGetComputeRunningProcesses_v3
nvmlDeviceGetGraphicsRunningProcesses nvmlDeviceGetGraphicsRunningProcesses_v2 nvmlDeviceGetGraphicsRunningProcesses_v3
nvmlEventSetCreate nvmlEventSetFree nvmlDeviceRegisterEvents nvmlDeviceGetSupportedEventTypes
nvmlEventSetWait nvmlEventSetWait_v2
nvmlDeviceGetMigMode nvmlDeviceGetMaxMigDeviceCount nvmlDeviceGetMigDeviceHandleByIndex nvmlDeviceGetGpuInstanceId
nvmlDeviceGetComputeInstanceId nvmlDeviceGetDeviceHandleFromMigDeviceHandle nvmlDeviceIsMigDeviceHandle
nvmlGpmQueryDeviceSupport nvmlGpmSampleAlloc nvmlGpmSampleFree nvmlGpmSampleGet nvmlGpmMigSampleGet nvmlGpmMetricsGet
nvmlDeviceGetAttributes_v2 nvmlDeviceGetGpuInstanceProfileInfoV nvmlDeviceGetGpuFabricInfoV nvmlDeviceGetGspFirmwareMode
"""
ENTRY_POINTS = _ENTRY_POINTS.split()

BUS_IDS = ["0000:18:00.0", "0000:2A:00.0", "0000:3A:00.0", "0000:5D:00.0"]
BUS_IDS += ["0000:9A:00.0", "0000:AB:00.0", "0000:BA:00.0", "0000:DB:00.0"]

ERROR_INVALID_ARGUMENT = 2
FIELD_LINK_COUNT = 13  # index of NVML_FI_DEV_NVLINK_LINK_COUNT in probe.FIELDS


@pytest.fixture
def default(worker: Callable[..., Worker]) -> Worker:
    """A worker on the library's built-in node (GPU_TRIAGE_VGPU_STATE unset)."""
    w = worker(None)
    w.init()
    return w


def test_every_promised_entry_point_is_exported_and_nothing_internal(default: Worker) -> None:
    missing = default.run(f"result = [s for s in {ENTRY_POINTS!r} if not hasattr(n.nvmlLib, s)]")
    assert missing == []
    assert default.run("result = hasattr(n.nvmlLib, 'vgpu_begin') or hasattr(n.nvmlLib, 'vgpu_read_gpu')") is False


def test_default_node_is_eight_h100s_with_their_identities(default: Worker) -> None:
    assert default.call("nvmlDeviceGetCount") == 8
    assert default.call("nvmlSystemGetDriverVersion") == "580.82.07"
    assert default.call("nvmlSystemGetNVMLVersion") == "13.580.82.07"
    assert default.call("nvmlSystemGetCudaDriverVersion_v2") == 13000
    uuids = []
    for i in range(8):
        d = default.run(f"result = probe.dump(H['{i}'])")
        assert d["name"] == "NVIDIA H100 80GB HBM3"
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", d["uuid"])
        uuids.append(d["uuid"])
        assert d["pci"]["busIdLegacy"] == BUS_IDS[i]
        assert d["pci"]["busId"] == "0000" + BUS_IDS[i]
        assert (d["index"], d["minor_number"], d["architecture"], d["cuda_cc"]) == (i, i, 9, [9, 0])
        assert d["memory"]["total"] == 81559 * 2**20
        assert d["fields"][FIELD_LINK_COUNT]["value"] == 18
        links = default.run(f"result = probe.links(H['{i}'], 18)")
        assert {link["fields"][0]["value"] for link in links} == {vs.NVLINK_ACTIVE}
        assert d["fan"] == {"nvml": 3}  # an SXM board has no fan
        assert d["retired"] == [{"nvml": 3}, {"nvml": 3}]  # Hopper remaps rows instead
    assert len(set(uuids)) == 8


def test_devices_are_found_by_uuid_and_by_any_form_of_bus_id(default: Worker) -> None:
    uuid = default.call("nvmlDeviceGetUUID", H(5))
    assert default.call("nvmlDeviceGetHandleByUUID", uuid) == default.call("nvmlDeviceGetHandleByIndex", 5)
    for bus_id in ("0000:ab:00.0", "00000000:AB:00.0", "ab:00.0"):
        assert default.run(f"result = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId({bus_id!r}))") == 5
    assert default.error("nvmlDeviceGetHandleByUUID", "GPU-00000000-0000-0000-0000-000000000000") == 6  # NOT_FOUND
    assert default.error("nvmlDeviceGetHandleByPciBusId", "0000:19:00.0") == 6
    assert default.error("nvmlDeviceGetHandleByPciBusId", "not a bus id") == ERROR_INVALID_ARGUMENT
    assert default.error("nvmlDeviceGetHandleByIndex", 8) == ERROR_INVALID_ARGUMENT


def test_python_default_node_is_byte_for_byte_the_librarys(default: Worker, tmp_path: Path) -> None:
    layout = default.run(
        "h, g, f = (ctypes.c_uint() for _ in range(3))\n"
        "v = n.nvmlLib.vgpuStateLayout(ctypes.byref(h), ctypes.byref(g), ctypes.byref(f))\n"
        "result = [v, h.value, g.value, f.value]"
    )
    assert layout == [vs.LAYOUT_VERSION, vs.HEADER_SIZE, vs.GPU_SIZE, vs.FILE_SIZE]
    image = default.run(
        f"buf = ctypes.create_string_buffer({vs.FILE_SIZE})\n"
        f"assert n.nvmlLib.vgpuDefaultImage(buf, ctypes.c_size_t({vs.FILE_SIZE})) == 0\n"
        "result = buf.raw.hex()"
    )
    path = tmp_path / "state"
    vs.StateWriter(path, vs.h100_node()).close()
    assert bytes.fromhex(image) == path.read_bytes()


def test_calls_before_init_and_after_the_last_shutdown_are_uninitialized(worker: Callable[..., Worker]) -> None:
    w = worker(None)
    assert w.error("nvmlDeviceGetCount") == 1
    assert w.error("nvmlShutdown") == 1
    w.init()
    w.call("nvmlInit")  # reference-counted: two inits need two shutdowns
    w.call("nvmlShutdown")
    assert w.call("nvmlDeviceGetPowerUsage", H(0)) > 0
    w.call("nvmlShutdown")
    assert w.error("nvmlDeviceGetPowerUsage", H(0)) == 1
    assert w.error("nvmlSystemGetDriverVersion") == 1
    w.call("nvmlInit")  # and it comes back
    assert w.call("nvmlDeviceGetPowerUsage", H(0)) > 0


def test_error_strings(default: Worker) -> None:
    assert default.call("nvmlErrorString", 15) == "GPU is lost"
    assert default.call("nvmlErrorString", 25) == "Argument version mismatch"
    assert default.call("nvmlErrorString", 12345) == "Unknown Error"


def test_null_pointers_and_foreign_handles_are_invalid_arguments(default: Worker) -> None:
    codes = default.run(
        "fn = n._nvmlGetFunctionPointer\n"
        "h = H['0']\n"
        "stranger = ctypes.cast(ctypes.create_string_buffer(64), n.c_nvmlDevice_t)\n"
        "result = [\n"
        "  fn('nvmlDeviceGetPowerUsage')(h, None),\n"
        "  fn('nvmlDeviceGetMemoryInfo_v2')(h, None),\n"
        "  fn('nvmlDeviceGetCount_v2')(None),\n"
        "  fn('nvmlDeviceGetName')(h, None, 96),\n"
        "  fn('nvmlDeviceGetFieldValues')(h, 1, None),\n"
        "  fn('nvmlEventSetWait_v2')(ctypes.c_void_p(0), None, 0),\n"
        "  fn('nvmlDeviceGetPowerUsage')(stranger, ctypes.byref(ctypes.c_uint())),\n"
        "  fn('nvmlDeviceGetName')(None, ctypes.create_string_buffer(96), 96),\n"
        "  fn('nvmlDeviceGetClockInfo')(h, 7, ctypes.byref(ctypes.c_uint())),\n"
        "]"
    )
    assert codes == [ERROR_INVALID_ARGUMENT] * len(codes)


def test_a_short_buffer_is_insufficient_size(default: Worker) -> None:
    assert (
        default.run(
            "b = ctypes.create_string_buffer(8)\nresult = n._nvmlGetFunctionPointer('nvmlDeviceGetName')(H['0'], b, 8)"
        )
        == 7
    )


def test_versioned_structs_refuse_a_wrong_version(default: Worker) -> None:
    codes = default.run(
        "fn = n._nvmlGetFunctionPointer\n"
        "h = H['0']\n"
        "def call(name, struct, version):\n"
        "    s = struct(); s.version = version\n"
        "    return fn(name)(h, ctypes.byref(s)), s\n"
        "mem_old, _ = call('nvmlDeviceGetMemoryInfo_v2', n.c_nvmlMemory_v2_t, 0x01000028)\n"
        "mem_size, _ = call('nvmlDeviceGetMemoryInfo_v2', n.c_nvmlMemory_v2_t, 0x02000020)\n"
        "mem_ok, mem = call('nvmlDeviceGetMemoryInfo_v2', n.c_nvmlMemory_v2_t, n.nvmlMemory_v2)\n"
        "temp_bad, _ = call('nvmlDeviceGetTemperatureV', n.c_nvmlTemperature_v1_t, 0x0200000C)\n"
        "temp_ok, temp = call('nvmlDeviceGetTemperatureV', n.c_nvmlTemperature_v1_t, n.nvmlTemperature_v1)\n"
        "pci_bad, _ = call('nvmlDeviceGetPciInfoExt', n.nvmlPciInfoExt_v1_t, 1)\n"
        "pci_ok, pci = call('nvmlDeviceGetPciInfoExt', n.nvmlPciInfoExt_v1_t, n.nvmlPciInfoExt_v1)\n"
        "gpm_bad, _ = call('nvmlGpmQueryDeviceSupport', n.c_nvmlGpmSupport_t, 2)\n"
        "mg = n.c_nvmlGpmMetricsGet_t(); mg.version = 2\n"
        "metrics_bad = fn('nvmlGpmMetricsGet')(ctypes.byref(mg))\n"
        "result = [mem_old, mem_size, temp_bad, pci_bad, gpm_bad, metrics_bad,\n"
        "          [mem_ok, mem.total], [temp_ok, temp.temperature], [pci_ok, pci.baseClass, pci.busId]]"
    )
    assert codes[:6] == [25] * 6
    assert codes[6] == [0, 81559 * 2**20]
    assert codes[7] == [0, 30]
    assert codes[8] == [0, 3, "00000000:18:00.0"]


def test_a_missing_state_file_is_a_driver_that_is_not_loaded(worker: Callable[..., Worker], tmp_path: Path) -> None:
    w = worker(tmp_path / "nowhere")
    assert w.error("nvmlInit") == 9  # NVML_ERROR_DRIVER_NOT_LOADED
    assert "nowhere" in w.close()


def test_a_foreign_file_is_a_version_mismatch(worker: Callable[..., Worker], tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_bytes(b"\0" * vs.FILE_SIZE)
    assert worker(path).error("nvmlInit") == 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
    path.write_bytes(b"GTVGPUST")  # the right magic, too short to map whole
    assert worker(path).error("nvmlInit") == 18


def test_a_node_without_gpus_needs_the_no_gpus_flag(
    worker: Callable[..., Worker], writer: Callable[..., vs.StateWriter]
) -> None:
    state = writer([])
    w = worker(state.path)
    assert w.error("nvmlInit") == 28  # NVML_ERROR_GPU_NOT_FOUND
    w.call("nvmlInitWithFlags", 1)  # NVML_INIT_FLAG_NO_GPUS
    assert w.call("nvmlDeviceGetCount") == 0
