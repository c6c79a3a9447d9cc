"""Fake `dcgm_structs`: DCGM's return codes, DCGMError and the structures gpu-triage uses (DCGM 3/4 layout)."""

from __future__ import annotations

import ctypes
from typing import Any

from tests.dcgm_fake import current

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37

_TEXT = {
    DCGM_ST_BADPARAM: "Bad parameter passed to function",
    DCGM_ST_GENERIC_ERROR: "Generic unspecified error",
    DCGM_ST_NOT_CONFIGURED: "Setting not configured",
    DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    DCGM_ST_UNINITIALIZED: "Object is in an undefined state",
    DCGM_ST_TIMEOUT: "Timeout",
    DCGM_ST_UNKNOWN_FIELD: "Unknown field",
    DCGM_ST_NO_DATA: "No data is available",
    DCGM_ST_NOT_WATCHED: "Field is not being updated",
    DCGM_ST_GPU_IS_LOST: "GPU is unreachable",
    DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    DCGM_ST_MAX_LIMIT: "Max limit reached for the object",
    DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
    DCGM_ST_GROUP_IS_EMPTY: "Group is empty",
    DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
    DCGM_ST_PROFILING_LIBRARY_ERROR: "The third-party Profiling module returned an unrecoverable error",
}

DCGM_GROUP_EMPTY = 1
DCGM_FV_FLAG_LIVE_DATA = 0x1
DCGM_HEALTH_WATCH_PCIE = 0x1
DCGM_HEALTH_WATCH_NVLINK = 0x2
DCGM_HEALTH_WATCH_MEM = 0x10
DCGM_HEALTH_WATCH_INFOROM = 0x40
DCGM_HEALTH_WATCH_THERMAL = 0x80
DCGM_HEALTH_WATCH_POWER = 0x100
DCGM_HEALTH_WATCH_DRIVER = 0x200
DCGM_HEALTH_WATCH_ALL = 0xFFFFFFFF
DCGM_HEALTH_RESULT_PASS = 0
DCGM_HEALTH_RESULT_WARN = 10
DCGM_HEALTH_RESULT_FAIL = 20
DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_BLOB_LENGTH = 4096
DCGM_MAX_NUM_DEVICES = 32
DCGM_NVLINK_MAX_LINKS_PER_GPU = 18
DCGM_MAX_HIERARCHY_INFO = DCGM_MAX_NUM_DEVICES * 14
DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2 = 1024


class DCGMError(Exception):
    """A DCGM call failed: `value` is its DCGM_ST_* code; one subclass per code, as the bindings make them."""

    _classes: dict[int, type[DCGMError]] = {}

    def __new__(cls, value: int) -> DCGMError:
        if cls is DCGMError:
            cls = dcgmExceptionClass(value)
        err = Exception.__new__(cls)
        err.value = value
        return err

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _TEXT.get(self.value, f"DCGM error {self.value}")


def dcgmExceptionClass(code: int) -> type[DCGMError]:
    if code not in DCGMError._classes:
        name = "DCGMError_" + f"Code{-code}"
        DCGMError._classes[code] = type(name, (DCGMError,), {})
    return DCGMError._classes[code]


def _dcgmCheckReturn(ret: int) -> int:
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmInit(libDcgmPath: str | None = None) -> None:
    """Loads libdcgm in the real bindings; here the fake host engine says whether there is one."""
    _dcgmCheckReturn(current().load_library())


class c_dcgmConnectV2Params_v2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("persistAfterDisconnect", ctypes.c_uint),
        ("timeoutMs", ctypes.c_uint),
        ("addressIsUnixSocket", ctypes.c_uint),
    ]


c_dcgmConnectV2Params_version = ctypes.sizeof(c_dcgmConnectV2Params_v2) | (2 << 24)


class c_dcgmGroupEntityPair_t(ctypes.Structure):
    _fields_ = [("entityGroupId", ctypes.c_uint32), ("entityId", ctypes.c_uint32)]


class c_dcgmFieldValue_v1_value(ctypes.Union):
    _fields_ = [
        ("i64", ctypes.c_int64),
        ("dbl", ctypes.c_double),
        ("str", ctypes.c_char * DCGM_MAX_STR_LENGTH),
        ("blob", ctypes.c_byte * DCGM_MAX_BLOB_LENGTH),
    ]


class c_dcgmFieldValue_v2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("entityGroupId", ctypes.c_uint),
        ("entityId", ctypes.c_uint),
        ("fieldId", ctypes.c_ushort),
        ("fieldType", ctypes.c_short),
        ("status", ctypes.c_int),
        ("unused", ctypes.c_uint),
        ("ts", ctypes.c_int64),
        ("value", c_dcgmFieldValue_v1_value),
    ]


class c_dcgmMigEntityInfo_t(ctypes.Structure):
    _fields_ = [
        ("gpuUuid", ctypes.c_char * 128),
        ("nvmlGpuIndex", ctypes.c_uint),
        ("nvmlInstanceId", ctypes.c_uint),
        ("nvmlComputeInstanceId", ctypes.c_uint),
        ("nvmlMigProfileId", ctypes.c_uint),
        ("nvmlProfileSlices", ctypes.c_uint),
    ]


class c_dcgmMigHierarchyInfo_v2(ctypes.Structure):
    _fields_ = [
        ("entity", c_dcgmGroupEntityPair_t),
        ("parent", c_dcgmGroupEntityPair_t),
        ("info", c_dcgmMigEntityInfo_t),
    ]


class c_dcgmMigHierarchy_v2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("count", ctypes.c_uint),
        ("entityList", c_dcgmMigHierarchyInfo_v2 * DCGM_MAX_HIERARCHY_INFO),
    ]


class c_dcgmNvLinkGpuLinkStatus_v3(ctypes.Structure):
    _fields_ = [("entityId", ctypes.c_uint32), ("linkState", ctypes.c_uint32 * DCGM_NVLINK_MAX_LINKS_PER_GPU)]


class c_dcgmNvLinkStatus_v3(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("numGpus", ctypes.c_uint32),
        ("gpus", c_dcgmNvLinkGpuLinkStatus_v3 * DCGM_MAX_NUM_DEVICES),
        ("numNvSwitches", ctypes.c_uint32),
    ]


class c_dcgmDiagErrorDetail_t(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 1024), ("code", ctypes.c_uint)]


class c_dcgmIncidentInfo_t(ctypes.Structure):
    _fields_ = [
        ("system", ctypes.c_uint),
        ("health", ctypes.c_uint32),
        ("error", c_dcgmDiagErrorDetail_t),
        ("entityInfo", c_dcgmGroupEntityPair_t),
    ]


class c_dcgmHealthResponse_v5(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("overallHealth", ctypes.c_uint32),
        ("incidentCount", ctypes.c_uint32),
        ("incidents", c_dcgmIncidentInfo_t * DCGM_HEALTH_WATCH_MAX_INCIDENTS_V2),
    ]


def fill(struct: Any, **values: Any) -> Any:
    for name, v in values.items():
        setattr(struct, name, v)
    return struct
