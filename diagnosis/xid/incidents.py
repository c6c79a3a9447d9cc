"""One GPU's XIDs in context: bursts, root causes, sympathetic XIDs, what history changes.

The catalog says what a code means on its own. Here its neighbours and its history decide, by the rules
below. Which codes play which part, and the windows, are the catalog's `ContextPolicy` (the `classifier`
section of xid_policy.yaml); the values in brackets are the shipped ones.

- XIDs with gaps shorter than the burst gap (3 minutes) are one incident; its root cause is the most
  urgent XID, the earliest among equals. The rest are symptoms: listed, but they drive no action.
- The recovery XID (154) in the incident, or the recovery action NVML reports now, names the action the
  driver wants: it overrides the catalog's action for the root cause.
- The row remapper's events (63, 64) beside an uncorrectable error (48; 94 or 95 where the GPU contains
  errors, A100 and later) keep that error the root cause and raise its action (to drain, then reset: the
  remap takes effect at the next reset); 64, a failed remap, is its own root cause: RMA.
- Sympathetic codes (45), and any line that says "caused by previous Xid", are never a root cause while
  a real one is in the incident.
- Decoded codes (144-150) take their action from NVIDIA's NVLink5 decode of the line's payload.
- Application faults that keep coming back on one GPU (13 or 31 in three incidents a day, or 13 twice
  on the same GPC/TPC) are no longer the application's fault alone: run diagnostics. Not when other GPUs
  logged the same code at the same time (within the burst gap): that is one application crashing on many
  GPUs at once, each time, and no GPU to suspect (`crowd`).
- A code that needed a reset or reboot and comes back in a later boot escalates to RMA.

Time is passed in with the occurrences; nothing here reads a clock or a file beyond the catalog.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpu_triage.diagnosis.core.actions import Action, Severity, most_urgent
from gpu_triage.diagnosis.xid.catalog import UNKNOWN_XID, Repeats, XidCatalog
from gpu_triage.diagnosis.xid.catalog_data import load_catalog

# Actions a reboot should have cured: seeing the code again in a later boot means the hardware.
_CURED_BY_REBOOT = frozenset({Action.RESET_GPU, Action.DRAIN_AND_RESET, Action.REBOOT_NODE})
# An occurrence's details: the MIG instance the driver attributes it to (absent: the whole GPU).
GPU_INSTANCE = "gpu_instance"
COMPUTE_INSTANCE = "compute_instance"


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One XID seen on one GPU: from the journal (daemon) or from a log (offline)."""

    code: int
    text: str
    ts: float | None = None  # unix seconds; None when the input gave no usable time (order = input order)
    boot_id: str = ""
    ref: int = 0  # the evidence line: journal sequence or input line number
    details: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Decision:
    """What one occurrence means, given its incident and the GPU's history."""

    occurrence: Occurrence
    action: Action
    severity: Severity
    root: bool  # False: a symptom of the incident's root cause, which drives no action
    note: str | None = None  # why the catalog's action was changed, or what it is a symptom of
    incident_end: float | None = None  # time of the incident's last XID: findings age from there


def incidents(
    occurrences: Sequence[Occurrence], boundaries: Sequence[float] = (), catalog: XidCatalog | None = None
) -> list[list[Occurrence]]:
    """Split one GPU's XIDs into bursts: a gap of the burst gap or more starts a new one, and so do a new
    boot and each of `boundaries` (a GPU reset, an acknowledgement): what comes after those is news,
    never a symptom of what came before."""
    gap = (catalog or load_catalog()).context.burst_gap_seconds
    ordered = sorted(occurrences, key=lambda o: (o.ts is None, o.ts or 0.0, o.ref))
    cuts = sorted(boundaries)
    out: list[list[Occurrence]] = []
    for occ in ordered:
        last = out[-1][-1] if out else None
        if last is None or last.boot_id != occ.boot_id or _apart(last.ts, occ.ts, cuts, gap):
            out.append([occ])
        else:
            out[-1].append(occ)
    return out


