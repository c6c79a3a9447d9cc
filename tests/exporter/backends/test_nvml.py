"""The NVML backend where the virtual GPU (tests/vgpu) cannot go: pynvml's device functions substituted.

Each test here needs an NVML behaviour the C library cannot be made to show: an error code from one
particular call, nvmlDeviceGetIndex failing, an event wait failing on its own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpu_triage.exporter.backends.base import BackendError, GpuLostError
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.nvml import field_values as nvml_fields
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.backends.nvml.field_values import field_number
from gpu_triage.exporter.backends.readings import ClockDomain
from gpu_triage.exporter.backends.select import open_backend
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend
from tests.conftest import FakeClock
from tests.nvml_fake import FakeNvml
from tests.nvml_gpm_fake import FakeGpmMig


@pytest.fixture
def fake(sim: SimBackend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    clock.advance(400)  # well into the training phase
    f = FakeNvml(sim)
    f.install(monkeypatch)
    FakeGpmMig(f).install(monkeypatch)  # GPM and MIG: tests/nvml_gpm_fake.py
    return f


@pytest.fixture
def nvml(fake: FakeNvml) -> Iterator[NvmlBackend]:
    backend = NvmlBackend()
    backend.discover()
    yield backend
    backend.close()


def test_no_permission_is_absent_but_warned_once(
    fake: FakeNvml, nvml: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    fake.errors[("nvmlDeviceGetComputeRunningProcesses", None)] = pynvml.NVML_ERROR_NO_PERMISSION
    for _ in range(2):
        assert nvml.read(nvml.discover()[0], Collector.PROCESSES).failed_fields == ()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and getattr(r, "field", "") == "processes"]
    assert len(warnings) == 1


def test_other_errors_fail_the_field_not_the_gpu(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.errors[("nvmlDeviceGetPowerUsage", 2)] = pynvml.NVML_ERROR_UNKNOWN
    result = nvml.read(nvml.discover()[2], Collector.POWER)
    assert result.failed_fields == ("power_usage",)
    assert result.reading.usage_watts is None and result.reading.limit_watts == 700.0  # type: ignore[union-attr]
    assert nvml.read(nvml.discover()[1], Collector.POWER).failed_fields == ()


def test_reset_required_is_lost(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.errors[("nvmlDeviceGetClockInfo", 4)] = pynvml.NVML_ERROR_RESET_REQUIRED
    with pytest.raises(GpuLostError):
        nvml.read(nvml.discover()[4], Collector.CLOCKS)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, pynvml.NVML_ERROR_UNINITIALIZED])
def test_broken_library_is_a_backend_error(fake: FakeNvml, nvml: NvmlBackend, code: int) -> None:
    fake.errors[("nvmlDeviceGetUtilizationRates", None)] = code
    with pytest.raises(BackendError):
        nvml.read(nvml.discover()[0], Collector.UTILIZATION)


def test_older_drivers_fall_back_to_the_legacy_calls(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.errors[("nvmlDeviceGetTemperatureV", None)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    fake.errors[("nvmlDeviceGetCurrentClocksEventReasons", None)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    gpu = nvml.discover()[0]
    thermal = nvml.read(gpu, Collector.THERMAL)
    assert thermal.failed_fields == () and thermal.reading.gpu_celsius is not None  # type: ignore[union-attr]
    clocks = nvml.read(gpu, Collector.CLOCKS)
    assert clocks.failed_fields == () and clocks.reading.event_reasons == 0  # type: ignore[union-attr]


def test_xid_event_wait_survives_a_lost_driver(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.errors[("nvmlEventSetWait_v2", None)] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(BackendError, match="GpuIsLost"):  # the caller backs off and marks the source down
        nvml.wait_xids(0.1)
    del fake.errors[("nvmlEventSetWait_v2", None)]
    fake.events.put((1, 48))
    assert [(e.gpu, e.code) for e in nvml.wait_xids(1.0)] == [(1, 48)]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML was not found"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_init_errors_tell_the_user_what_to_do(
    sim: SimBackend, monkeypatch: pytest.MonkeyPatch, code: int, message: str
) -> None:
    FakeNvml(sim, init_error=code).install(monkeypatch)
    with pytest.raises(BackendError, match=message):
        open_backend("auto")
    with pytest.raises(BackendError, match=message):
        open_backend("nvml")


def test_this_machine_without_a_driver() -> None:
    """No substitution at all: the real pynvml on a machine without the NVIDIA driver."""
    try:
        NvmlBackend().close()
    except BackendError as e:
        assert "--backend sim" in str(e)
    else:
        pytest.skip("this machine has a working NVIDIA driver")


@pytest.mark.parametrize(
    ("primary", "code"),
    [
        ("nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
        ("nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVML_ERROR_UNKNOWN),
    ],
)
def test_a_legacy_call_that_stands_in_for_a_failed_one_is_a_success(
    fake: FakeNvml, nvml: NvmlBackend, primary: str, code: int
) -> None:
    fake.errors[(primary, None)] = code
    gpu = nvml.discover()[0]
    for collector in (Collector.THERMAL, Collector.CLOCKS):
        result = nvml.read(gpu, collector)
        assert result.failed_fields == (), collector


def test_invalid_argument_from_a_gpu_whose_handle_answers_is_an_absent_value(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.errors[("nvmlDeviceGetMaxClockInfo", 1)] = pynvml.NVML_ERROR_INVALID_ARGUMENT
    result = nvml.read(nvml.discover()[1], Collector.CLOCKS)
    assert result.failed_fields == () and result.reading.max_hz == {}  # type: ignore[union-attr]
    fake.errors[("nvmlDeviceGetUUID", 1)] = pynvml.NVML_ERROR_INVALID_ARGUMENT  # now the handle itself is bad
    fresh = NvmlBackend()  # which asks for the maxima at its first read (they are kept a while: nvml/kept.py)
    try:
        with pytest.raises(GpuLostError, match="no longer valid"):
            fresh.read(fresh.discover()[1], Collector.CLOCKS)
    finally:
        fresh.close()


def test_a_failed_maximum_clock_is_reported_failed_and_asked_again_at_the_next_read(
    fake: FakeNvml, nvml: NvmlBackend
) -> None:
    gpu = nvml.discover()[2]
    fake.errors[("nvmlDeviceGetMaxClockInfo", 2)] = pynvml.NVML_ERROR_UNKNOWN
    failed = nvml.read(gpu, Collector.CLOCKS)
    assert failed.failed_fields == tuple(f"max_clock_{d}" for d in ClockDomain)
    assert failed.reading.max_hz == {}  # type: ignore[union-attr]
    del fake.errors[("nvmlDeviceGetMaxClockInfo", 2)]
    answered = nvml.read(gpu, Collector.CLOCKS)  # not kept: asked again
    assert answered.failed_fields == () and set(answered.reading.max_hz) == set(ClockDomain)  # type: ignore[union-attr]
    fake.errors[("nvmlDeviceGetMaxClockInfo", 2)] = pynvml.NVML_ERROR_UNKNOWN
    kept = nvml.read(gpu, Collector.CLOCKS)  # kept now (nvml/kept.py): the call is not made
    assert kept.failed_fields == () and kept.reading.max_hz == answered.reading.max_hz  # type: ignore[union-attr]


def test_an_xid_names_its_gpu_even_when_nvml_cannot_index_it(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.errors[("nvmlDeviceGetIndex", 3)] = pynvml.NVML_ERROR_GPU_IS_LOST
    fake.events.put((3, 79))
    assert [(e.gpu, e.code) for e in nvml.wait_xids(1.0)] == [(3, 79)]


def fake_proc(root: Path, namespace: int, processes: dict[int, str]) -> Path:
    (root / "self" / "ns").mkdir(parents=True, exist_ok=True)
    link = root / "self" / "ns" / "pid"
    link.unlink(missing_ok=True)
    link.symlink_to(f"pid:[{namespace}]")
    for pid, comm in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 ...\n")
    return root


HOST_PID_NAMESPACE = 0xEFFFFFFC
TRAINER = 41000 + 17 * 2  # the simulator's process on GPU 2


def names(nvml: NvmlBackend) -> list[str | None]:
    return [p.name for p in nvml.read(nvml.discover()[2], Collector.PROCESSES).reading.processes]  # type: ignore[union-attr]


def test_process_names_follow_a_reused_pid(fake: FakeNvml, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, HOST_PID_NAMESPACE, {TRAINER: "python3"})
    backend = NvmlBackend(proc=proc)
    assert names(backend) == ["python3"]
    fake_proc(proc, HOST_PID_NAMESPACE, {TRAINER: "torchrun (rank 3)"})  # the PID went to another process
    assert names(backend) == ["torchrun (rank 3)"]
    backend.close()


def test_no_process_names_outside_the_host_pid_namespace(fake: FakeNvml, tmp_path: Path) -> None:
    # In a container's own PID namespace, /proc/<an NVML PID> is some unrelated process.
    backend = NvmlBackend(proc=fake_proc(tmp_path, 4026532761, {TRAINER: "sshd"}))
    assert names(backend) == [None]
    backend.close()


@pytest.mark.parametrize("value_type", range(7))  # nvmlValueType_t: double .. unsigned short
def test_a_field_value_is_read_by_its_type(fake: FakeNvml, nvml: NvmlBackend, value_type: int) -> None:
    fake.value_types[pynvml.NVML_FI_DEV_MEMORY_TEMP] = value_type
    thermal = nvml.read(nvml.discover()[0], Collector.THERMAL).reading
    truth = fake.sim.read(fake.sim.discover()[0], Collector.THERMAL).reading
    assert thermal.memory_celsius == truth.memory_celsius  # type: ignore[union-attr]


def test_a_link_state_and_a_link_error_come_through_per_link(fake: FakeNvml, nvml: NvmlBackend) -> None:
    fake.sim.inject(FaultSpec(gpu=1, kind="nvlink_down", link=3))
    fake.field_errors[(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 9)] = pynvml.NVML_ERROR_UNKNOWN
    result = nvml.read(nvml.discover()[1], Collector.NVLINK)
    links = result.reading.links  # type: ignore[union-attr]
    assert [k.state for k in links[2:5]] == [1, 0, 1]
    assert result.failed_fields == (f"nvlink_9_{pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY}",)
    assert links[9].replay_errors is None and links[8].replay_errors == 0


@pytest.mark.parametrize(
    ("value_type", "member", "value"),
    [
        (pynvml.NVML_VALUE_TYPE_DOUBLE, "dVal", -1234.5625),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 0xFFFFFFFF),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**40 + 7),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**64 - 1),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**63)),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -5),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 0xFFFF),
        (99, "ullVal", 2**53),  # a type newer than this code: read as ullVal, as field_number reads it
    ],
)
def test_field_values_decoded_in_bulk_are_what_pynvml_structures_hold(
    value_type: int, member: str, value: float
) -> None:
    values = (pynvml.c_nvmlFieldValue_t * 3)()
    for fv in values:
        fv.valueType, fv.nvmlReturn = value_type, pynvml.NVML_SUCCESS
        fv.value.ullVal = 0xA5A5A5A5A5A5A5A5  # bytes the narrower members do not cover must not leak in
        setattr(fv.value, member, value)
    values[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    codes, numbers, doubles, answered_all = nvml_fields.decode(bytes(values))
    assert codes == (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_SUCCESS)
    assert numbers == [field_number(values[0]), None, field_number(values[2])]
    assert [type(n) for n in numbers[::2]] == [float if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE else int] * 2
    assert doubles == ((0, 2) if value_type == pynvml.NVML_VALUE_TYPE_DOUBLE else ()) and not answered_all
    values[1].nvmlReturn = pynvml.NVML_SUCCESS  # every field answered: the values as they are
    assert nvml_fields.decode(bytes(values)).numbers == [field_number(fv) for fv in values]


def test_field_values_of_every_type_in_one_answer_are_each_read_as_their_own_type() -> None:
    members = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: ("dVal", -0.5),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: ("uiVal", 0xFFFFFFFE),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: ("ulVal", 2**40 + 7),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: ("ullVal", 2**63 + 2**12),
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: ("sllVal", -(2**40)),
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: ("siVal", -7),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: ("usVal", 0xFFFE),
    }
    kinds = [*members, *reversed(members)]  # each type next to different neighbours
    values = (pynvml.c_nvmlFieldValue_t * len(kinds))()
    for fv, kind in zip(values, kinds, strict=True):
        fv.valueType, fv.nvmlReturn = kind, pynvml.NVML_SUCCESS
        fv.value.ullVal = 0x5A5A5A5A5A5A5A5A
        setattr(fv.value, *members[kind])
    decoded = nvml_fields.decode(bytes(values)).numbers
    assert decoded == [field_number(fv) for fv in values]
    assert decoded[: len(members)] == [value for _, value in members.values()]


def test_an_answer_of_one_field_is_decoded_whether_it_answered_or_not() -> None:
    values = (pynvml.c_nvmlFieldValue_t * 1)()
    values[0].valueType, values[0].value.uiVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 7
    assert nvml_fields.decode(bytes(values)) == ((pynvml.NVML_SUCCESS,), [7], (), True)
    values[0].nvmlReturn = pynvml.NVML_ERROR_UNKNOWN
    assert nvml_fields.decode(bytes(values)) == ((pynvml.NVML_ERROR_UNKNOWN,), [None], (), False)


def test_a_request_whose_answer_changes_its_codes_is_decoded_by_the_new_ones() -> None:
    """A request tries its last answer's layout first: it must not be taken for an answer that differs."""
    request = nvml_fields.FieldRequest([(91, 0), (138, 0)], ["nvlink_link_count", "nvlink_0_138"])
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    for fv, number in zip(values, (18, 2**40), strict=True):
        fv.valueType, fv.value.ullVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, number
    assert nvml_fields.decode(bytes(values), request).numbers == [18, 2**40]
    values[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml_fields.decode(bytes(values), request).numbers == [18, None]
    values[1].nvmlReturn, values[0].valueType = pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT
    values[0].value.ullVal = 0x10012
    assert nvml_fields.decode(bytes(values), request).numbers == [0x12, 2**40]
