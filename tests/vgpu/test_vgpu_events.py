"""XID events: the writer's ring, as nvmlEventSetWait_v2 delivers it."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import pytest

from tests.vgpu.conftest import H, Worker, vs

TIMEOUT, GPU_IS_LOST, NOT_SUPPORTED, INVALID_ARGUMENT = 10, 15, 3, 2

REGISTER_ALL_FOR_XIDS = (
    "es = H['events'] = n.nvmlEventSetCreate()\n"
    "for i in range(8): n.nvmlDeviceRegisterEvents(H[str(i)], n.nvmlEventTypeXidCriticalError, es)"
)


def wait(nvml: Worker, timeout_ms: int) -> dict[str, object]:
    return dict(nvml.call("nvmlEventSetWait_v2", H("events"), timeout_ms))


def test_an_xid_wakes_a_waiting_caller_early(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run(REGISTER_ALL_FOR_XIDS)
    nvml.send({"call": "nvmlEventSetWait_v2", "args": [H("events"), 20_000]})
    with pytest.raises(queue.Empty):
        nvml.answer(timeout=0.2)  # nothing to deliver yet: the caller waits
    pushed = time.monotonic()
    state.push_xid(5, 79)
    reply = nvml.answer(timeout=10)
    assert time.monotonic() - pushed < 5  # woken by the event, far inside the 20 s timeout
    event = nvml.value(reply)
    assert (event["eventType"], event["eventData"]) == (vs.EVENT_XID, 79)
    assert event["device"] == nvml.call("nvmlDeviceGetHandleByIndex", 5)
    assert (event["gpuInstanceId"], event["computeInstanceId"]) == (vs.NO_INSTANCE, vs.NO_INSTANCE)
    assert nvml.error("nvmlEventSetWait_v2", H("events"), 0) == TIMEOUT  # delivered once


class _NoWake:
    """A writer that cannot wake the waiters (one on a machine whose futex(2) it cannot call)."""

    def wake(self) -> None:
        pass

    def release(self) -> None:
        pass


def test_an_xid_from_a_writer_that_does_not_wake_still_comes_within_a_second_or_so(
    nvml: Worker, state: vs.StateWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asleep on the futex the waiter wakes on its own only once a second (a quiet node costs nothing more), so
    an event that no wake announces is still delivered then, long before the caller's timeout."""
    nvml.run(REGISTER_ALL_FOR_XIDS)
    monkeypatch.setattr(state, "_waker", _NoWake())
    nvml.send({"call": "nvmlEventSetWait_v2", "args": [H("events"), 20_000]})
    with pytest.raises(queue.Empty):
        nvml.answer(timeout=0.2)
    pushed = time.monotonic()
    state.push_xid(3, 48)
    event = nvml.value(nvml.answer(timeout=10))
    assert time.monotonic() - pushed < 5, "seen at the waiter's own next look, not at the 20 s timeout"
    assert (event["eventType"], event["eventData"]) == (vs.EVENT_XID, 48)


def test_a_quiet_wait_lasts_its_whole_timeout_across_the_waiters_own_looks(nvml: Worker, state: vs.StateWriter) -> None:
    """nvml.h: the wait returns TIMEOUT when nothing came within timeoutms; sleeping in one-second pieces (and
    woken by each write that brings no event) must neither end it early nor stretch it."""
    nvml.run(REGISTER_ALL_FOR_XIDS)
    nvml.send({"call": "nvmlEventSetWait_v2", "args": [H("events"), 2500]})
    time.sleep(0.5)
    state.write(vs.h100_node())  # a write without an event: the waiter looks, finds nothing, sleeps on
    reply = nvml.answer(timeout=10)
    assert reply.get("nvml") == TIMEOUT and 2.4 <= float(reply["elapsed"]) < 4.0, reply


