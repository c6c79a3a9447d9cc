"""One GPU's XIDs in context: bursts, root causes, sympathetic XIDs, what history changes.

The catalog says what a code means on its own. Here its neighbours and its history decide:

- XIDs with gaps under three minutes are one incident (a burst); its root cause is the most urgent
  XID, the earliest among equals. The rest are symptoms: listed, but they drive no action.
- An Xid 154 in the incident (or the recovery action NVML reports now) names the action the driver
  wants: it overrides the catalog's static action for the root cause.
- Xid 48 alone asks for a GPU reset; with 63 or 64 beside it the row remapper is involved, so the
  GPU is drained and reset (64, a failed remap, is its own root cause: RMA).
- Xid 45, and any line that says "caused by previous Xid", are sympathetic: never a root cause
  while a real one is in the incident.
- Xid 144-150 take their action from NVIDIA's NVLink5 decode of the line's payload.
- 13 or 31 over and over on one GPU (three incidents a day, or 13 twice on the same GPC/TPC) is no
  longer the application's fault alone: run diagnostics.
- A code that needed a reset or reboot and comes back in a later boot escalates to RMA.

Time is passed in with the occurrences; nothing here reads a clock or a file beyond the catalog.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gpu_triage.diagnosis.actions import Action, Severity, most_urgent
from gpu_triage.diagnosis.findings import Evidence, Finding, urgency
from gpu_triage.diagnosis.xid_catalog import UNKNOWN_XID, XidCatalog
from gpu_triage.diagnosis.xid_data import load_catalog

BURST_GAP_SECONDS = 180.0
REPEAT_WINDOW_SECONDS = 86400.0
REPEAT_INCIDENTS = 3
_SYMPATHETIC = frozenset({45})
_APP_FAULTS = frozenset({13, 31})
_REMAP = frozenset({63, 64})
_NVLINK5 = range(144, 151)
# Actions a reboot should have cured: seeing the code again in a later boot means the hardware.
_CURED_BY_REBOOT = frozenset({Action.RESET_GPU, Action.DRAIN_AND_RESET, Action.REBOOT_NODE})


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


def incidents(occurrences: Sequence[Occurrence], boundaries: Sequence[float] = ()) -> list[list[Occurrence]]:
    """Split one GPU's XIDs into bursts: a gap of BURST_GAP_SECONDS or more starts a new one, and so do a
    new boot and each of `boundaries` (a GPU reset, an acknowledgement): what comes after those is news,
    never a symptom of what came before."""
    ordered = sorted(occurrences, key=lambda o: (o.ts is None, o.ts or 0.0, o.ref))
    cuts = sorted(boundaries)
    out: list[list[Occurrence]] = []
    for occ in ordered:
        last = out[-1][-1] if out else None
        if last is None or last.boot_id != occ.boot_id or _apart(last.ts, occ.ts, cuts):
            out.append([occ])
        else:
            out[-1].append(occ)
    return out


def _apart(before: float | None, after: float | None, cuts: list[float]) -> bool:
    if before is None or after is None:
        return False
    if after - before >= BURST_GAP_SECONDS:
        return True
    i = bisect.bisect_right(cuts, before)
    return i < len(cuts) and cuts[i] <= after


def decide(
    occurrences: Sequence[Occurrence],
    *,
    recovery_now: int | None = None,
    boundaries: Sequence[float] = (),
    catalog: XidCatalog | None = None,
) -> list[Decision]:
    """A decision for every occurrence of one GPU, in time order. `recovery_now` is the NVML
    recovery action read now: it applies to the latest incident."""
    catalog = catalog or load_catalog()
    bursts = incidents(occurrences, boundaries)
    decisions: list[Decision] = []
    for i, burst in enumerate(bursts):
        live_recovery = recovery_now if i == len(bursts) - 1 else None
        decisions.extend(_decide_incident(burst, catalog, live_recovery))
    return _escalate(decisions)


def _base(occ: Occurrence, catalog: XidCatalog) -> tuple[Action, Severity]:
    entry = catalog.get(occ.code)
    if entry is None:
        return UNKNOWN_XID.action, UNKNOWN_XID.severity
    action = entry.action
    if occ.code in _NVLINK5 and (decoded := catalog.decode_nvlink5(occ.code, occ.details)) is not None:
        action = decoded.action
    return action, entry.severity


def _sympathetic(occ: Occurrence) -> bool:
    return occ.code in _SYMPATHETIC or "caused_by_xid" in occ.details


def _decide_incident(burst: list[Occurrence], catalog: XidCatalog, recovery_now: int | None) -> list[Decision]:
    base = {id(o): _base(o, catalog) for o in burst}
    notes: dict[int, str] = {}
    if {o.code for o in burst} & _REMAP:
        # The remap events follow the uncorrectable error that caused them: 48 stays the root cause,
        # and the remap has to take effect before the GPU is used again.
        for o in burst:
            if o.code == 48:
                own, severity = base[id(o)]
                base[id(o)] = (most_urgent([own, Action.DRAIN_AND_RESET]), severity)
                notes[id(o)] = "with Xid 63/64 the row remapper is involved: drain, then reset"
    candidates = [o for o in burst if not _sympathetic(o) and o.code != 154] or burst
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
            out.append(Decision(occ, action, severity, True, note, end))
        else:
            why = f"symptom of Xid {root.code}" + (" (sympathetic)" if _sympathetic(occ) else "")
            out.append(Decision(occ, Action.IGNORE, Severity.INFO, False, why, end))
    return out


def _recovery(burst: list[Occurrence], catalog: XidCatalog, recovery_now: int | None) -> tuple[Action, str] | None:
    """The runtime recovery action: NVML's field now, else the incident's last Xid 154."""
    if recovery_now:
        name, now = catalog.mappings.recovery_named(recovery_now)
        return now, f"NVML reports recovery action {name}"
    for occ in reversed(burst):
        action = catalog.recovery_action_from_text(occ.text) if occ.code == 154 else None
        if action is not None and action is not Action.IGNORE:
            return action, "Xid 154 names the recovery action the driver wants"
    return None


@dataclass
class _Seen:
    """What earlier root causes of one code left behind, walking forward in time."""

    boots: set[str] = field(default_factory=set)
    recent: deque[Occurrence] = field(default_factory=deque)  # within REPEAT_WINDOW_SECONDS


def _escalate(decisions: list[Decision]) -> list[Decision]:
    """Upgrade root causes by what the same code did before; one pass, in time order."""
    seen: dict[int, _Seen] = {}
    out = []
    for d in decisions:  # already in time order
        if not d.root:
            out.append(d)
            continue
        occ = d.occurrence
        history = seen.setdefault(occ.code, _Seen())
        while (
            history.recent
            and occ.ts is not None
            and history.recent[0].ts is not None
            and occ.ts - history.recent[0].ts > REPEAT_WINDOW_SECONDS
        ):
            history.recent.popleft()
        upgrade = _history_upgrade(d, history)
        history.recent.append(occ)
        if occ.boot_id:
            history.boots.add(occ.boot_id)
        out.append(d if upgrade is None else Decision(occ, upgrade[0], upgrade[1], True, upgrade[2], d.incident_end))
    return out


def _history_upgrade(d: Decision, history: _Seen) -> tuple[Action, Severity, str] | None:
    occ = d.occurrence
    if d.action in _CURED_BY_REBOOT and history.boots - {occ.boot_id, ""}:
        return (
            Action.CONTACT_SUPPORT,
            Severity.CRITICAL,
            f"Xid {occ.code} came back after a reboot: suspect the hardware",
        )
    if occ.code in _APP_FAULTS and d.action.rank > Action.RUN_DIAGNOSTICS.rank:
        if len(history.recent) + 1 >= REPEAT_INCIDENTS:
            note = f"Xid {occ.code} in {len(history.recent) + 1} incidents within a day"
            return Action.RUN_DIAGNOSTICS, Severity.WARNING, note
        spot = _gpc_tpc(occ)
        if occ.code == 13 and spot is not None and any(_gpc_tpc(e) == spot for e in history.recent):
            return Action.RUN_DIAGNOSTICS, Severity.WARNING, "Xid 13 again on the same GPC/TPC: suspect the hardware"
    return None


def _gpc_tpc(occ: Occurrence) -> tuple[str, str] | None:
    gpc, tpc = occ.details.get("gpc"), occ.details.get("tpc")
    return None if gpc is None or tpc is None else (gpc, tpc)


def findings(decisions: Sequence[Decision], gpu: str | None, catalog: XidCatalog | None = None) -> list[Finding]:
    """One finding per XID code, root causes first (most urgent, then earliest), then symptoms."""
    catalog = catalog or load_catalog()
    by_code: dict[int, list[Decision]] = {}
    for d in decisions:
        by_code.setdefault(d.occurrence.code, []).append(d)
    out = []
    for code, group in by_code.items():
        roots = [d for d in group if d.root]
        lead = min(roots, key=urgency) if roots else group[0]
        entry = catalog.get(code)
        first, last = group[0].occurrence, group[-1].occurrence
        evidence = [Evidence(first.ref, first.text)]
        if len(group) > 1:
            evidence.append(Evidence(last.ref, last.text))
        details: dict[str, str | int] = dict(lead.occurrence.details.items())
        if lead.note:
            details["note"] = lead.note
        if entry is not None:
            details["mnemonic"] = entry.mnemonic
        for key, when in (("first_seen", first.ts), ("last_seen", last.ts)):
            if when is not None:
                details[key] = int(when)
        out.append(
            Finding(
                id=f"xid_{code}:{gpu or 'unknown'}",
                class_id=f"xid_{code}",
                severity=lead.severity,
                action=lead.action,
                title=entry.title
                if entry
                else f"Xid {code}: not in NVIDIA's catalog; the raw line says what the driver saw",
                playbook=entry.playbook if entry else UNKNOWN_XID.playbook,
                gpu=gpu,
                evidence=evidence,
                count=len(group),
                details=details,
            )
        )
    root_codes = {d.occurrence.code for d in decisions if d.root}
    out.sort(
        key=lambda f: (
            int(f.class_id.removeprefix("xid_")) not in root_codes,
            *urgency(f),
            f.details.get("first_seen", 0),
        )
    )
    return out
