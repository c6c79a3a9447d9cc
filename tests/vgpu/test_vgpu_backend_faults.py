"""gpu-triage's NVML backend when a GPU is reset or lost, on the virtual GPU: handles, and XIDs."""

from __future__ import annotations

from tests.vgpu.conftest import Worker, vs


def test_a_reset_makes_the_gpu_lost_until_a_slow_poll_looks_its_handle_up_again(
    nvml: Worker, state: vs.StateWriter
) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    node[4].invalid_handle = True  # a reset in flight: the handle no longer names the GPU
    state.write(node)
    assert "no longer valid" in nvml.run("result = ops.read(4, 'power')")["lost"]
    assert nvml.run("result = ops.read(5, 'power')")["failed"] == []  # the others carry on
    node[4].invalid_handle = False
    node[4].power_mw = 250_000
    state.write(node)
    # A fast poll does not touch a handle known to be stale; the slow poll looks it up by UUID.
    assert "next slow poll" in nvml.run("result = ops.read(4, 'power')")["lost"]
    assert nvml.run("result = ops.read(4, 'inventory')")["failed"] == []
    assert nvml.run("result = ops.read(4, 'power')")["reading"]["usage_watts"] == 250.0


def test_a_reset_that_is_not_over_keeps_the_gpu_lost(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    node[2].invalid_handle = True
    state.write(node)
    assert "lost" in nvml.run("result = ops.read(2, 'utilization')")
    assert "looking its handle up again: InvalidArgument" in nvml.run("result = ops.read(2, 'ecc')")["lost"]


def test_xids_name_their_gpu_without_asking_the_driver_and_a_lost_gpu_leaves_the_others_their_events(
    nvml: Worker, state: vs.StateWriter
) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert nvml.run("result = ops.xids(0.0)") == []  # registers for XIDs
    node[3].lost = True  # off the bus: nvmlDeviceGetIndex on its handle fails now
    state.write(node)
    state.push_xid(3, 79)
    state.push_xid(5, 48)
    assert nvml.run("result = ops.xids(5.0)") == [[3, 79], [5, 48]]
    # The lost GPU in the set now ends every wait; the backend leaves it out and carries on.
    assert nvml.run("result = ops.xids(0.2)") == []
    state.push_xid(6, 13)
    assert nvml.run("result = ops.xids(5.0)") == [[6, 13]]
    # Back on the bus (the simulator clears the fault): its events are watched again once it answers.
    node[3].lost = False
    state.write(node)
    assert nvml.run("result = ops.read(3, 'power')")["failed"] == []
    assert nvml.run("result = ops.xids(0.0)") == []  # re-registers, GPU 3 included
    state.push_xid(3, 94)
    assert nvml.run("result = ops.xids(5.0)") == [[3, 94]]
