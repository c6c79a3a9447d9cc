"""Fake `dcgm_agent`: the DCGM C API calls gpu-triage makes, with the bindings' signatures.

As in the real module, every argument that is a `str` reaches the library as UTF-8 bytes, a failed
call raises the DCGMError subclass of its return code, and handles and ids are opaque values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import dcgm_structs

from tests.dcgm_fake import current

T = TypeVar("T")


def _c_call(fn: Callable[..., T]) -> Callable[..., T]:
    """Byte strings in; the fake host engine's DCGM_ST_* return code checked, as `_dcgmCheckReturn` does."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        args = tuple(a.encode() if isinstance(a, str) else a for a in args)
        current().count(fn.__name__)
        return fn(*args, **kwargs)

    return call


def _engine_call(name: str, *args: Any) -> Any:
    ret, out = getattr(current(), name)(*args)
    dcgm_structs._dcgmCheckReturn(ret)
    return out


@_c_call
def dcgmInit() -> int:
    return dcgm_structs._dcgmCheckReturn(current().init())


@_c_call
def dcgmShutdown() -> int:
    return dcgm_structs.DCGM_ST_OK


@_c_call
def dcgmConnect_v2(
    ip_address: bytes, connectParams: Any, version: int = dcgm_structs.c_dcgmConnectV2Params_version
) -> Any:
    connectParams.version = version
    return _engine_call("connect", ip_address, connectParams)


@_c_call
def dcgmDisconnect(dcgm_handle: Any) -> int:
    return dcgm_structs._dcgmCheckReturn(current().disconnect(dcgm_handle))


@_c_call
def dcgmGetAllSupportedDevices(dcgm_handle: Any) -> list[int]:
    return list(_engine_call("supported_devices", dcgm_handle))


@_c_call
def dcgmGetGpuInstanceHierarchy(dcgm_handle: Any) -> Any:
    return _engine_call("hierarchy", dcgm_handle)


@_c_call
def dcgmGetNvLinkLinkStatus(dcgm_handle: Any) -> Any:
    return _engine_call("nvlink_status", dcgm_handle)


@_c_call
def dcgmGroupCreate(dcgm_handle: Any, type: int, groupName: bytes) -> Any:
    return _engine_call("group_create", dcgm_handle, type, groupName)


@_c_call
def dcgmGroupAddEntity(dcgm_handle: Any, group_id: Any, entityGroupId: int, entityId: int) -> int:
    return _engine_call("group_add", dcgm_handle, group_id, entityGroupId, entityId)  # type: ignore[no-any-return]


@_c_call
def dcgmGroupDestroy(dcgm_handle: Any, group_id: Any) -> int:
    return _engine_call("group_destroy", dcgm_handle, group_id)  # type: ignore[no-any-return]


@_c_call
def dcgmFieldGroupCreate(dcgm_handle: Any, fieldIds: list[int], fieldGroupName: bytes) -> Any:
    return _engine_call("field_group_create", dcgm_handle, list(fieldIds), fieldGroupName)


@_c_call
def dcgmFieldGroupDestroy(dcgm_handle: Any, fieldGroupId: Any) -> int:
    return _engine_call("field_group_destroy", dcgm_handle, fieldGroupId)  # type: ignore[no-any-return]


@_c_call
def dcgmWatchFields(
    dcgm_handle: Any, groupId: Any, fieldGroupId: Any, updateFreq: int, maxKeepAge: float, maxKeepSamples: int
) -> int:
    return _engine_call("watch", dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples)  # type: ignore[no-any-return]


@_c_call
def dcgmUpdateAllFields(dcgm_handle: Any, waitForUpdate: int) -> int:
    return _engine_call("update_all", dcgm_handle, waitForUpdate)  # type: ignore[no-any-return]


@_c_call
def dcgmEntitiesGetLatestValues(dcgmHandle: Any, entities: list[Any], fieldIds: list[int], flags: int) -> Any:
    return _engine_call("latest_values", dcgmHandle, list(entities), list(fieldIds), flags)


@_c_call
def dcgmHealthSet(dcgm_handle: Any, groupId: Any, systems: int) -> int:
    return _engine_call("health_set", dcgm_handle, groupId, systems)  # type: ignore[no-any-return]


@_c_call
def dcgmHealthCheck(dcgm_handle: Any, groupId: Any, version: int = 5) -> Any:
    return _engine_call("health_check", dcgm_handle, groupId)
