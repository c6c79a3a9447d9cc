"""The `classifier` section of xid_policy.yaml (which codes play which part in an incident, and the
windows) checked against the catalog's entries and read into a `ContextPolicy` (diagnosis/xid/catalog.py)."""

from __future__ import annotations

from typing import Any

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.diagnosis.core.data_files import Problems
from gpu_triage.diagnosis.xid.catalog import ContextPolicy, Repeats, RowRemap, XidEntry

_INVALID = Action.CONTACT_SUPPORT  # stands in for a bad value; the catalog is rejected anyway


class _Context:
    """Reads the `classifier` section: each code it names must be in the catalog and carry the tag for its role."""

    def __init__(self, p: Problems, entries: dict[int, XidEntry]) -> None:
        self.p, self.entries = p, entries

    def code(self, where: str, value: Any, tag: str) -> int:
        at = f"xid_policy.yaml: classifier: {where}"
        entry = self.entries.get(value) if type(value) is int else None
        if entry is None:
            self.p.fail(at, f"{value!r} is not an Xid code of the catalog")
        elif tag not in entry.context:
            self.p.fail(at, f"Xid {value} must carry the context tag {tag!r} in `xids`")
        return value if type(value) is int else 0

    def codes(self, where: str, value: Any, tag: str) -> frozenset[int]:
        if not isinstance(value, list) or not value:
            self.p.fail(
                f"xid_policy.yaml: classifier: {where}", f"expected a non-empty list of Xid codes, got {value!r}"
            )
            return frozenset()
        return frozenset(self.code(where, c, tag) for c in value)

    def number(self, where: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            self.p.fail(f"xid_policy.yaml: classifier: {where}", f"expected a positive number, got {value!r}")
            return 1.0
        return float(value)


def build_context(doc: Any, entries: dict[int, XidEntry], p: Problems) -> ContextPolicy:
    where = "xid_policy.yaml: classifier"
    top = p.keys(where, doc, {"burst_gap_seconds", "sympathetic", "row_remap", "decoded", "recovery", "repeats"})
    remap = p.keys(f"{where}: row_remap", top.get("row_remap"), {"codes", "raises", "to"})
    repeats = p.keys(
        f"{where}: repeats", top.get("repeats"), {"codes", "incidents", "window_seconds", "same_spot", "to"}
    )
    ctx = _Context(p, entries)
    repeat_codes = ctx.codes("repeats.codes", repeats.get("codes"), "history")
    same_spot = ctx.codes("repeats.same_spot", repeats.get("same_spot"), "history")
    if not same_spot <= repeat_codes:
        p.fail(f"{where}: repeats.same_spot", f"{sorted(same_spot - repeat_codes)} are not in repeats.codes")
    incidents = ctx.number("repeats.incidents", repeats.get("incidents"))
    if not incidents.is_integer():
        p.fail(f"{where}: repeats.incidents", f"expected a whole number, got {incidents}")
    return ContextPolicy(
        burst_gap_seconds=ctx.number("burst_gap_seconds", top.get("burst_gap_seconds")),
        sympathetic=ctx.codes("sympathetic", top.get("sympathetic"), "co_occurrence"),
        row_remap=RowRemap(
            codes=ctx.codes("row_remap.codes", remap.get("codes"), "co_occurrence"),
            raises=ctx.codes("row_remap.raises", remap.get("raises"), "co_occurrence"),
            to=p.action(f"{where}: row_remap.to", remap.get("to")) or _INVALID,
        ),
        decoded=ctx.codes("decoded", top.get("decoded"), "decode"),
        recovery=ctx.code("recovery", top.get("recovery"), "recovery_text"),
        repeats=Repeats(
            codes=repeat_codes,
            incidents=int(incidents),
            window_seconds=ctx.number("repeats.window_seconds", repeats.get("window_seconds")),
            same_spot=same_spot,
            to=p.action(f"{where}: repeats.to", repeats.get("to")) or _INVALID,
        ),
    )
