"""One finding per (class, cause): what several places report together is one finding for them all.

When `FOLD_AT` or more places (ranks, hosts) report the same training-log class for the same cause,
they are one finding at the position of the first of them: its title says which ranks (`on ranks
0-26, 28-63 (63)`), `ranks` lists them numerically, and `members` keeps, per place, where it was, how
often and its first line, so the JSON loses nothing. The cause is the class itself, except where a
finding names one of its own (`details.cause`: the exception that ended a process), so that two ranks
dying of different exceptions stay two findings while every rank that timed out is one. A folded
symptom (timeouts, closed peers) has the host, rank and GPU all its members share, and None
otherwise: it happened everywhere. A folded fault (every rank out of memory) keeps the place of its
first member, where it happened first, which is where to look.
Kernel-log findings (XID, SXid) that name hardware to act on are never folded: each is a piece of
hardware to drain. Those that blame the application are (`fold_gpus`): when a job crashes, every GPU it
ran on logs its own Xid 13, 31, 43 or 45, and the report of one crash is one finding that lists the GPUs,
with the catalog's verdict for the code, never a drain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.findings import Finding, rank_ranges

FOLD_AT = 2
# What an application's crash makes each of its GPUs log: codes whose verdict is the application's.
_APPLICATION = frozenset({Action.CHECK_APP, Action.RESTART_APP, Action.IGNORE})


def _foldable(f: Finding) -> bool:
    return not f.from_kernel


def _common(values: list[Any]) -> Any:
    return values[0] if values and all(v == values[0] for v in values) else None


def _member(f: Finding) -> dict[str, Any]:
    first = f.evidence[0] if f.evidence else None
    out: dict[str, Any] = {"host": f.host, "rank": f.rank, "local_rank": f.local_rank, "gpu": f.gpu, "count": f.count}
    if first is not None:
        out.update(line=first.line, text=first.text[:300])
        if first.source is not None:
            out["file"] = first.source
    return out


def _order(f: Finding) -> tuple[bool, int, str, int]:
    return (f.rank is None, f.rank if f.rank is not None else 0, f.host or "", f.local_rank or 0)


def group(members: list[Finding], symptom: bool = True) -> Finding:
    """One finding for `members` (same class, in root-cause order)."""
    first = members[0]
    place = [first] if not symptom else members
    by_place = sorted(members, key=_order)
    ranks = sorted({f.rank for f in members if f.rank is not None})
    where = f"ranks {rank_ranges(ranks)} ({len(ranks)})" if ranks else f"{len(members)} places"
    if ranks and len(ranks) < len(members):
        where += f" and {len(members) - len(ranks)} more places"
    evidence = [first.evidence[0]] if first.evidence else []
    last = members[-1]
    if last is not first and last.evidence:
        evidence.append(last.evidence[0])
    details = {k: v for k, v in first.details.items() if k not in ("pid", "cuda_dev", "local_rank")}
    details["places"] = len(members)
    # The id of the first member, marked as the group's: two causes of one class are two groups.
    return Finding(
        id=f"{first.id}+{len(members) - 1}",
        class_id=first.class_id,
        severity=first.severity,
        action=first.action,
        title=f"{first.title} on {where}",
        playbook=first.playbook,
        gpu=_common([f.gpu for f in place]),
        rank=None if symptom else first.rank,
        host=_common([f.host for f in place]),
        local_rank=_common([f.local_rank for f in place]),
        place_inferred=any(f.place_inferred for f in members),
        evidence=evidence,
        count=sum(f.count for f in members),
        steps=list(first.steps),
        details=details,
        ranks=ranks,
        members=[_member(f) for f in by_place],
        xid=first.xid,
        sxid=first.sxid,
        aborted=first.aborted,
    )


def _one_crash(f: Finding) -> bool:
    """An XID that blames the application: one of many its crash leaves on the GPUs it ran on."""
    return f.xid is not None and f.action in _APPLICATION and f.severity is not Severity.CRITICAL


def fold_gpus(findings: list[Finding]) -> list[Finding]:
    """`findings` with each application-blaming XID class seen on two or more GPUs of a host folded into one, at
    the place of the first: its `details["gpus"]` lists their PCI bus ids, `members` keeps each one's count and
    first line, `workloads` who was on any of them."""
    by_class: dict[tuple[str, str | None], list[Finding]] = {}
    for f in findings:
        if _one_crash(f) and f.gpu is not None:
            by_class.setdefault((f.class_id, f.host), []).append(f)
    groups = {key: members for key, members in by_class.items() if len({f.gpu for f in members}) > 1}
    out: list[Finding] = []
    for f in findings:
        key = (f.class_id, f.host)
        if key not in groups:
            out.append(f)
        elif f is groups[key][0]:
            out.append(_gpus(groups[key]))
    return out


def _gpus(members: list[Finding]) -> Finding:
    first, last = members[0], members[-1]
    gpus = sorted({str(f.gpu) for f in members})
    evidence = [first.evidence[0]] if first.evidence else []
    if last is not first and last.evidence:
        evidence.append(last.evidence[-1])
    details: dict[str, str | int] = {
        k: v for k, v in first.details.items() if not k.startswith(("gpu_instance", "compute_"))
    }
    details["gpus"] = ", ".join(gpus)
    times = [(f.details.get("first_seen"), f.details.get("last_seen")) for f in members]
    if all(isinstance(a, int) and isinstance(b, int) for a, b in times):
        details["first_seen"] = min(int(a) for a, _ in times)  # type: ignore[arg-type]
        details["last_seen"] = max(int(b) for _, b in times)  # type: ignore[arg-type]
    workloads = tuple(dict.fromkeys(w for f in members for w in f.workloads))
    return Finding(
        id=f"{first.class_id}:gpus",
        class_id=first.class_id,
        severity=first.severity,
        action=first.action,
        title=f"{first.title} (on {len(gpus)} GPUs at once: one application's crash)",
        playbook=first.playbook,
        host=first.host,
        place_inferred=any(f.place_inferred for f in members),
        evidence=evidence,
        count=sum(f.count for f in members),
        steps=list(first.steps),
        details=details,
        members=[_member(f) for f in members],
        workloads=workloads,
        xid=first.xid,
        sxid=first.sxid,
        aborted=first.aborted,
    )


def _key(f: Finding) -> tuple[str, str | int | None]:
    return f.class_id, f.details.get("cause")


def fold(findings: list[Finding], is_symptom: Callable[[Finding], bool]) -> list[Finding]:
    """`findings` (root cause first) with each (class, cause) of `FOLD_AT`+ places folded into one, and each
    application XID seen on several GPUs too (`fold_gpus`)."""
    findings = fold_gpus(findings)
    by_key: dict[tuple[str, str | int | None], list[Finding]] = {}
    for f in findings:
        if _foldable(f):
            by_key.setdefault(_key(f), []).append(f)
    groups = {k: group(ms, is_symptom(ms[0])) for k, ms in by_key.items() if len(ms) >= FOLD_AT}
    out: list[Finding] = []
    for f in findings:
        key = _key(f)
        if not _foldable(f) or key not in groups:
            out.append(f)
        elif f is by_key[key][0]:
            out.append(groups[key])
    return out
