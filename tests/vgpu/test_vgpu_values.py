"""Every value of a GPU record, written by the Python writer and read back through the real pynvml."""

from __future__ import annotations

from typing import Any

from tests.vgpu.conftest import H, Worker, vs

NOT_SUPPORTED = {"nvml": 3}
GIB = 2**30
MIB = 2**20
UINT, ULL = 1, 3  # nvmlValueType_t


def distinctive() -> vs.Gpu:
    """A GPU whose every value differs from the defaults and from each other, so a swapped or dropped one shows."""
    states = [vs.NVLINK_INACTIVE, vs.NVLINK_ACTIVE, vs.NVLINK_SLEEP, vs.NVLINK_ACTIVE_TRAFFIC_DISABLED] * 3
    links = [
        vs.NvLink(
            state=state,
            speed_mbps=25000 + i,
            replay_errors=100 + i,
            recovery_errors=200 + i,
            crc_flit_errors=300 + i,
            crc_data_errors=400 + i,
            ecc_data_errors=500 + i,
            data_tx_kib=10**12 + i,
            data_rx_kib=2 * 10**12 + i,
            raw_tx_kib=3 * 10**12 + i,
            raw_rx_kib=4 * 10**12 + i,
            recovery_successful=600 + i,
            recovery_failed=700 + i,
            recovery_events=1300 + 2 * i,
            effective_errors=800 + i,
            symbol_errors=900 + i,
        )
        for i, state in enumerate(states)
    ]
    return vs.Gpu(
        uuid="GPU-01234567-89ab-cdef-0123-456789abcdef",
        pci_bus=0x42,
        pci_domain=0x1,
        pci_device=0x3,
        minor_number=11,
        name="NVIDIA H100 80GB HBM3 (test)",
        serial="9876543210123",
        board_part_number="699-2G520-0201-000",
        vbios_version="96.00.AA.00.02",
        inforom_image_version="G520.0201.00.07",
        brand=2,
        architecture=10,
        cuda_compute_capability=(10, 1),
        pci_device_id=0x23B010DE,
        pci_subsystem_id=0x180010DE,
        pci_sub_class=0,
        utilization_gpu=87,
        utilization_memory=43,
        utilization_encoder=5,
        utilization_decoder=6,
        memory_total=80 * GIB,
        memory_reserved=600 * MIB,
        memory_used=41 * GIB,
        bar1_total=64 * GIB,
        bar1_used=3 * MIB,
        power_mw=612_345,
        energy_mj=123_456_789_012,
        power_limit_enforced_mw=650_000,
        power_limit_mw=660_000,
        power_limit_min_mw=210_000,
        power_limit_max_mw=710_000,
        power_limit_default_mw=690_000,
        temperature_gpu=71,
        temperature_memory=83,
        temperature_thresholds=[93, 90, 96, 88, 0, 0, 0, 0],
        fan_speed=44,
        clocks_mhz=[1755, 1740, 2619, 1200],
        max_clocks_mhz=[1980, 1981, 2620, 1545],
        app_clocks_mhz=[1700, 1701, 2600, 1400],
        default_app_clocks_mhz=[1600, 1601, 2500, 1300],
        clocks_event_reasons=0x4 | 0x20,
        pstate=2,
        pcie_tx_kbs=1_234_567,
        pcie_rx_kbs=2_345_678,
        pcie_link_gen=4,
        pcie_link_gen_max=5,
        pcie_link_width=8,
        pcie_link_width_max=16,
        pcie_replay_count=17,
        ecc_mode_pending=False,
        ecc={(0, 0, 2): 5, (1, 0, 2): 1, (0, 1, 2): 50, (1, 1, 2): 3, (0, 0, 1): 7, (1, 1, 1): 2},
        remapped_correctable=4,
        remapped_uncorrectable=2,
        remap_pending=True,
        retired_sbe=[vs.RetiredPage(0x1000, 1_700_000_000), vs.RetiredPage(0x2000, 1_700_000_100)],
        retired_dbe=[vs.RetiredPage(0xABC000, 1_700_000_200)],
        retired_pending=True,
        recovery_action=1,
        compute_mode=3,
        persistence_mode=False,
        display_mode=True,
        nvlink_version=7,
        nvlinks=links,
        processes=[
            vs.Process(1234, 10 * GIB),
            vs.Process(5678, None, compute=False, graphics=True),
            vs.Process(42, MIB, graphics=True),
        ],
        supported_events=vs.EVENT_XID | vs.EVENT_DOUBLE_BIT_ECC,
        unsupported=set(),
        unsupported_fields=set(),
        pcie_tx_bytes=2**64 + 12_345,  # past the counter's width: it wraps, as the header allows
        pcie_rx_bytes=987_654_321_000,
        pcie_errors=[1000 + i for i in range(11)],
        pcie_l0_recovery=9,
        clock_event_ns=[11_000, 12_000, 13_000, 14_000, 15_000],
        power_instant_mw=598_765,
        fabric=vs.Fabric(
            state=vs.FABRIC_COMPLETED,
            status=0,
            clique_id=32766,
            cluster_uuid=bytes(range(16)),
            health_mask=0x2A,
            health_summary=1,
        ),
        gsp_firmware=(True, False),
    )