def _apart(before: float | None, after: float | None, cuts: list[float], gap: float) -> bool:
    if before is None or after is None:
        return False
    if after - before >= gap:
        return True
    i = bisect.bisect_right(cuts, before)
    return i < len(cuts) and cuts[i] <= after


def crowd(histories: Mapping[str, Sequence[Occurrence]], catalog: XidCatalog | None = None) -> frozenset[int]:
    """The refs of the occurrences of a repeat-escalated code (13, 31) that another GPU logged too, within the
    burst gap: an application that crashed on many GPUs at once. One sweep per code, linear in the events."""
    catalog = catalog or load_catalog()
    gap, codes = catalog.context.burst_gap_seconds, catalog.context.repeats.codes
    out: set[int] = set()
    for code in codes:
        timed = sorted(
            (o.ts, key, o.ref) for key, occs in histories.items() for o in occs if o.code == code and o.ts is not None
        )
        window: dict[str, int] = {}  # GPU -> its occurrences within the gap of the current one, either side
        lo = hi = 0
        for ts, _gpu, ref in timed:
            while hi < len(timed) and timed[hi][0] <= ts + gap:
                window[timed[hi][1]] = window.get(timed[hi][1], 0) + 1
                hi += 1
            while timed[lo][0] < ts - gap:
                window[timed[lo][1]] -= 1
                if not window[timed[lo][1]]:
                    del window[timed[lo][1]]
                lo += 1
            if len(window) > 1:  # another GPU in the window
                out.add(ref)
    return frozenset(out)


def decide(
    occurrences: Sequence[Occurrence],
    *,
    recovery_now: int | None = None,
    boundaries: Sequence[float] = (),
    catalog: XidCatalog | None = None,
    crowded: frozenset[int] = frozenset(),
) -> list[Decision]:
    """A decision for every occurrence of one GPU, in time order. `recovery_now` is the NVML
    recovery action read now: it applies to the latest incident. `crowded`: refs of occurrences other GPUs
    shared (see `crowd`), which never make a repeat."""
    catalog = catalog or load_catalog()
    bursts = incidents(occurrences, boundaries, catalog)
    decisions: list[Decision] = []
    for i, burst in enumerate(bursts):
        live_recovery = recovery_now if i == len(bursts) - 1 else None
        decisions.extend(_decide_incident(burst, catalog, live_recovery))
    return _escalate(decisions, catalog.context.repeats, crowded)


def _base(occ: Occurrence, catalog: XidCatalog) -> tuple[Action, Severity]:
    entry = catalog.get(occ.code)
    if entry is None:
        return UNKNOWN_XID.action, UNKNOWN_XID.severity
    action = entry.action
    if occ.code in catalog.context.decoded and (decoded := catalog.decode_nvlink5(occ.code, occ.details)) is not None:
        action = decoded.action
    return action, entry.severity


def _sympathetic(occ: Occurrence, catalog: XidCatalog) -> bool:
    return occ.code in catalog.context.sympathetic or "caused_by_xid" in occ.details


