"""MIG device handles, and GPM sample pairs turned into metrics."""

from __future__ import annotations

from tests.vgpu.conftest import H, Worker, vs

INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, VERSION_MISMATCH = 2, 3, 6, 25
GIB = 2**30
MEMORY_V2 = 0x02000028  # nvmlMemory_v2

SMALL = vs.MigInstance(
    gpu_instance_id=9,
    compute_instance_id=0,
    name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    uuid="MIG-4f1c6a7e-2f5d-5a8b-9c1e-0d2b3a4c5d6e",
    memory_total=10 * GIB,
    memory_reserved=GIB // 4,
    memory_used=3 * GIB,
    gpm={2: 11.5, 5: 7.25},
)
LARGE = vs.MigInstance(
    gpu_instance_id=2,
    compute_instance_id=1,
    name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    uuid="MIG-8a9b0c1d-2e3f-5a4b-8c7d-6e5f4a3b2c1d",
    memory_total=40 * GIB,
    memory_used=20 * GIB,
)


def mig_node() -> list[vs.Gpu]:
    node = vs.h100_node()
    g = node[0]
    g.mig_mode = g.mig_mode_pending = True
    g.mig_instances = [SMALL, LARGE]
    g.processes = [
        vs.Process(100, GIB, gpu_instance_id=9, compute_instance_id=0),
        vs.Process(200, 2 * GIB, gpu_instance_id=2, compute_instance_id=1),
    ]
    return node


def test_mig_devices_of_a_gpu_in_mig_mode(nvml: Worker, state: vs.StateWriter) -> None:
    state.write(mig_node())
    assert nvml.call("nvmlDeviceGetMigMode", H(0)) == [1, 1]
    assert (nvml.call("nvmlDeviceGetMaxMigDeviceCount", H(0)), nvml.call("nvmlDeviceGetMaxMigDeviceCount", H(1))) == (
        7,
        0,
    )
    nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 0, save="small")
    nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 1, save="large")
    assert nvml.error("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 2) == NOT_FOUND  # a free slot
    assert nvml.error("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 7) == INVALID_ARGUMENT  # beyond the maximum
    assert nvml.error("nvmlDeviceGetMigDeviceHandleByIndex", H(1), 0) == INVALID_ARGUMENT  # MIG is off there
    assert nvml.error("nvmlDeviceGetMigDeviceHandleByIndex", H("small"), 0) == INVALID_ARGUMENT

    assert [nvml.call("nvmlDeviceIsMigDeviceHandle", H(h)) for h in ("small", 0)] == [1, 0]
    assert nvml.call("nvmlDeviceGetGpuInstanceId", H("small")) == 9
    assert nvml.call("nvmlDeviceGetComputeInstanceId", H("large")) == 1
    assert nvml.error("nvmlDeviceGetGpuInstanceId", H(0)) == NOT_SUPPORTED
    parent = nvml.call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", H("large"))
    assert parent == nvml.call("nvmlDeviceGetHandleByIndex", 0)
    assert nvml.error("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", H(0)) == INVALID_ARGUMENT

    assert nvml.call("nvmlDeviceGetName", H("small")) == SMALL.name
    assert nvml.call("nvmlDeviceGetUUID", H("large")) == LARGE.uuid
    by_uuid = nvml.call("nvmlDeviceGetHandleByUUID", SMALL.uuid)
    assert by_uuid == nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 0)
    memory = nvml.call("nvmlDeviceGetMemoryInfo", H("small"), MEMORY_V2)
    assert memory == {
        "version": MEMORY_V2,
        "total": 10 * GIB,
        "reserved": GIB // 4,
        "free": 10 * GIB - GIB // 4 - 3 * GIB,
        "used": 3 * GIB,
    }
    assert nvml.call("nvmlDeviceGetMemoryInfo", H("large"))["used"] == 20 * GIB
    assert [p["pid"] for p in nvml.call("nvmlDeviceGetComputeRunningProcesses", H("large"))] == [200]
    assert [p["pid"] for p in nvml.call("nvmlDeviceGetComputeRunningProcesses", H(0))] == [100, 200]
    assert nvml.error("nvmlDeviceGetPowerUsage", H("small")) == NOT_SUPPORTED  # a whole-GPU query
    assert nvml.error("nvmlDeviceGetRemappedRows", H(0)) == NOT_SUPPORTED  # not with MIG instances active


def test_a_mig_handle_dies_with_its_instance_and_with_its_gpu(nvml: Worker, state: vs.StateWriter) -> None:
    node = mig_node()
    state.write(node)
    nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 1, save="large")
    node[0].lost = True
    state.write(node)
    assert nvml.error("nvmlDeviceGetMemoryInfo", H("large")) == 15  # the parent's faults apply
    node[0].lost = False
    node[0].mig_instances = [SMALL]
    state.write(node)
    assert nvml.error("nvmlDeviceGetMemoryInfo", H("large")) == INVALID_ARGUMENT
    node[0].mig_instances = [SMALL, LARGE]
    state.write(node)
    assert nvml.call("nvmlDeviceGetMemoryInfo", H("large"))["total"] == 40 * GIB


