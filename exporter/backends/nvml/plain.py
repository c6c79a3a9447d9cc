"""The NVML backend's plain fields, read as field_table.py declares them: one call or one field value each.

The calls are looked up on pynvml at each read, not once: a test's fake installs itself there. That
every name exists is checked at import, so a misspelt getter fails at start-up, not as a field that
is silently never read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pynvml

from gpu_triage.exporter.backends.field_table import FIELDS, FieldSpec, Getter, NvmlField, of
from gpu_triage.exporter.backends.nvml.field_values import FieldRequest
from gpu_triage.exporter.backends.nvml.query import Query


def _convert(value: Any, spec: FieldSpec, per: int) -> Any:
    if value is None:
        return None
    if per != 1:
        value = value / per
    if spec.kind is bool:
        return bool(value)
    return int(value) if spec.kind is int else value


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one reading's plain fields are read: its getters, then its field values in one batch."""

    getters: tuple[tuple[FieldSpec, Getter], ...]
    batched: tuple[tuple[FieldSpec, NvmlField], ...]
    request: FieldRequest  # scope 0: the whole GPU


@functools.cache
def _plan(reading: str) -> _Plan:
    """Worked out once per reading, not at every read: the table does not change while the daemon runs."""
    specs = of(reading)
    getters = tuple((s, s.nvml) for s in specs if isinstance(s.nvml, Getter))
    batched = tuple((s, s.nvml) for s in specs if isinstance(s.nvml, NvmlField))
    request = FieldRequest([(getattr(pynvml, how.field), 0) for _, how in batched], [how.query for _, how in batched])
    return _Plan(getters, batched, request)


def read_plain(q: Query, h: Any, reading: str) -> dict[str, Any]:
    """The reading's plain attributes NVML answers directly: each getter, then the field values in one call."""
    plan = _plan(reading)
    out: dict[str, Any] = {}
    for spec, how in plan.getters:
        out[spec.attr] = _convert(q(how.query, getattr(pynvml, how.function), h), spec, how.per)
    if plan.batched:
        values = q.fields(h, plan.request)
        for (spec, field), value in zip(plan.batched, values, strict=True):
            out[spec.attr] = _convert(value, spec, field.per)
    return out


if unknown := sorted(
    name
    for s in FIELDS
    if s.nvml is not None
    for name in [s.nvml.function if isinstance(s.nvml, Getter) else s.nvml.field]
    if not hasattr(pynvml, name)
):
    raise ImportError(f"field_table names what pynvml does not have: {unknown}")