def _decide_incident(burst: list[Occurrence], catalog: XidCatalog, recovery_now: int | None) -> list[Decision]:
    base = {id(o): _base(o, catalog) for o in burst}
    notes: dict[int, str] = {}
    remap = catalog.context.row_remap
    if seen := sorted({o.code for o in burst} & remap.codes):
        # The remap events follow the uncorrectable error that caused them: it stays the root cause,
        # and the remap has to take effect before the GPU is used again.
        for o in burst:
            if o.code in remap.raises:
                own, severity = base[id(o)]
                base[id(o)] = (most_urgent([own, remap.to]), severity)
                notes[id(o)] = f"with Xid {'/'.join(map(str, seen))} the row remapper is involved: at least {remap.to}"
    recovery_code = catalog.context.recovery
    candidates = [o for o in burst if not _sympathetic(o, catalog) and o.code != recovery_code] or burst
    root = min(candidates, key=lambda o: (base[id(o)][0].rank, base[id(o)][1].rank, o.ts or 0.0, o.ref))
    action, severity = base[id(root)]
    note = notes.get(id(root))
    recovery = _recovery(burst, catalog, recovery_now)
    if recovery is not None:
        action, note = recovery
        severity = Severity.CRITICAL
    out = []
    end = burst[-1].ts
    for occ in burst:
        if occ is root:
            out.append(Decision(occ, action, severity, root=True, note=note, incident_end=end))
        else:
            why = f"symptom of Xid {root.code}" + (" (sympathetic)" if _sympathetic(occ, catalog) else "")
            out.append(Decision(occ, Action.IGNORE, Severity.INFO, root=False, note=why, incident_end=end))
    return out


def _recovery(burst: list[Occurrence], catalog: XidCatalog, recovery_now: int | None) -> tuple[Action, str] | None:
    """The runtime recovery action: NVML's field now, else the incident's last Xid 154."""
    if recovery_now:
        name, now = catalog.mappings.recovery_named(recovery_now)
        return now, f"NVML reports recovery action {name}"
    for occ in reversed(burst):
        action = catalog.recovery_action_from_text(occ.text) if occ.code == catalog.context.recovery else None
        if action is not None and action is not Action.IGNORE:
            return action, f"Xid {occ.code} names the recovery action the driver wants"
    return None


@dataclass
class _Seen:
    """What earlier root causes of one code left behind, walking forward in time."""

    boots: set[str] = field(default_factory=set)
    recent: deque[Occurrence] = field(default_factory=deque)  # within the repeat window


def _escalate(decisions: list[Decision], repeats: Repeats, crowded: frozenset[int]) -> list[Decision]:
    """Upgrade root causes by what the same code did before; one pass, in time order."""
    seen: dict[int, _Seen] = {}
    out = []
    for d in decisions:  # already in time order
        if not d.root or (d.occurrence.code in repeats.codes and d.occurrence.ref in crowded):
            out.append(d)
            continue
        occ = d.occurrence
        history = seen.setdefault(occ.code, _Seen())
        while (
            history.recent
            and occ.ts is not None
            and history.recent[0].ts is not None
            and occ.ts - history.recent[0].ts > repeats.window_seconds
        ):
            history.recent.popleft()
        out.append(_history_upgrade(d, history, repeats) or d)
        history.recent.append(occ)
        if occ.boot_id:
            history.boots.add(occ.boot_id)
    return out


def _history_upgrade(d: Decision, history: _Seen, repeats: Repeats) -> Decision | None:
    occ = d.occurrence
    if d.action in _CURED_BY_REBOOT and history.boots - {occ.boot_id, ""}:
        note = f"Xid {occ.code} came back after a reboot: suspect the hardware"
        return replace(d, action=Action.CONTACT_SUPPORT, severity=Severity.CRITICAL, note=note)
    if occ.code in repeats.codes and d.action.rank > repeats.to.rank:
        if len(history.recent) + 1 >= repeats.incidents:
            note = f"Xid {occ.code} in {len(history.recent) + 1} incidents within {repeats.window_seconds / 3600:g} h"
            return replace(d, action=repeats.to, severity=Severity.WARNING, note=note)
        spot = _gpc_tpc(occ)
        if occ.code in repeats.same_spot and spot is not None and any(_gpc_tpc(e) == spot for e in history.recent):
            note = f"Xid {occ.code} again on the same GPC/TPC: suspect the hardware"
            return replace(d, action=repeats.to, severity=Severity.WARNING, note=note)
    return None


def _gpc_tpc(occ: Occurrence) -> tuple[str, str] | None:
    gpc, tpc = occ.details.get("gpc"), occ.details.get("tpc")
    return None if gpc is None or tpc is None else (gpc, tpc)
