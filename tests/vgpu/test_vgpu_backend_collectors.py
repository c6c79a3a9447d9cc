"""gpu-triage's NVML backend on the virtual GPU: the error policy (test_vgpu_oracle.py has the values)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.vgpu.conftest import Worker, vs


def test_not_supported_is_absent_and_logged_once(nvml: Worker) -> None:
    nvml.run("ops.start()")
    for _ in range(3):
        thermal = nvml.run("result = ops.read(0, 'thermal')")
        assert thermal["failed"] == [] and thermal["reading"]["fan_ratio"] is None  # SXM: no fan
    fan = [r for r in nvml.run("result = ops.logs()") if r.get("field") == "fan_speed"]
    assert [(r["level"], r["nvml"]) for r in fan] == [("DEBUG", "NotSupported")]


def test_batched_field_values_have_their_own_return_codes(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    recovery, pending = 230, 144  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_REMAPPED_PENDING
    node[0].field_overrides = [vs.FieldOverride(field_id=recovery, nvml_return=3)]  # NOT_SUPPORTED
    node[1].field_overrides = [vs.FieldOverride(field_id=recovery, nvml_return=999)]  # UNKNOWN
    node[2].field_overrides = [vs.FieldOverride(field_id=pending, nvml_return=15)]  # GPU_IS_LOST
    state.write(node)
    nvml.run("ops.start()")
    assert nvml.run("result = ops.read(0, 'recovery')")["reading"]["action"] is None
    assert nvml.run("result = ops.read(1, 'recovery')")["failed"] == ["recovery_action"]
    assert "GpuIsLost" in nvml.run("result = ops.read(2, 'remapping')")["lost"]


def test_a_field_that_was_absent_at_every_poll_and_then_fails_is_reported_failed(
    nvml: Worker, state: vs.StateWriter
) -> None:
    """An H100 answers the NVLink5 counters NOT_SUPPORTED at every poll, which is not looked at field by field
    again while the answer's codes stay the same: one code that changes is."""
    node = vs.h100_node()
    state.write(node)
    nvml.run("ops.start()")
    for _ in range(2):
        read = nvml.run("result = ops.read(6, 'nvlink')")
        assert read["failed"] == [] and read["reading"]["links"][3]["symbol_errors"] is None
    symbol = 221  # NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, scoped by link
    node[6].field_overrides = [vs.FieldOverride(field_id=symbol, scope_id=3, nvml_return=999)]  # UNKNOWN
    state.write(node)
    assert nvml.run("result = ops.read(6, 'nvlink')")["failed"] == [f"nvlink_3_{symbol}"]
    node[6].field_overrides = [vs.FieldOverride(field_id=symbol, scope_id=3, value=12)]
    state.write(node)
    read = nvml.run("result = ops.read(6, 'nvlink')")
    assert read["failed"] == [] and read["reading"]["links"][3]["symbol_errors"] == 12
    node[6].field_overrides = []
    state.write(node)
    read = nvml.run("result = ops.read(6, 'nvlink')")
    assert read["failed"] == [] and read["reading"]["links"][3]["symbol_errors"] is None


