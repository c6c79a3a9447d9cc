"""Captured regex groups to typed finding details (`rules/model.FIELDS` says each group's kind).

Integers become ints, PCI bus ids in any spelling (and NCCL's packed `busId`) become the canonical
bus id that identifies the finding's GPU, and a few fields get a derived companion: the numeric NCCL
result code for a named one, and a hint when a peer address shows NCCL chose the wrong interface.
"""

from __future__ import annotations

from gpu_triage.diagnosis.core.pci import canonical_bus_id
from gpu_triage.diagnosis.training.rules.model import FIELDS, FieldKind

MAX_TEXT = 200
# C++ prints an unset `size_t` (PyTorch's `numelIn_ = -1` of a coalesced or barrier work) as 2^64-1:
# not a size, and never to be compared as one.
UNSET_SIZE = 2**64 - 1
UNKNOWN = "unknown"

_NCCL_CODES = {
    "ncclUnhandledCudaError": 1,
    "unhandled cuda error": 1,
    "ncclSystemError": 2,
    "unhandled system error": 2,
    "ncclInternalError": 3,
    "internal error": 3,
    "ncclInvalidArgument": 4,
    "invalid argument": 4,
    "ncclInvalidUsage": 5,
    "invalid usage": 5,
}
# Addresses that mean NCCL picked the wrong interface rather than that the network is down.
_ADDRESS_HINTS = (
    ("127.", "loopback address: NCCL picked `lo`"),
    ("169.254.", "link-local address: an interface without a routable IP"),
    ("172.17.", "docker bridge address: NCCL picked docker0"),
    ("fe80:", "IPv6 link-local address"),
)


def nccl_bus_id(raw: str) -> str | None:
    """NCCL's packed busId (`3b000`: domain, bus, device, function) as a canonical PCI bus id."""
    try:
        value = int(raw, 16)
    except ValueError:
        return None
    return canonical_bus_id(f"{value >> 20:04x}:{(value >> 12) & 0xFF:02x}:{(value >> 4) & 0xFF:02x}.{value & 0x7:x}")


def convert(fields: dict[str, str]) -> tuple[dict[str, str | int], str | None]:
    """Typed details, and the GPU bus id the fields name (None if they name none)."""
    out: dict[str, str | int] = {}
    gpu: str | None = None
    for name, value in fields.items():
        kind = FIELDS[name]
        if kind is FieldKind.INT:
            number = int(value)
            out[name] = UNKNOWN if number == UNSET_SIZE else number
        elif kind is FieldKind.BUS_ID:
            gpu = canonical_bus_id(value) or gpu
        elif kind is FieldKind.NCCL_BUS_ID:
            gpu = nccl_bus_id(value) or gpu
        elif value.strip():
            out[name] = value.strip()[:MAX_TEXT]
    for key in ("nccl_error", "reason"):
        code = _NCCL_CODES.get(str(out.get(key, "")))
        if code is not None and "nccl_code" not in out:
            out["nccl_code"] = code
    peer = out.get("peer")
    if isinstance(peer, str):
        for prefix, hint in _ADDRESS_HINTS:
            if peer.startswith(prefix):
                out["address_hint"] = hint
    return out, gpu
