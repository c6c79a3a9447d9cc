"""DCGM field ids, and how a field value becomes a number or is absent.

Fields are named here by their numeric ids: DCGM 4.6 renamed most of the macros (the ids did not
change), so the ids are what every DCGM 3.x and 4.x host engine and its bindings agree on. The names
in the comments are DCGM 3's; the units are what DCGM reports (converted in readers.py).

A value is absent when its status is not OK, or when it is one of DCGM's blank sentinels: the
"no value", "not found", "not supported" and "not permissioned" markers of its type. They are
compared exactly, not with DCGM's own `>= BLANK` checks: cumulative profiling counters can pass
those thresholds legitimately.
"""

from __future__ import annotations

import math
from typing import Any

from gpu_triage.exporter.backends import field_table

# -- status codes (dcgm_structs.h, the same in DCGM 3 and 4) --------------------------------------
ST_OK = 0
ST_NOT_SUPPORTED = -6
ST_TIMEOUT = -11
ST_UNKNOWN_FIELD = -13
ST_NO_DATA = -14
ST_STALE_DATA = -15
ST_NOT_WATCHED = -16
ST_NO_PERMISSION = -17
ST_GPU_IS_LOST = -18
ST_RESET_REQUIRED = -19
ST_CONNECTION_NOT_VALID = -21
ST_GPU_NOT_SUPPORTED = -22
ST_PROFILING_NOT_SUPPORTED = -36
ST_PROFILING_LIBRARY_ERROR = -37
ST_PROFILING_MULTI_PASS = -38
ST_INSUFFICIENT_DRIVER_VERSION = -44
ABSENT = frozenset(
    {ST_NOT_SUPPORTED, ST_UNKNOWN_FIELD, ST_NO_DATA, ST_STALE_DATA, ST_NOT_WATCHED, ST_NO_PERMISSION}
)  # the field is not there (yet): its series is left out
LOST = frozenset({ST_GPU_IS_LOST, ST_RESET_REQUIRED})
DISCONNECTED = frozenset({ST_CONNECTION_NOT_VALID, ST_TIMEOUT})  # the host engine is gone or hangs

# -- entity groups (dcgm_fields.h) -----------------------------------------------------------------
FE_GPU = 1
FE_GPU_I = 4
FE_GPU_CI = 5

# -- blank sentinels (dcgmvalue.py / dcgm_structs.h: BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED)
_INT32_BLANK = 0x7FFFFFF0
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
_FP64_BLANK = 140737488355328.0
INT_BLANKS = frozenset({*range(_INT32_BLANK, _INT32_BLANK + 4), *range(_INT64_BLANK, _INT64_BLANK + 4)})
FP64_BLANKS = frozenset(_FP64_BLANK + i for i in range(4))

# -- device fields -----------------------------------------------------------------------------------
DRIVER_VERSION = 1  # s
CUDA_DRIVER_VERSION = 5  # i, 12080 for CUDA 12.8
NAME = 50  # s; on a GPU instance entity, the MIG profile (3g.40gb)
NVML_INDEX = 52  # i
SERIAL = 53  # s
UUID = 54  # s; on a compute instance entity, the MIG device UUID
PCI_BUS_ID = 57  # s
VBIOS_VERSION = 85  # s
SM_CLOCK, MEM_CLOCK, VIDEO_CLOCK = 100, 101, 102  # i, MHz
CLOCK_EVENT_REASONS = 112  # i, the same bits as NVML's clocks-event reasons
MAX_SM_CLOCK, MAX_MEM_CLOCK, MAX_VIDEO_CLOCK = 113, 114, 115  # i, MHz
SLOWDOWN_TEMP, SHUTDOWN_TEMP = 158, 159  # i, Celsius: the GPU's own limits
# 200 and 201 (PCIe throughput) are left alone: "Deprecated: Use DCGM_FI_PROF_PCIE_TX_BYTES instead", and
# DcgmCacheManager answers them "not supported". PCIe traffic comes from the profiling fields below.
FB_TOTAL, FB_USED = 250, 252  # i, MiB: a MIG instance's memory (the GPU's plain fields are in field_table)
GPU_RECOVERY_ACTION = 1523  # i, nvmlDeviceGpuRecoveryAction_t; DCGM 4.5 and later only

# Per NVLink link (0..17): the ids are not contiguous (DCGM 3.x dcgm_fields.py).
LINK_CRC_FLIT = (400, 401, 402, 403, 404, 405, 451, 452, 453, 454, 455, 456, 406, 407, 408, 481, 482, 483)
LINK_REPLAY = (420, 421, 422, 423, 424, 425, 463, 464, 465, 466, 467, 468, 426, 427, 428, 487, 488, 489)
LINK_RECOVERY = (430, 431, 432, 433, 434, 435, 469, 470, 471, 472, 473, 474, 436, 437, 438, 491, 492, 493)