def test_a_zero_wait_times_out_at_once_and_queued_events_come_in_order(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run(REGISTER_ALL_FOR_XIDS)
    nvml.send({"call": "nvmlEventSetWait_v2", "args": [H("events"), 0]})
    reply = nvml.answer()
    assert (reply.get("nvml"), reply["elapsed"] < 0.1) == (TIMEOUT, True)
    state.push_xid(1, 48)
    state.push_xid(2, 31, gpu_instance_id=3, compute_instance_id=0)
    first, second = wait(nvml, 0), wait(nvml, 0)
    assert first["eventData"] == 48
    assert (second["eventData"], second["gpuInstanceId"], second["computeInstanceId"]) == (31, 3, 0)


def test_only_registered_gpus_and_types_after_registration_are_delivered(nvml: Worker, state: vs.StateWriter) -> None:
    state.push_xid(0, 13)  # before registration: the kernel log has it, NVML does not
    nvml.run(
        "es = H['events'] = n.nvmlEventSetCreate()\n"
        "n.nvmlDeviceRegisterEvents(H['0'], n.nvmlEventTypeXidCriticalError, es)"
    )
    state.push_event(0, vs.EVENT_PSTATE)  # a type not registered
    state.push_xid(1, 94)  # a GPU not registered
    state.push_xid(0, 63)
    assert wait(nvml, 1000)["eventData"] == 63
    assert nvml.error("nvmlEventSetWait_v2", H("events"), 0) == TIMEOUT


def test_registering_an_unsupported_type_registers_nothing(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run("H['events'] = n.nvmlEventSetCreate()")
    assert nvml.call("nvmlDeviceGetSupportedEventTypes", H(0)) & vs.EVENT_XID
    assert nvml.error("nvmlDeviceRegisterEvents", H(0), 0x10 | vs.EVENT_XID, H("events")) == NOT_SUPPORTED
    assert nvml.error("nvmlDeviceRegisterEvents", H(0), 1 << 40, H("events")) == INVALID_ARGUMENT
    state.push_xid(0, 79)
    assert nvml.error("nvmlEventSetWait_v2", H("events"), 0) == TIMEOUT


def test_a_lost_gpu_ends_the_wait_after_what_was_queued(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run(REGISTER_ALL_FOR_XIDS)
    node = vs.h100_node()
    node[6].lost = True
    state.push_xid(6, 79)  # fallen off the bus: the XID still comes through
    state.write(node)
    assert wait(nvml, 1000)["eventData"] == 79
    nvml.send({"call": "nvmlEventSetWait_v2", "args": [H("events"), 20_000]})
    reply = nvml.answer(timeout=10)
    assert (reply.get("nvml"), reply["elapsed"] < 5) == (GPU_IS_LOST, True)


def test_the_ring_keeps_the_last_events_when_a_reader_falls_behind(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run(REGISTER_ALL_FOR_XIDS)
    for i in range(vs.EVENT_CAPACITY + 10):
        state.push_xid(i % 8, 1000 + i)
    got = nvml.run(
        "out = []\n"
        "while True:\n"
        "    try: out.append(n.nvmlEventSetWait_v2(H['events'], 0).eventData)\n"
        "    except n.NVMLError: break\n"
        "result = out"
    )
    assert got == [1000 + i for i in range(10, vs.EVENT_CAPACITY + 10)]


def test_a_freed_event_set_is_an_invalid_argument(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run(REGISTER_ALL_FOR_XIDS)
    nvml.call("nvmlEventSetFree", H("events"))
    assert nvml.error("nvmlEventSetWait_v2", H("events"), 0) == INVALID_ARGUMENT
    assert nvml.error("nvmlEventSetFree", H("events")) == INVALID_ARGUMENT


def test_the_unversioned_wait_fills_the_original_record(nvml: Worker, state: vs.StateWriter) -> None:
    nvml.run(REGISTER_ALL_FOR_XIDS)
    state.push_xid(3, 119)
    got = nvml.run(
        "data = n.c_nvmlEventData_t()\n"
        "data.gpuInstanceId = 77\n"
        "ret = n._nvmlGetFunctionPointer('nvmlEventSetWait')(H['events'], ctypes.byref(data), 0)\n"
        "result = [ret, data.eventData, data.gpuInstanceId]"
    )
    assert got == [0, 119, 77]  # the instance ids, which the old record lacks, are left alone


def test_without_privileges_only_events_of_the_whole_device_are_delivered(
    worker: Callable[..., Worker], state: vs.StateWriter
) -> None:
    """nvml.h, nvmlEventSetWait_v2: in MIG mode the events of the instances are reported "only if the caller has
    appropriate privileges. In absence of required privileges, only the events which affect all the instances
    (i.e. the whole device) are reported."""
    nvml = worker(state.path, {"GPU_TRIAGE_VGPU_UNPRIVILEGED": "1"})
    nvml.init()
    nvml.run(REGISTER_ALL_FOR_XIDS)
    state.push_xid(2, 13, gpu_instance_id=3, compute_instance_id=0)  # inside one instance: not for this caller
    state.push_xid(2, 48)  # the whole device
    event = wait(nvml, 0)
    assert (event["eventData"], event["gpuInstanceId"]) == (48, vs.NO_INSTANCE)
    assert nvml.error("nvmlEventSetWait_v2", H("events"), 0) == TIMEOUT
