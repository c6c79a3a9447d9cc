"""A virtual GPU's record in the state file, exactly as vgpu/state.h lays out struct vgpu_gpu.

`encode_gpu` turns a `Gpu` (node.py) into its fixed-size record, CRC included; state.py
writes the records into the file. vgpu/README.md documents the layout. The scalar members are
packed by scalars.py, generated with their C side from layout.py; the arrays, strings
and the `more` tail are laid out here by hand, pinned by the sizes below and the ABI tests.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Final

from gpu_triage.exporter.vgpu.node import (
    NOT_AVAILABLE,
    FieldOverride,
    Gpu,
    MigInstance,
    MigProfile,
    RetiredPage,
    ValueType,
)
from gpu_triage.exporter.vgpu.scalars import SCALARS, SCALARS_OFFSET, pack_scalars

MAX_LINKS: Final = 36
MAX_MIG: Final = 7
MAX_PROCESSES: Final = 32
MAX_OVERRIDES: Final = 16
MAX_RETIRED: Final = 16
MAX_MIG_PROFILES: Final = 16
GPM_SLOTS: Final = 128
FIELD_MASK_BITS: Final = 512
CLOCK_EVENT_COUNTERS: Final = 8

_GPU_HEAD = struct.Struct("<IIQ8QQ7Q32Q32Q32Q")  # crc .. retired_timestamp
_GPU_STRINGS = struct.Struct("<96s96s32s80s32s16s")
_LINK = struct.Struct("<9Q2I")
_PROC = struct.Struct("<Q4I")
_OVERRIDE = struct.Struct("<Q4I")
_GPM = struct.Struct(f"<2Q{GPM_SLOTS}d")
_MIG_HEAD = struct.Struct("<3Q2I96s96s")
# struct vgpu_more (layout 3): pcie bytes .. clock_event_ns, then the u32s up to mig_profile_count and a pad
_MORE_HEAD = struct.Struct(f"<2Q11Q{CLOCK_EVENT_COUNTERS}Q8I16s4I")
_MIG_ATTRIBUTES = struct.Struct("<8IQ")
_MIG_PROFILE = struct.Struct("<10IQ96s")
_LINK_COUNTS = struct.Struct("<5Q")
MORE_SIZE: Final = 6144
_MORE_USED = _MORE_HEAD.size + MAX_MIG * _MIG_ATTRIBUTES.size + MAX_MIG_PROFILES * _MIG_PROFILE.size
_MORE_USED += MAX_LINKS * _LINK_COUNTS.size
GPU_SIZE: Final = (
    _GPU_HEAD.size
    + SCALARS.size
    + _GPU_STRINGS.size
    + MAX_LINKS * _LINK.size
    + (MAX_PROCESSES + MAX_OVERRIDES) * _PROC.size
    + _GPM.size
    + MAX_MIG * (_MIG_HEAD.size + _GPM.size)
    + MORE_SIZE
)
if GPU_SIZE != 21648 or _MORE_USED != MORE_SIZE - 1888 or _GPU_HEAD.size != SCALARS_OFFSET:  # pragma: no cover
    raise AssertionError("records.py disagrees with vgpu/state.h")


def encode_text(value: str | bytes, size: int, what: str) -> bytes:
    raw = value if isinstance(value, bytes) else value.encode()  # bytes as they are: a corrupt InfoROM
    if len(raw) >= size:
        raise ValueError(f"{what} is longer than {size - 1} bytes: {value!r}")
    return raw


def _mask(bits: Sequence[int] | set[int], width: int, what: str) -> list[int]:
    words = [0] * (width // 64)
    for bit in bits:
        if not 0 <= bit < width:
            raise ValueError(f"{what}: {bit} is outside 0..{width - 1}")
        words[bit // 64] |= 1 << (bit % 64)
    return words


def _gpm(values: dict[int, float]) -> bytes:
    return _GPM.pack(*_mask(list(values), GPM_SLOTS, "GPM metric id"), *(values.get(i, 0.0) for i in range(GPM_SLOTS)))


def check_count(items: Sequence[object], most: int, what: str) -> None:
    if len(items) > most:
        raise ValueError(f"at most {most} {what}, not {len(items)}")


def _override(o: FieldOverride) -> bytes:
    if o.value_type is ValueType.DOUBLE:
        (bits,) = struct.unpack("<Q", struct.pack("<d", float(o.value)))
    else:
        bits = int(o.value) & 0xFFFFFFFFFFFFFFFF  # two's complement for the signed types
    return _OVERRIDE.pack(bits, o.field_id, o.scope_id, int(o.value_type), o.nvml_return)


def _mig(m: MigInstance) -> bytes:
    head = _MIG_HEAD.pack(
        m.memory_total,
        m.memory_reserved,
        m.memory_used,
        m.gpu_instance_id,
        m.compute_instance_id,
        encode_text(m.name, 96, "MIG name"),
        encode_text(m.uuid, 96, "MIG UUID"),
    )
    return head + _gpm(m.gpm)


def _mig_attributes(m: MigInstance) -> bytes:
    return _MIG_ATTRIBUTES.pack(
        m.multiprocessors,
        m.copy_engines,
        m.decoders,
        m.encoders,
        m.jpegs,
        m.ofas,
        m.gpu_instance_slices,
        m.compute_instance_slices,
        m.memory_mb,
    )


def _mig_profile(p: MigProfile) -> bytes:
    return _MIG_PROFILE.pack(
        p.profile,
        p.id,
        p.slices,
        p.instances,
        p.multiprocessors,
        p.copy_engines,
        p.decoders,
        p.encoders,
        p.jpegs,
        p.ofas,
        p.memory_mb,
        encode_text(p.name, 96, "MIG profile name"),
    )


def _more(gpu: Gpu) -> bytes:
    """struct vgpu_more: what layout 3 added to the record."""
    check_count(gpu.mig_profiles, MAX_MIG_PROFILES, "MIG profiles")
    if len(gpu.pcie_errors) != 11:
        raise ValueError(f"pcie_errors needs the 11 counters 173-183, not {len(gpu.pcie_errors)}")
    if len(gpu.clock_event_ns) > CLOCK_EVENT_COUNTERS:
        raise ValueError(f"at most {CLOCK_EVENT_COUNTERS} clock-event counters")
    fabric = gpu.fabric
    if fabric is not None and len(fabric.cluster_uuid) != 16:
        raise ValueError("a fabric cluster UUID is 16 bytes")
    wrap = (1 << 64) - 1
    head = _MORE_HEAD.pack(
        gpu.pcie_tx_bytes & wrap,
        gpu.pcie_rx_bytes & wrap,
        *gpu.pcie_errors,
        *gpu.clock_event_ns,
        *[0] * (CLOCK_EVENT_COUNTERS - len(gpu.clock_event_ns)),
        gpu.pcie_l0_recovery,
        gpu.power_instant_mw,
        gpu.reset_generation,
        0 if fabric is None else fabric.state,
        0 if fabric is None else fabric.status,
        0 if fabric is None else fabric.clique_id,
        0 if fabric is None else fabric.health_mask,
        0 if fabric is None else fabric.health_summary,
        bytes(16) if fabric is None else fabric.cluster_uuid,
        int(gpu.gsp_firmware[0]),
        int(gpu.gsp_firmware[1]),
        len(gpu.mig_profiles),
        0,
    )
    attributes = b"".join(_mig_attributes(m) for m in gpu.mig_instances)
    profiles = b"".join(_mig_profile(p) for p in gpu.mig_profiles)
    counts = b"".join(
        _LINK_COUNTS.pack(
            k.recovery_successful, k.recovery_failed, k.recovery_events, k.effective_errors, k.symbol_errors
        )
        for k in gpu.nvlinks
    )
    return b"".join(
        [
            head,
            attributes,
            bytes(_MIG_ATTRIBUTES.size * (MAX_MIG - len(gpu.mig_instances))),
            profiles,
            bytes(_MIG_PROFILE.size * (MAX_MIG_PROFILES - len(gpu.mig_profiles))),
            counts,
            bytes(_LINK_COUNTS.size * (MAX_LINKS - len(gpu.nvlinks))),
            bytes(MORE_SIZE - _MORE_USED),
        ]
    )


def _ecc(gpu: Gpu) -> list[int]:
    counts = [0] * 32
    for (error_type, counter_type, location), n in gpu.ecc.items():
        if not (0 <= error_type < 2 and 0 <= counter_type < 2 and 0 <= location < 8):
            raise ValueError(f"ECC key out of range: {(error_type, counter_type, location)}")
        counts[error_type * 16 + counter_type * 8 + location] = n
    return counts


def _retired(pages: list[RetiredPage], attr: str) -> list[int]:
    values = [getattr(p, attr) for p in pages]
    return values + [0] * (MAX_RETIRED - len(values))


def encode_gpu(gpu: Gpu) -> bytes:
    """The GPU's record, CRC included, exactly as vgpu/state.h lays out struct vgpu_gpu."""
    check_count(gpu.nvlinks, MAX_LINKS, "NVLinks")
    check_count(gpu.mig_instances, MAX_MIG, "MIG instances")
    check_count(gpu.processes, MAX_PROCESSES, "processes")
    check_count(gpu.field_overrides, MAX_OVERRIDES, "field overrides")
    check_count(gpu.retired_sbe, MAX_RETIRED, "retired SBE pages")
    check_count(gpu.retired_dbe, MAX_RETIRED, "retired DBE pages")
    if gpu.max_mig_devices > MAX_MIG:
        raise ValueError(f"max_mig_devices is at most {MAX_MIG}")
    for what, values in (
        ("temperature_thresholds", gpu.temperature_thresholds),
        ("clocks_mhz", gpu.clocks_mhz),
        ("max_clocks_mhz", gpu.max_clocks_mhz),
        ("app_clocks_mhz", gpu.app_clocks_mhz),
        ("default_app_clocks_mhz", gpu.default_app_clocks_mhz),
    ):
        if len(values) != (8 if what == "temperature_thresholds" else 4):
            raise ValueError(f"{what} needs one value per NVML enum member, not {len(values)}")
    flags = (1 if gpu.lost else 0) | (2 if gpu.hung else 0) | (4 if gpu.invalid_handle else 0)
    unsupported = 0
    for q in gpu.unsupported:
        unsupported |= 1 << int(q)
    head = _GPU_HEAD.pack(
        0,  # crc, filled in below
        flags,
        unsupported,
        *_mask(sorted(gpu.unsupported_fields), FIELD_MASK_BITS, "field id"),
        gpu.supported_events,
        gpu.memory_total,
        gpu.memory_reserved,
        gpu.memory_used,
        gpu.bar1_total,
        gpu.bar1_used,
        gpu.energy_mj,
        gpu.clocks_event_reasons,
        *_ecc(gpu),
        *_retired(gpu.retired_sbe, "address"),
        *_retired(gpu.retired_dbe, "address"),
        *_retired(gpu.retired_sbe, "timestamp"),
        *_retired(gpu.retired_dbe, "timestamp"),
    )
    scalars = pack_scalars(gpu)
    strings = _GPU_STRINGS.pack(
        encode_text(gpu.name, 96, "name"),
        encode_text(gpu.uuid, 96, "UUID"),
        encode_text(gpu.serial, 32, "serial"),
        encode_text(gpu.board_part_number, 80, "board part number"),
        encode_text(gpu.vbios_version, 32, "VBIOS version"),
        encode_text(gpu.inforom_image_version, 16, "inforom image version"),
    )
    links = [
        _LINK.pack(
            k.replay_errors,
            k.recovery_errors,
            k.crc_flit_errors,
            k.crc_data_errors,
            k.ecc_data_errors,
            k.data_tx_kib,
            k.data_rx_kib,
            k.raw_tx_kib,
            k.raw_rx_kib,
            k.state,
            k.speed_mbps,
        )
        for k in gpu.nvlinks
    ]
    procs = [
        _PROC.pack(
            NOT_AVAILABLE if p.used_memory is None else p.used_memory,
            p.pid,
            p.gpu_instance_id,
            p.compute_instance_id,
            (1 if p.compute else 0) | (2 if p.graphics else 0),
        )
        for p in gpu.processes
    ]
    empty_mig = bytes(_MIG_HEAD.size + _GPM.size)
    record = b"".join(
        [
            head,
            scalars,
            strings,
            *links,
            bytes(_LINK.size * (MAX_LINKS - len(links))),
            *procs,
            bytes(_PROC.size * (MAX_PROCESSES - len(procs))),
            *(_override(o) for o in gpu.field_overrides),
            bytes(_OVERRIDE.size * (MAX_OVERRIDES - len(gpu.field_overrides))),
            _gpm(gpu.gpm),
            *(_mig(m) for m in gpu.mig_instances),
            empty_mig * (MAX_MIG - len(gpu.mig_instances)),
            _more(gpu),
        ]
    )
    return struct.pack("<I", zlib.crc32(record[4:])) + record[4:]


def gpu_record(gpu: Gpu | bytes) -> bytes:
    if isinstance(gpu, Gpu):
        return encode_gpu(gpu)
    if len(gpu) != GPU_SIZE:
        raise ValueError(f"a GPU record is {GPU_SIZE} bytes, not {len(gpu)}")
    return gpu