def test_every_value_round_trips_in_nvml_units(nvml: Worker, state: vs.StateWriter) -> None:
    g = distinctive()
    state.write([vs.h100(0), g])
    d = nvml.run("result = probe.dump(H['1'])")

    assert (d["name"], d["uuid"], d["serial"]) == (g.name, g.uuid, g.serial)
    assert (d["board_part_number"], d["vbios"], d["inforom_image"]) == (
        g.board_part_number,
        g.vbios_version,
        g.inforom_image_version,
    )
    assert (d["index"], d["minor_number"], d["brand"], d["architecture"], d["cuda_cc"]) == (1, 11, 2, 10, [10, 1])
    assert d["pci"] == {
        "busIdLegacy": "0001:42:03.0",
        "domain": 1,
        "bus": 0x42,
        "device": 3,
        "pciDeviceId": 0x23B010DE,
        "pciSubSystemId": 0x180010DE,
        "busId": "00000001:42:03.0",
    }
    assert (d["pci_ext"]["baseClass"], d["pci_ext"]["subClass"], d["pci_ext"]["busId"]) == (3, 0, "00000001:42:03.0")
    assert d["pcie"] == [4, 5, 8, 16, 17]
    assert d["pcie_throughput"] == [1_234_567, 2_345_678]  # KB/s

    free = 80 * GIB - 600 * MIB - 41 * GIB
    assert d["memory"] == {"total": 80 * GIB, "free": free, "used": 80 * GIB - free}
    assert d["memory_v2"] == {
        "version": 0x02000028,
        "total": 80 * GIB,
        "reserved": 600 * MIB,
        "free": free,
        "used": 41 * GIB,
    }
    assert d["bar1"] == {"bar1Total": 64 * GIB, "bar1Free": 64 * GIB - 3 * MIB, "bar1Used": 3 * MIB}
    assert d["utilization"] == {"gpu": 87, "memory": 43}
    assert (d["encoder"][0], d["decoder"][0]) == (5, 6)

    assert (d["power"], d["energy"]) == (612_345, 123_456_789_012)  # mW, mJ
    assert (d["enforced_limit"], d["limit"], d["default_limit"]) == (650_000, 660_000, 690_000)
    assert d["limit_constraints"] == [210_000, 710_000]
    assert (d["temperature"], d["temperature_v"]) == (71, 71)
    assert d["thresholds"] == [93, 90, 96, 88] + [NOT_SUPPORTED] * 4
    assert d["fan"] == 44

    assert d["clocks"] == g.clocks_mhz
    assert d["max_clocks"] == g.max_clocks_mhz
    by_id = [g.clocks_mhz, g.app_clocks_mhz, g.default_app_clocks_mhz, g.max_clocks_mhz]
    assert d["clock_ids"] == [[by_id[i][t] for i in range(4)] for t in range(4)]
    assert d["event_reasons"] == d["throttle_reasons"] == 0x24
    assert d["pstate"] == 2
    assert (d["compute_mode"], d["persistence_mode"], d["display_mode"], d["display_active"]) == (3, 0, 1, 0)

    assert d["ecc_mode"] == [1, 0]
    assert d["ecc_totals"] == [[12, 50], [1, 5]]  # [corrected, uncorrected][volatile, aggregate], all locations
    assert d["ecc_locations"][0][0][:3] == [0, 7, 5]  # L1, L2, device memory
    assert d["ecc_locations"][1][1][:3] == [0, 2, 3]
    assert d["remapped_rows"] == [4, 2, 1, 0]
    assert d["retired"] == [[0x1000, 0x2000], [0xABC000]]
    assert d["retired_v2"][0] == [
        {"address": 0x1000, "timestamp": 1_700_000_000},
        {"address": 0x2000, "timestamp": 1_700_000_100},
    ]
    assert d["retired_pending"] == 1
    assert (d["mig_mode"], d["max_mig"]) == ([0, 0], 0)
    assert d["supported_events"] == vs.EVENT_XID | vs.EVENT_DOUBLE_BIT_ECC

    no_instance = 0xFFFFFFFF
    assert d["compute_processes"] == [
        {"pid": 1234, "usedGpuMemory": 10 * GIB, "gpuInstanceId": no_instance, "computeInstanceId": no_instance},
        {"pid": 42, "usedGpuMemory": MIB, "gpuInstanceId": no_instance, "computeInstanceId": no_instance},
    ]
    assert [(p["pid"], p["usedGpuMemory"]) for p in d["graphics_processes"]] == [(5678, None), (42, MIB)]

    fields = {f["id"]: (f["ret"], f["type"], f["value"]) for f in d["fields"]}
    links = g.nvlinks
    assert fields == {
        1: (0, UINT, 1),
        2: (0, UINT, 0),
        3: (0, ULL, 12),
        4: (0, ULL, 1),
        5: (0, ULL, 50),
        6: (0, ULL, 5),
        11: (0, ULL, 5),
        21: (0, ULL, 2),
        29: (0, ULL, 2),
        30: (0, ULL, 1),
        31: (0, UINT, 1),
        82: (0, UINT, 83),
        83: (0, ULL, 123_456_789_012),
        91: (0, UINT, 12),
        90: (0, UINT, 25001),  # the speed of the first link that is up
        38: (0, ULL, sum(k.crc_flit_errors for k in links)),
        47: (0, ULL, links[1].replay_errors),
        115: (0, ULL, links[7].recovery_errors),
        94: (0, UINT, 17),
        142: (0, UINT, 4),
        143: (0, UINT, 2),
        144: (0, UINT, 1),
        145: (0, UINT, 0),
        185: (0, UINT, 612_345),  # the 1 s average, as nvmlDeviceGetPowerUsage
        186: (0, UINT, 598_765),  # the instant reading
        190: (0, UINT, 650_000),
        191: (0, ULL, 123_456_789_012),
        230: (0, UINT, 1),
        197: (0, ULL, 12_345),
        198: (0, ULL, 987_654_321_000),
        169: (0, UINT, 9),
        173: (0, ULL, 1000),
        183: (0, ULL, 1010),
        74: (0, ULL, 11_000),  # ns
        76: (0, ULL, 12_000),
        269: (0, ULL, 13_000),
        270: (0, ULL, 14_000),
        271: (0, ULL, 15_000),
    }
    assert d["fabric"] == {
        "state": 3,
        "status": 0,
        "clique": 32766,
        "uuid": bytes(range(16)).hex(),
        "health_mask": 0x2A,
        "summary": 1,
    }
    assert d["gsp"] == [1, 0]


