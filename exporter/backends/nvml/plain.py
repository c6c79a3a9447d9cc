"""The NVML backend's plain fields, read as field_table.py declares them: one call or one field value each.

The calls are looked up on pynvml at each read, not once: a test's fake installs itself there. That
every name exists is checked at import, so a misspelt getter fails at start-up, not as a field that
is silently never read.
"""

from __future__ import annotations

from typing import Any

import pynvml

from gpu_triage.exporter.backends.field_table import FIELDS, FieldSpec, Getter, NvmlField, of
from gpu_triage.exporter.backends.nvml.query import Query


def _convert(value: Any, spec: FieldSpec, per: int) -> Any:
    if value is None:
        return None
    if per != 1:
        value = value / per
    if spec.kind is bool:
        return bool(value)
    return int(value) if spec.kind is int else value


def read_plain(q: Query, h: Any, reading: str) -> dict[str, Any]:
    """The reading's plain attributes NVML answers directly: each getter, then the field values in one call."""
    out: dict[str, Any] = {}
    batched: list[tuple[FieldSpec, NvmlField]] = []
    for spec in of(reading):
        how = spec.nvml
        if isinstance(how, Getter):
            out[spec.attr] = _convert(q(how.query, getattr(pynvml, how.function), h), spec, how.per)
        elif isinstance(how, NvmlField):
            batched.append((spec, how))
    if batched:
        ids = [(getattr(pynvml, how.field), 0) for _, how in batched]  # scope 0: the whole GPU
        values = q.fields(h, ids, [how.query for _, how in batched])
        for (spec, how), value in zip(batched, values, strict=True):
            out[spec.attr] = _convert(value, spec, how.per)
    return out


if unknown := sorted(
    name
    for s in FIELDS
    if s.nvml is not None
    for name in [s.nvml.function if isinstance(s.nvml, Getter) else s.nvml.field]
    if not hasattr(pynvml, name)
):
    raise ImportError(f"field_table names what pynvml does not have: {unknown}")