def test_a_failed_link_count_is_asked_again(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[4].field_overrides = [vs.FieldOverride(field_id=91, nvml_return=999)]  # NVLINK_LINK_COUNT: UNKNOWN
    state.write(node)
    nvml.run("ops.start()")
    first = nvml.run("result = ops.read(4, 'nvlink')")
    assert first == {"reading": {"links": []}, "failed": ["nvlink_link_count"]}
    node[4].field_overrides = []
    state.write(node)
    assert len(nvml.run("result = ops.read(4, 'nvlink')")["reading"]["links"]) == 18


def test_the_poller_over_nvml_isolates_a_lost_gpu(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[3].lost = True
    state.write(node)
    nvml.run("ops.start()")
    polled = nvml.run("result = ops.poll()")
    assert polled["status"] == ["up"] * 3 + ["lost"] + ["up"] * 4
    assert all(polled["success"].values())


def test_a_gpu_lost_before_start_reads_as_lost_and_is_found_again_when_it_answers(
    nvml: Worker, state: vs.StateWriter
) -> None:
    node = vs.h100_node()
    node[6].lost = True
    state.write(node)
    gpus = nvml.run("result = ops.start()")
    assert len(gpus) == 8 and gpus[6][1] == "unknown-6"
    assert "slow poll" in nvml.run("result = ops.read(6, 'power')")["lost"]
    node[6].lost = False
    state.write(node)
    # Nothing but its index is known of it: the slow poll looks it up by that.
    assert nvml.run("result = ops.read(6, 'inventory')")["reading"]["name"] == "NVIDIA H100 80GB HBM3"
    assert nvml.run("result = ops.read(6, 'power')")["reading"]["usage_watts"] == 72.0


def test_a_gpu_without_a_readable_uuid_is_looked_up_again_by_its_bus_id(nvml: Worker, state: vs.StateWriter) -> None:
    """pynvml has no nvmlDeviceGetHandleByPciBusId_v2: the lookup by bus id must use the name it has."""
    node = vs.h100_node()
    node[2].uuid = ""  # what discovery cannot use: the GPU is known by its bus id only
    state.write(node)
    gpus = nvml.run("result = ops.start()")
    assert gpus[2][1:] == ["unknown-2", "0000:3a:00.0"]
    node[2].invalid_handle = True  # an unbind and a rebind: the handle no longer names the GPU
    state.write(node)
    assert "no longer valid" in nvml.run("result = ops.read(2, 'power')")["lost"]
    node[2].invalid_handle = False
    state.write(node)
    assert nvml.run("result = ops.read(2, 'inventory')")["failed"] == []
    assert "looked up again" in str([r for r in nvml.run("result = ops.logs()") if r.get("gpu") == 2])
    assert nvml.run("result = ops.read(2, 'power')")["reading"]["usage_watts"] == 70.0


@pytest.mark.parametrize(
    ("state_of", "message"),
    [
        (lambda tmp: tmp / "missing", "not loaded"),  # no state file: the library says DRIVER_NOT_LOADED
        (lambda tmp: tmp / "garbage", "reboot the node"),  # another layout: LIB_RM_VERSION_MISMATCH
    ],
)
def test_init_errors_tell_the_user_what_to_do(
    worker: Callable[..., Worker], tmp_path: Path, state_of: Callable[[Path], Path], message: str
) -> None:
    (tmp_path / "garbage").write_bytes(b"GTVGPUST" + bytes(vs.FILE_SIZE))
    nvml = worker(state_of(tmp_path))
    assert message in nvml.run("result = ops.open_error()")


def test_field_values_read_through_plain_structures_are_what_pynvml_reads(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[0].field_overrides = [
        vs.FieldOverride(field_id=230, nvml_return=3),  # RECOVERY_ACTION: NOT_SUPPORTED
        # The types no GPU field of the library's own has, each answered by a field of the request.
        vs.FieldOverride(field_id=82, value=-2.75, value_type=vs.ValueType.DOUBLE),
        vs.FieldOverride(field_id=142, value=-(2**40), value_type=vs.ValueType.SIGNED_LONG_LONG),
        vs.FieldOverride(field_id=144, value=-3, value_type=vs.ValueType.SIGNED_INT),
        vs.FieldOverride(field_id=91, value=0xFFFE, value_type=vs.ValueType.UNSIGNED_SHORT),
        vs.FieldOverride(field_id=139, scope_id=3, value=2**40 + 1, value_type=vs.ValueType.UNSIGNED_LONG),
    ]
    state.write(node)
    nvml.init()
    # Power, memory temperature, ECC, remapping, NVLink link count and one link's counters, recovery action, and
    # ids no GPU has: every value type and several return codes.
    ids = [(186, 0), (82, 0), (3, 0), (4, 0), (142, 0), (144, 0), (91, 0), (138, 0), (139, 3), (230, 0), (99999, 0)]
    code = f"""
from gpu_triage.exporter.backends.nvml import field_values as f
request = f.FieldRequest({ids!r}, [str(i) for i in range({len(ids)})])
first = f.plain_field_values(H["0"], request)  # and again, through the layout the request keeps
result = [f.plain_field_values(H["0"], request), f.through_pynvml(H["0"], request), first,
          f.field_values() is f.plain_field_values]
"""
    plain, through_pynvml, first, fast = nvml.run(code)
    assert plain == through_pynvml == first
    assert set(plain[0]) >= {0, 3}, "answered and not-supported fields both compared"
    assert [plain[1][i] for i in (1, 4, 5, 6, 8)] == [-2.75, -(2**40), -3, 0xFFFE, 2**40 + 1]
    assert plain[2] == [1], "the double is known as one"
    assert fast, "pynvml's function is not substituted here: the plain structures are used"
