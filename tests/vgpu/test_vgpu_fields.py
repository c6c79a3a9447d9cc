"""nvmlDeviceGetFieldValues: every value type, per-field return codes, scopes and NVLink states."""

from __future__ import annotations

from typing import Any

from tests.vgpu.conftest import H, Worker, vs

UINT_MAX = 0xFFFFFFFF
NVLINK_STATE = 165  # NVML_FI_DEV_NVLINK_GET_STATE


def read(nvml: Worker, gpu: int, ids: list[Any]) -> list[tuple[int, int, Any]]:
    """(return code, value type, value) per field."""
    got = nvml.run(f"result = probe.fields(H['{gpu}'], {ids!r})")
    return [(f["ret"], f["type"], f["value"]) for f in got]


def test_each_value_type_lands_in_its_union_member(nvml: Worker, state: vs.StateWriter) -> None:
    t = vs.ValueType
    overrides = [
        vs.FieldOverride(250, 3.25, value_type=t.DOUBLE),
        vs.FieldOverride(251, 4_000_000_000, value_type=t.UNSIGNED_INT),
        vs.FieldOverride(252, 2**40 + 1, value_type=t.UNSIGNED_LONG),
        vs.FieldOverride(253, 2**63 + 5, value_type=t.UNSIGNED_LONG_LONG),
        vs.FieldOverride(254, -5, value_type=t.SIGNED_LONG_LONG),
        vs.FieldOverride(255, -7, value_type=t.SIGNED_INT),
        vs.FieldOverride(256, 65535, value_type=t.UNSIGNED_SHORT),
    ]
    g = vs.h100(0)
    g.field_overrides = overrides
    state.write([g])
    assert read(nvml, 0, [o.field_id for o in overrides]) == [
        (0, 0, 3.25),
        (0, 1, 4_000_000_000),
        (0, 2, 2**40 + 1),
        (0, 3, 2**63 + 5),
        (0, 4, -5),
        (0, 5, -7),
        (0, 6, 65535),
    ]


def test_each_field_carries_its_own_return_code(nvml: Worker, state: vs.StateWriter) -> None:
    g = vs.h100(0)
    g.field_overrides = [
        vs.FieldOverride(NVLINK_STATE, 0, scope_id=4, nvml_return=15),  # GPU_IS_LOST for one link's state only
        vs.FieldOverride(83, 0, nvml_return=4),  # NO_PERMISSION for the energy counter
    ]
    g.unsupported_fields = {142}
    state.write([g])
    got = read(nvml, 0, [(NVLINK_STATE, 3), (NVLINK_STATE, 4), 83, 142, 143, 9999, (NVLINK_STATE, 18), (138, UINT_MAX)])
    assert [ret for ret, _, _ in got] == [0, 15, 4, 3, 0, 3, 2, 0]
    # not supported: masked (142) and unknown (9999); invalid: a link the GPU does not have (18 of 0-17)


def test_nvlink_fields_by_link_and_summed(nvml: Worker, state: vs.StateWriter) -> None:
    g = vs.h100(0)
    g.nvlinks = [vs.NvLink(state=i % 4, data_tx_kib=1000 * i, raw_rx_kib=7 * i, replay_errors=i) for i in range(18)]
    state.write([g])
    states = read(nvml, 0, [(NVLINK_STATE, link) for link in range(18)])
    assert [(ret, kind, value) for ret, kind, value in states] == [(0, 1, i % 4) for i in range(18)]
    assert read(nvml, 0, [(138, UINT_MAX), (141, UINT_MAX), (138, 5), 52, 46, 91]) == [
        (0, 3, 1000 * sum(range(18))),  # TX data over all links (KiB)
        (0, 3, 7 * sum(range(18))),
        (0, 3, 5000),
        (0, 3, sum(range(18))),  # replay errors, total
        (0, 3, 0),  # link 0's replay errors (a legacy per-link id)
        (0, 1, 18),
    ]


def test_power_fields_answer_for_the_gpu_scope_only(nvml: Worker, state: vs.StateWriter) -> None:
    state.write(vs.h100_node())
    got = read(nvml, 2, [(186, 0), (186, 1), (186, 3), (187, 0), (188, 0), (189, 0)])
    assert got == [(0, 1, 70_000), (3, 0, None), (2, 0, None), (0, 1, 200_000), (0, 1, 700_000), (0, 1, 700_000)]


def test_row_remapper_fields_are_not_supported_with_mig_instances(nvml: Worker, state: vs.StateWriter) -> None:
    g = vs.h100(0)
    g.remapped_correctable = 3
    g.mig_mode = True
    g.mig_instances = [vs.MigInstance(1, 0, "NVIDIA H100 80GB HBM3 MIG 7g.80gb", "MIG-x", 80 * 2**30)]
    state.write([g])
    assert read(nvml, 0, [142])[0][0] == 3
    g.mig_instances = []
    state.write([g])
    assert read(nvml, 0, [142]) == [(0, 1, 3)]


def test_the_recovery_action_field(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[4].recovery_action = 4  # NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    state.write(node)
    assert read(nvml, 4, [230]) == [(0, 1, 4)]
    assert read(nvml, 3, [230]) == [(0, 1, 0)]


def test_field_values_of_a_gpu_that_cannot_answer_them(nvml: Worker, state: vs.StateWriter) -> None:
    g = vs.h100(0)
    g.unsupported = {vs.Query.FIELD_VALUES}
    state.write([g])
    assert nvml.error("nvmlDeviceGetFieldValues", H(0), [83]) == 3