METRICS = [1, 2, 3, 5, 10, 11, 12, 13, 20, 21, 60, 61, 62]  # gr, SM, occupancy, tensor, DRAM, FP64/32/16, PCIe, NVLink


def gpm_values(base: float) -> dict[int, float]:
    return {m: base + m / 4 for m in METRICS}


def metrics(nvml: Worker, ids: list[int], first: str = "s1", second: str = "s2") -> list[dict[str, object]]:
    return list(
        nvml.run(
            "mg = n.c_nvmlGpmMetricsGet_t()\n"
            "mg.version = n.NVML_GPM_METRICS_GET_VERSION\n"
            f"ids = {ids!r}\n"
            "mg.numMetrics = len(ids)\n"
            f"mg.sample1, mg.sample2 = H['{first}'], H['{second}']\n"
            "for i, m in enumerate(ids): mg.metrics[i].metricId = m\n"
            "n.nvmlGpmMetricsGet(mg)\n"
            "result = [{'id': m.metricId, 'ret': m.nvmlReturn, 'value': m.value,\n"
            "           'name': m.metricInfo.shortName, 'unit': m.metricInfo.unit} for m in mg.metrics[:len(ids)]]"
        )
    )


def test_a_gpm_sample_pair_gives_the_metrics_of_the_later_sample(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[0].gpm = gpm_values(10.0)
    state.write(node)
    assert nvml.run("result = n.nvmlGpmQueryDeviceSupport(H['0']).isSupportedDevice") == 1
    nvml.run("H['s1'] = n.nvmlGpmSampleAlloc()\nH['s2'] = n.nvmlGpmSampleAlloc()")
    nvml.call("nvmlGpmSampleGet", H(0), H("s1"))
    node[0].gpm = gpm_values(40.0)
    state.write(node)
    nvml.call("nvmlGpmSampleGet", H(0), H("s2"))

    got = metrics(nvml, [*METRICS, 99, 400])
    assert [(m["id"], m["ret"], m["value"]) for m in got[: len(METRICS)]] == [(m, 0, 40.0 + m / 4) for m in METRICS]
    assert (got[-2]["ret"], got[-1]["ret"]) == (NOT_SUPPORTED, INVALID_ARGUMENT)  # not reported; no such id
    assert (got[1]["name"], got[1]["unit"]) == ("sm_util", "%")
    assert got[10]["unit"] == "MiB/sec"

    reversed_pair = nvml.run(
        "mg = n.c_nvmlGpmMetricsGet_t(); mg.version = 1; mg.numMetrics = 1\n"
        "mg.sample1, mg.sample2 = H['s2'], H['s1']\n"
        "result = n._nvmlGetFunctionPointer('nvmlGpmMetricsGet')(ctypes.byref(mg))"
    )
    assert reversed_pair == INVALID_ARGUMENT  # sample2 must be the later one


def test_gpm_samples_of_a_mig_instance(nvml: Worker, state: vs.StateWriter) -> None:
    state.write(mig_node())
    nvml.run("H['s1'] = n.nvmlGpmSampleAlloc()\nH['s2'] = n.nvmlGpmSampleAlloc()")
    nvml.call("nvmlGpmMigSampleGet", H(0), 9, H("s1"))
    nvml.call("nvmlGpmMigSampleGet", H(0), 9, H("s2"))
    got = metrics(nvml, [2, 5, 10])
    assert [(m["ret"], m["value"]) for m in got] == [(0, 11.5), (0, 7.25), (NOT_SUPPORTED, 0.0)]
    assert nvml.error("nvmlGpmMigSampleGet", H(0), 4, H("s1")) == INVALID_ARGUMENT  # no GPU instance 4
    nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(0), 0, save="small")
    nvml.call("nvmlGpmSampleGet", H("small"), H("s2"))  # a MIG device handle samples its instance too
    nvml.call("nvmlGpmSampleGet", H(0), H("s1"))
    assert (
        nvml.run(
            "mg = n.c_nvmlGpmMetricsGet_t(); mg.version = 1; mg.numMetrics = 1\n"
            "mg.sample1, mg.sample2 = H['s2'], H['s1']\n"
            "result = n._nvmlGetFunctionPointer('nvmlGpmMetricsGet')(ctypes.byref(mg))"
        )
        == INVALID_ARGUMENT
    )  # samples of two different devices