# -- profiling (ratios 0..1 and bytes/s, on every DCGM path) ---------------------------------------
PROF_GR_ENGINE_ACTIVE = 1001
PROF_SM_ACTIVE = 1002
PROF_SM_OCCUPANCY = 1003
PROF_PIPE_TENSOR_ACTIVE = 1004
PROF_DRAM_ACTIVE = 1005  # per GPU instance under MIG
PROF_PIPE_FP64_ACTIVE, PROF_PIPE_FP32_ACTIVE, PROF_PIPE_FP16_ACTIVE = 1006, 1007, 1008
PROF_PCIE_TX_BYTES, PROF_PCIE_RX_BYTES = 1009, 1010
PROF_NVLINK_TX_BYTES, PROF_NVLINK_RX_BYTES = 1011, 1012
PROF_NVLINK_LINK_TX = tuple(1040 + 2 * link for link in range(18))  # Hopper and later; RX is the id after
PROF_ACTIVITY = {
    PROF_GR_ENGINE_ACTIVE: "graphics_engine_active",
    PROF_SM_ACTIVE: "sm_active",
    PROF_SM_OCCUPANCY: "sm_occupancy",
    PROF_PIPE_TENSOR_ACTIVE: "tensor_active",
    PROF_DRAM_ACTIVE: "dram_active",
    PROF_PIPE_FP64_ACTIVE: "fp64_active",
    PROF_PIPE_FP32_ACTIVE: "fp32_active",
    PROF_PIPE_FP16_ACTIVE: "fp16_active",
}
PROF_BUSES = {
    PROF_PCIE_TX_BYTES: "pcie_tx_bytes_per_second",
    PROF_PCIE_RX_BYTES: "pcie_rx_bytes_per_second",
    PROF_NVLINK_TX_BYTES: "nvlink_tx_bytes_per_second",
    PROF_NVLINK_RX_BYTES: "nvlink_rx_bytes_per_second",
}
PROFILING = (*PROF_ACTIVITY, *PROF_BUSES, *(i for tx in PROF_NVLINK_LINK_TX for i in (tx, tx + 1)))

# -- what is watched, in field groups of at most 128 ids (DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP) --------
# The fields the readers read by hand; the plain ones (field_table.py) are added to them.
_BY_HAND = (
    DRIVER_VERSION, CUDA_DRIVER_VERSION, NAME, SERIAL, VBIOS_VERSION,
    SM_CLOCK, MEM_CLOCK, VIDEO_CLOCK, CLOCK_EVENT_REASONS, MAX_SM_CLOCK, MAX_MEM_CLOCK, MAX_VIDEO_CLOCK,
    SLOWDOWN_TEMP, SHUTDOWN_TEMP,
)  # fmt: skip
DEVICE = (*_BY_HAND, *(i for i in field_table.DCGM_DEVICE_FIELDS if i not in _BY_HAND))
NVLINK = (*LINK_CRC_FLIT, *LINK_REPLAY, *LINK_RECOVERY)
RECOVERY = (GPU_RECOVERY_ACTION,)  # alone: an older host engine does not know it, and refuses its group
INSTANCE_MEMORY = (FB_TOTAL, FB_USED)  # watched on MIG entities, with PROF_ACTIVITY


def value(fv: Any) -> float | str | None:
    """The value of a c_dcgmFieldValue_v1/_v2, or None when it is absent (bad status or a blank)."""
    if fv.status != ST_OK:
        return None
    kind = chr(fv.fieldType)
    if kind in ("i", "t"):
        number = int(fv.value.i64)
        return None if number in INT_BLANKS else number
    if kind == "d":
        real = float(fv.value.dbl)
        return None if real in FP64_BLANKS or math.isnan(real) else real
    if kind == "s":
        raw = fv.value.str
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        return None if text.startswith("<<<") and ">>>" in text else text
    return None  # blobs: no field gpu-triage reads is one


Key = tuple[int, int, int]  # (entity group, entity id, field id)


class FieldValues:
    """The latest values of some fields of some entities, with what went wrong per field."""

    def __init__(self, raw: Any) -> None:
        self.values: dict[Key, float | str | None] = {}
        self.failed: set[int] = set()  # field ids with an error other than "not there"
        self.lost: set[tuple[int, int]] = set()  # entities whose GPU DCGM says is lost
        for fv in raw:
            key = (int(fv.entityGroupId), int(fv.entityId), int(fv.fieldId))
            self.values[key] = value(fv)
            if fv.status in LOST:
                self.lost.add(key[:2])
            elif fv.status != ST_OK and fv.status not in ABSENT:
                self.failed.add(key[2])

    def of(self, group: int, entity: int) -> Entity:
        return Entity(self, group, entity)


class Entity:
    """One entity's view of FieldValues: `e[field]` is its value or None, `e.number(field)` a number."""

    def __init__(self, values: FieldValues, group: int, entity: int) -> None:
        self._values, self._group, self._entity = values, group, entity

    def __getitem__(self, field: int) -> float | str | None:
        return self._values.values.get((self._group, self._entity, field))

    def number(self, field: int, scale: float = 1.0) -> float | None:
        got = self[field]
        return None if not isinstance(got, int | float) else got * scale

    def integer(self, field: int) -> int | None:
        got = self[field]
        return None if not isinstance(got, int | float) else int(got)

    def text(self, field: int) -> str | None:
        got = self[field]
        return got if isinstance(got, str) else None
