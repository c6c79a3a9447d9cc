"""MIG as real H200, B200 and A100 parts answer: profile names, memory, privileges and resets.

The profile rows are `nvidia-smi mig -lgip` as NVIDIA's own repositories quote it (H200:
NVIDIA/mig-parted#120; B200: NVIDIA/mig-parted#166): an H200's 1g.18gb has 16.00 GiB, a B200's
1g.23gb 22.00 GiB, so no rounding of a device's memory gives NVIDIA's name.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_triage.exporter.backends.nvml.mig import MIG_AGGREGATES
from tests.vgpu.conftest import H, Worker, vs

GIB, MIB = 2**30, 2**20
INVALID_ARGUMENT, NO_PERMISSION = 2, 4

# (profile index, id, name, slices, MiB, SMs): the H200's, as -lgip lists them.
H200 = [(0, 19, "1g.18gb", 1, 16384, 16), (9, 15, "1g.35gb", 1, 33024, 26), (1, 14, "2g.35gb", 2, 33024, 32),
        (2, 9, "3g.71gb", 3, 71168, 60), (3, 5, "4g.71gb", 4, 71168, 64)]  # fmt: skip
B200 = [(0, 19, "1g.23gb", 1, 22528, 18), (9, 15, "1g.45gb", 1, 45312, 30), (1, 14, "2g.45gb", 2, 45312, 36)]


def mig_gpu(index: int, table: list[tuple[int, int, str, int, int, int]], layout: list[str]) -> vs.Gpu:
    g = vs.h100(index)
    g.mig_mode = g.mig_mode_pending = True
    g.mig_profiles = [
        vs.MigProfile(profile=p, id=i, name=f"MIG {n}", slices=s, memory_mb=mb, multiprocessors=sm)
        for p, i, n, s, mb, sm in table
    ]
    rows = {n: (s, mb, sm) for _, _, n, s, mb, sm in table}
    g.mig_instances = []
    for gi, name in enumerate(layout, start=1):
        slices, mb, sms = rows[name]
        g.mig_instances.append(
            vs.MigInstance(
                gpu_instance_id=gi,
                compute_instance_id=0,
                name=f"MIG {name}",
                uuid=f"MIG-00000000-0000-4000-8000-{index:06d}{gi:06d}",
                memory_total=mb * MIB,
                memory_reserved=256 * MIB,  # in v1's "used", not in v2's
                memory_used=GIB * gi,
                gpu_instance_slices=slices,
                compute_instance_slices=slices,
                multiprocessors=sms,
                memory_mb=mb,
            )
        )
    return g


def node() -> list[vs.Gpu]:
    gpus = vs.h100_node()
    gpus[0] = mig_gpu(0, H200, ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"])
    gpus[1] = mig_gpu(1, B200, ["1g.23gb", "2g.45gb"])
    gpus[2] = mig_gpu(2, H200, ["1g.18gb"])
    gpus[2].unsupported.add(vs.Query.MIG_PROFILES)  # a driver without the profile table: the rule of thumb
    return gpus


def instances(nvml: Worker, gpu: int) -> list[dict[str, object]]:
    return nvml.run(f"result = ops.read({gpu}, 'memory')")["reading"]["instances"]


def test_profile_names_are_nvidias_from_the_profile_table(nvml: Worker, state: vs.StateWriter) -> None:
    state.write(node())
    nvml.run("ops.start()")
    assert [i["instance"]["profile"] for i in instances(nvml, 0)] == ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]
    assert [i["instance"]["profile"] for i in instances(nvml, 1)] == ["1g.23gb", "2g.45gb"]
    # Without the table, the device's 16 GiB rounded up: NVIDIA's name on A100 and H100, not here.
    assert [i["instance"]["profile"] for i in instances(nvml, 2)] == ["1g.16gb"]


def test_instance_memory_is_v2s_allocated_memory_not_v1s_reserved_plus_allocated(
    nvml: Worker, state: vs.StateWriter
) -> None:
    state.write(node())
    nvml.run("ops.start()")
    got = instances(nvml, 1)
    assert [(i["used_bytes"], i["total_bytes"]) for i in got] == [(GIB, 22528 * MIB), (2 * GIB, 45312 * MIB)]


def test_without_privileges_the_parents_totals_are_left_out_and_said_once(
    worker: Callable[..., Worker], state: vs.StateWriter
) -> None:
    state.write(node())
    nvml = worker(state.path, {"GPU_TRIAGE_VGPU_UNPRIVILEGED": "1"})
    nvml.init()
    assert nvml.error("nvmlDeviceGetMemoryInfo", H(0)) == NO_PERMISSION  # nvml.h: aggregates need privileges
    assert nvml.call("nvmlDeviceGetMemoryInfo", H(3))["total"] == 81559 * MIB  # not in MIG mode: no privilege needed
    nvml.run("ops.start()")
    for _ in range(3):
        memory = nvml.run("result = ops.read(0, 'memory')")
        assert memory["failed"] == [] and memory["reading"]["used_bytes"] is None
        assert len(memory["reading"]["instances"]) == 4  # each instance's own, through its handle
    said = [r for r in nvml.run("result = ops.logs()") if r.get("gpu") == 0 and r["level"] in ("INFO", "WARNING")]
    assert [(r["level"], r["msg"]) for r in said] == [("INFO", MIG_AGGREGATES)]


def test_mig_handles_from_before_a_reset_are_invalid_the_gpus_own_is_not(nvml: Worker, state: vs.StateWriter) -> None:
    gpus = node()
    state.write(gpus)
    nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(1), 0, save="before")
    assert nvml.call("nvmlDeviceGetGpuInstanceId", H("before")) == 1
    gpus[1].reset_generation += 1  # a reset completed (nvml.h: the GPU instance handle "would become invalid")
    state.write(gpus)
    assert nvml.error("nvmlDeviceGetGpuInstanceId", H("before")) == INVALID_ARGUMENT
    assert nvml.call("nvmlDeviceGetName", H(1)) == "NVIDIA H100 80GB HBM3"  # the device handle still works
    nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", H(1), 0, save="after")
    assert nvml.call("nvmlDeviceGetGpuInstanceId", H("after")) == 1
    # The backend lists MIG devices afresh each poll, so it never holds one across a reset.
    nvml.run("ops.start()")
    assert len(instances(nvml, 1)) == 2
    gpus[1].reset_generation += 1
    state.write(gpus)
    assert [i["instance"]["profile"] for i in instances(nvml, 1)] == ["1g.23gb", "2g.45gb"]