def test_gpm_refused_and_freed(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[1].unsupported = {vs.Query.GPM}
    state.write(node)
    assert nvml.run("result = n.nvmlGpmQueryDeviceSupport(H['1']).isSupportedDevice") == 0
    nvml.run("H['s1'] = n.nvmlGpmSampleAlloc()")
    assert nvml.error("nvmlGpmSampleGet", H(1), H("s1")) == NOT_SUPPORTED
    nvml.call("nvmlGpmSampleFree", H("s1"))
    assert nvml.error("nvmlGpmSampleGet", H(0), H("s1")) == INVALID_ARGUMENT
    assert nvml.error("nvmlGpmSampleFree", H("s1")) == INVALID_ARGUMENT


OTHER = vs.MigInstance(
    gpu_instance_id=5,
    compute_instance_id=0,
    name="NVIDIA H100 80GB HBM3 MIG 2g.20gb",
    uuid="MIG-0b5e7c2d-9a4f-5e1b-8d3c-7f6a5b4c3d2e",
    memory_total=20 * GIB,
    memory_used=5 * GIB,
)


def test_the_backend_lists_mig_devices_once_per_poll_and_sees_a_new_layout_at_the_next(
    nvml: Worker, state: vs.StateWriter
) -> None:
    node = mig_node()
    state.write(node)
    # Each listing asks for the slot count once: counting that call counts the listings.
    nvml.run(
        "ops.start()\n"
        "H['listings'] = listings = []\n"
        "slots = n.nvmlDeviceGetMaxMigDeviceCount\n"
        "n.nvmlDeviceGetMaxMigDeviceCount = lambda h: listings.append(1) or slots(h)"
    )

    def poll() -> tuple[list[str], list[tuple[int, str]], list[str]]:
        """One poll's reads of GPU 0 that need its MIG devices: the devices each of them saw."""
        memory = nvml.run("result = ops.read(0, 'memory')")["reading"]
        processes = nvml.run("result = ops.read(0, 'processes')")["reading"]
        return (
            [m["instance"]["uuid"] for m in memory["instances"]],
            sorted((p["pid"], p["instance"]["uuid"]) for p in processes["processes"]),
            [i["uuid"] for i in processes["instances"]],
        )

    assert poll() == ([SMALL.uuid, LARGE.uuid], [(100, SMALL.uuid), (200, LARGE.uuid)], [SMALL.uuid, LARGE.uuid])
    assert nvml.run("result = len(H['listings'])") == 1
    # LARGE destroyed and another instance created in its slot: its handle now names the new one.
    node[0].mig_instances = [SMALL, OTHER]
    node[0].processes = [
        vs.Process(100, GIB, gpu_instance_id=9, compute_instance_id=0),
        vs.Process(300, GIB, gpu_instance_id=5, compute_instance_id=0),
    ]
    state.write(node)
    assert poll() == ([SMALL.uuid, OTHER.uuid], [(100, SMALL.uuid), (300, OTHER.uuid)], [SMALL.uuid, OTHER.uuid])
    assert nvml.run("result = len(H['listings'])") == 2