def test_every_link_round_trips_and_blackwell_answers_the_nvlink5_counters_instead(
    nvml: Worker, state: vs.StateWriter
) -> None:
    g = distinctive()
    assert g.architecture == vs.ARCH_BLACKWELL
    hopper = distinctive()
    hopper.architecture = vs.ARCH_HOPPER
    state.write([g, hopper])
    got, older = nvml.run("result = [probe.links(H['0'], 12), probe.links(H['1'], 12)]")
    for k, link, hop in zip(g.nvlinks, got, older, strict=True):
        # nvml.h on 161-163: "This is unsupported for Blackwell+. Please use NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*"
        assert [(f["ret"], f["value"]) for f in link["fields"][2:5]] == [(3, None)] * 3
        assert [(f["ret"], f["value"]) for f in link["fields"][9:]] == [
            (0, k.recovery_successful),
            (0, k.recovery_failed),
            (0, k.recovery_events),
            (0, k.effective_errors),
            (0, k.symbol_errors),
        ]
        assert [(f["ret"], f["value"]) for f in hop["fields"][2:5]] == [
            (0, k.replay_errors),
            (0, k.recovery_errors),
            (0, k.crc_flit_errors),
        ]
        assert [f["ret"] for f in hop["fields"][9:]] == [3] * 5  # NVLink5 counters: not before Blackwell
    for k, link in zip(g.nvlinks, older, strict=True):
        assert link["counters"] == [
            k.replay_errors,
            k.recovery_errors,
            k.crc_flit_errors,
            k.crc_data_errors,
            k.ecc_data_errors,
        ]
        assert link["state"] == (0 if k.state == vs.NVLINK_INACTIVE else 1)
        assert link["version"] == 7
        assert [(f["ret"], f["value"]) for f in link["fields"][:9]] == [
            (0, k.state),
            (0, k.speed_mbps),
            (0, k.replay_errors),
            (0, k.recovery_errors),
            (0, k.crc_flit_errors),
            (0, k.data_tx_kib),
            (0, k.data_rx_kib),
            (0, k.raw_tx_kib),
            (0, k.raw_rx_kib),
        ]
    assert [link["fields"][0]["value"] for link in got[:4]] == [0, 1, 2, 3]  # inactive, active, sleep, no traffic


