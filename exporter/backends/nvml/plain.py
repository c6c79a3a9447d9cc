"""The NVML backend's plain fields, read as field_table.py declares them: one call or one field value each.

The calls are looked up on pynvml at each read, not once: a test's fake installs itself there. That
every name exists is checked at import, so a misspelt getter fails at start-up, not as a field that
is silently never read.

A few are the board's limits, not the moment's, and are kept a while (kept.py's rules): nvml.h gives the
maximum PCIe link generation and width as "possible with this device and system" (the GPU and the slot it
is in) and the default power limit as the one "the device boots with". Each is kept only while a value read
at every poll vouches for it: the current link generation and width answer and are not above the kept
maxima, and the enforced power limit answers (it may be set above the default, so it bounds nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from gpu_triage.exporter.backends.field_table import FIELDS, FieldSpec, Getter, NvmlField, of
from gpu_triage.exporter.backends.nvml.field_values import FieldRequest
from gpu_triage.exporter.backends.nvml.kept import Kept
from gpu_triage.exporter.backends.nvml.query import Query


@dataclass(frozen=True, slots=True)
class BoardLimit:
    """A plain attribute that is kept, and the attribute read at every poll that vouches for the kept answer."""

    attr: str
    witness: str  # it answers, or the limit is asked again
    bounds: bool  # the witness is never above the limit: where it is, the limit is asked again


BOARD_LIMITS: Mapping[str, tuple[BoardLimit, ...]] = {
    "Pcie": (
        BoardLimit("max_link_generation", "link_generation", bounds=True),
        BoardLimit("max_link_width", "link_width", bounds=True),
    ),
    "Power": (BoardLimit("default_limit_watts", "limit_watts", bounds=False),),
}


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

    getters: tuple[tuple[FieldSpec, Getter], ...]  # read at every poll
    batched: tuple[tuple[FieldSpec, NvmlField], ...]
    request: FieldRequest  # scope 0: the whole GPU
    limits: tuple[tuple[FieldSpec, Getter], ...]  # the reading's BOARD_LIMITS, read when none is kept


@functools.cache
def _plan(reading: str) -> _Plan:
    """Worked out once per reading, not at every read: the table does not change while the daemon runs."""
    specs = of(reading)
    limits = {limit.attr for limit in BOARD_LIMITS.get(reading, ())}
    getters = tuple((s, s.nvml) for s in specs if isinstance(s.nvml, Getter) and s.attr not in limits)
    batched = tuple((s, s.nvml) for s in specs if isinstance(s.nvml, NvmlField))
    request = FieldRequest([(getattr(pynvml, how.field), 0) for _, how in batched], [how.query for _, how in batched])
    kept = tuple((s, s.nvml) for s in specs if isinstance(s.nvml, Getter) and s.attr in limits)
    return _Plan(getters, batched, request, kept)


def read_plain(q: Query, h: Any, reading: str, kept: Kept[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The reading's plain attributes NVML answers directly: each getter, then the field values in one call,
    then its board limits, from `kept` where it holds them and this read vouches for them."""
    plan = _plan(reading)
    out: dict[str, Any] = {}
    for spec, how in plan.getters:
        out[spec.attr] = _convert(q(how.query, getattr(pynvml, how.function), h), spec, how.per)
    if plan.batched:
        values = q.fields(h, plan.request)
        for (spec, field), value in zip(plan.batched, values, strict=True):
            out[spec.attr] = _convert(value, spec, field.per)
    if plan.limits:
        if kept is None:
            raise ValueError(f"{reading} has board limits: read_plain needs where they are kept")
        out.update(_limits(q, h, reading, plan, out, kept))
    return out


def _limits(
    q: Query, h: Any, reading: str, plan: _Plan, read: dict[str, Any], kept: Kept[dict[str, Any]]
) -> dict[str, Any]:
    def vouched(limits: dict[str, Any]) -> bool:
        return all(
            (witness := read[limit.witness]) is not None and not (limit.bounds and witness > limits[limit.attr])
            for limit in BOARD_LIMITS[reading]
        )

    def ask() -> tuple[dict[str, Any], bool]:
        failed = len(q.failed)
        out = {s.attr: _convert(q(how.query, getattr(pynvml, how.function), h), s, how.per) for s, how in plan.limits}
        return out, len(q.failed) == failed and None not in out.values()  # whole: "not supported" is asked again

    return kept.answer(q.gpu, vouched, ask)


if unknown := sorted(
    name
    for s in FIELDS
    if s.nvml is not None
    for name in [s.nvml.function if isinstance(s.nvml, Getter) else s.nvml.field]
    if not hasattr(pynvml, name)
):
    raise ImportError(f"field_table names what pynvml does not have: {unknown}")

if wrong := sorted(
    f"{reading}.{attr}"
    for reading, limits in BOARD_LIMITS.items()
    for limit in limits
    for attr, getter in ((limit.attr, True), (limit.witness, False))
    if not any(s.attr == attr and (isinstance(s.nvml, Getter) or not getter) for s in of(reading))
):
    raise ImportError(f"BOARD_LIMITS names what the reading does not read (a limit by a getter): {wrong}")
