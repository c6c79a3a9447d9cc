"""Canonical PCI bus ids: how a kernel-log line is joined to a GPU.

NVML writes `00000000:3B:00.0`, the kernel `0000:3b:00`, older drivers `3b:00.0`; all of them
are `0000:3b:00.0` here (lower case, 4-digit domain, function suffix).
"""

from __future__ import annotations

import re

_BUS_ID = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<function>[0-7]))?$"
)


def canonical_bus_id(raw: str) -> str | None:
    """`raw` in any of the shapes NVML and the kernel print, or None when it is not a bus id."""
    m = _BUS_ID.match(raw.strip())
    if m is None:
        return None
    domain = int(m["domain"] or "0", 16)
    if domain > 0xFFFF:
        return None
    function = int(m["function"] or "0")
    return f"{domain:04x}:{int(m['bus'], 16):02x}:{int(m['device'], 16):02x}.{function}"