# Where each query kind shows in probe.dump(), so that a Query added without a test fails here.
REFUSED_BY: dict[vs.Query, list[str]] = {
    vs.Query.UTILIZATION: ["utilization"],
    vs.Query.MEMORY: ["memory", "memory_v2"],
    vs.Query.BAR1: ["bar1"],
    vs.Query.POWER_USAGE: ["power"],
    vs.Query.ENERGY: ["energy"],
    vs.Query.POWER_LIMIT: ["enforced_limit", "limit", "limit_constraints", "default_limit"],
    vs.Query.TEMPERATURE: ["temperature", "temperature_v"],
    vs.Query.TEMPERATURE_THRESHOLD: ["thresholds.0"],
    vs.Query.CLOCKS: ["clocks.0", "max_clocks.1"],
    vs.Query.CLOCK_EVENT_REASONS: ["event_reasons", "throttle_reasons"],
    vs.Query.PERFORMANCE_STATE: ["pstate"],
    vs.Query.PCIE_THROUGHPUT: ["pcie_throughput.0"],
    vs.Query.PCIE_LINK: ["pcie.0", "pcie.3"],
    vs.Query.PCIE_REPLAY: ["pcie.4"],
    vs.Query.ECC: ["ecc_mode", "ecc_totals.0.0"],
    vs.Query.REMAPPED_ROWS: ["remapped_rows"],
    vs.Query.RETIRED_PAGES: ["retired.0", "retired_pending"],
    vs.Query.FAN_SPEED: ["fan"],
    vs.Query.COMPUTE_MODE: ["compute_mode"],
    vs.Query.PERSISTENCE_MODE: ["persistence_mode"],
    vs.Query.DISPLAY: ["display_mode", "display_active"],
    vs.Query.PROCESSES: ["compute_processes", "graphics_processes"],
    vs.Query.MIG: ["mig_mode"],
    vs.Query.FIELD_VALUES: ["fields"],
    vs.Query.SERIAL: ["serial"],
    vs.Query.BOARD_PART_NUMBER: ["board_part_number"],
    vs.Query.VBIOS_VERSION: ["vbios"],
    vs.Query.INFOROM_VERSION: ["inforom_image"],
    vs.Query.ENCODER_DECODER: ["encoder", "decoder"],
    vs.Query.FABRIC: ["fabric"],
    vs.Query.GSP_FIRMWARE: ["gsp"],
}


def at(dump: dict[str, Any], path: str) -> Any:
    value: Any = dump
    for part in path.split("."):
        value = value[int(part)] if part.isdigit() else value[part]
    return value


def test_each_query_kind_can_be_refused_as_not_supported(nvml: Worker, state: vs.StateWriter) -> None:
    refusing = distinctive()
    refusing.unsupported = set(vs.Query)
    state.write([distinctive(), refusing])
    full, refused = nvml.run("result = [probe.dump(H['0']), probe.dump(H['1'])]")
    for query, paths in REFUSED_BY.items():
        for path in paths:
            assert at(refused, path) == NOT_SUPPORTED, (query, path)
            assert at(full, path) != NOT_SUPPORTED, (query, path)
    # What answers with an empty value instead of an error, as the header documents.
    assert (refused["supported_events"], full["supported_events"]) == (0, vs.EVENT_XID | vs.EVENT_DOUBLE_BIT_ECC)
    assert (refused["gpm_supported"], full["gpm_supported"]) == (0, 1)
    assert nvml.error("nvmlDeviceGetNvLinkState", H(1), 0) == 3
    assert nvml.call("nvmlDeviceGetNvLinkState", H(0), 1) == 1
    # MIG profiles need MIG mode on: test_vgpu_mig_gpm.py refuses them.
    untested = set(vs.Query) - set(REFUSED_BY) - {vs.Query.EVENTS, vs.Query.GPM, vs.Query.NVLINK, vs.Query.MIG_PROFILES}
    assert not untested
    assert refused["name"] == full["name"]  # identity is always there


def test_ecc_counters_need_ecc_enabled(nvml: Worker, state: vs.StateWriter) -> None:
    g = distinctive()
    g.ecc_mode = False
    state.write([g])
    d = nvml.run("result = probe.dump(H['0'])")
    assert d["ecc_mode"] == [0, 0]
    assert d["ecc_totals"] == [[NOT_SUPPORTED] * 2] * 2
    assert [f["ret"] for f in d["fields"][:4]] == [0, 0, 3, 3]  # the modes answer, the counters do not


def test_processes_answer_insufficient_size_to_a_short_buffer(nvml: Worker, state: vs.StateWriter) -> None:
    state.write([distinctive()])
    got = nvml.run(
        "fn = n._nvmlGetFunctionPointer('nvmlDeviceGetComputeRunningProcesses_v3')\n"
        "count = ctypes.c_uint(1)\n"
        "buf = (n.c_nvmlProcessInfo_v3_t * 1)()\n"
        "short = fn(H['0'], ctypes.byref(count), buf)\n"
        "result = [short, count.value]"
    )
    assert got == [7, 2]  # NVML_ERROR_INSUFFICIENT_SIZE, and the count needed
