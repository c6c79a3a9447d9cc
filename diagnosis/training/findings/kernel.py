"""Kernel-log events met in the logs given to `diagnose`: XIDs of GPUs and SXids of NVSwitches.

An XID finding takes its verdict from the XID catalog, and a GPU's XIDs are judged together as the
daemon judges them (`incidents.decide`), with the times the lines carry where they carry absolute
ones. An XID code missing from the catalog becomes a finding of severity UNKNOWN with the daemon's
verdict for such codes (`incidents.UNKNOWN_XID`), and the raw line goes with it.

An SXid is an NVSwitch's own error code; its place is the switch (its PCI id), never a GPU. The switch
driver says whether it is fatal: a fatal one takes the fabric down for every GPU behind the switch
(drain, restart Fabric Manager), a non-fatal one is a link to watch.

Where these rank among the training-log classes: an XID whose catalog action is a hardware action
(reset, reboot, RMA, links, cooling, diagnostics) and a fatal SXid rank before every training-log
class, since they name the failing hardware; an XID the catalog blames on the application ranks with
the CUDA illegal-address class; a non-fatal SXid (a fabric error the switch corrected or contained,
which may still stall the traffic through that link) ranks after every specific training-log class but
before the symptoms (timeouts, closed peers, aborted communicators) it can explain; an ignorable XID
ranks last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.log_stamps import Stamp
from gpu_triage.diagnosis.training.findings.collapse import Collapser, Seen, Spec, Tally
from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.place.facts import Who, short_host
from gpu_triage.diagnosis.training.rules.model import CUDA_ILLEGAL_ADDRESS, RuleSet
from gpu_triage.diagnosis.xid.catalog import UNKNOWN_XID, XidEntry
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.incidents import Decision, Occurrence, crowd, decide
from gpu_triage.diagnosis.xid.kernel_log import EventKind, KernelEvent

MAX_EVENTS = 10_000  # kernel events listed in a report; the rest are counted
EVIDENCE_CHARS = 1000
SXID_PLAYBOOK = "nvswitch-sxid"
_XID_CHECK = "On the node, read `dmesg -T | grep -i xid` and `nvidia-smi -q` for the GPU with this bus id."


def _xid_tier(action: Action, rules: RuleSet) -> float:
    """Where an XID with this action ranks among the training-log classes."""
    if action.rank <= Action.RUN_DIAGNOSTICS.rank:
        return -1.0  # a hardware verdict: the GPU it names is the root cause of its ranks' errors
    if action is Action.IGNORE:
        return float(len(rules.rules))
    return rules.rule(CUDA_ILLEGAL_ADDRESS).specificity - 0.5  # the application's own fault


def _xid_spec(code: int, entry: XidEntry | None, rules: RuleSet) -> Spec:
    """What an XID finding says: the catalog's verdict, and where it ranks among training-log classes."""
    if entry is None:
        return Spec(
            class_id=f"xid_{code}",
            severity=UNKNOWN_XID.severity,
            action=UNKNOWN_XID.action,
            title=f"XID {code}: code not in the XID catalog",
            playbook=UNKNOWN_XID.playbook,
            steps=(
                "Keep the full NVRM line for the case: the code is newer than this catalog or undocumented.",
                _XID_CHECK,
                UNKNOWN_XID.action.description,
            ),
            tier=-1.0,
            xid=code,
        )
    return Spec(
        class_id=f"xid_{code}",
        severity=entry.severity,
        action=entry.action,
        title=f"XID {code} ({entry.mnemonic}): {entry.title}",
        playbook=entry.playbook,
        steps=(_XID_CHECK, entry.action.description),
        tier=_xid_tier(entry.action, rules),
        xid=code,
    )


def _sxid_spec(code: int, fatal: bool, rules: RuleSet) -> Spec:
    kind = "fatal" if fatal else "non-fatal"
    steps = (
        "On the node run `nvidia-smi -q | grep -A3 -i fabric` and `journalctl -u nvidia-fabricmanager` "
        "and read `dmesg -T | grep -i sxid` for the switch's other errors.",
        "Drain the node; restart nvidia-fabricmanager, reset the GPUs (or reboot) and rerun the job."
        if fatal
        else "Watch for repeats and for XIDs 74/144-150 on the GPUs behind the switch (NVLink errors).",
    )
    return Spec(
        class_id=f"sxid_{code}",
        severity=Severity.CRITICAL if fatal else Severity.WARNING,
        action=Action.RESTART_FABRIC_MANAGER if fatal else Action.CHECK_LINKS,
        title=f"NVSwitch SXid {code} ({kind})",
        playbook=SXID_PLAYBOOK,
        steps=steps,
        tier=-1.0 if fatal else _first_symptom(rules) - 0.5,
        sxid=code,
    )


def _first_symptom(rules: RuleSet) -> float:
    return float(min((r.specificity for r in rules.rules if r.symptom), default=len(rules.rules)))


def _timed(seen: list[tuple[Occurrence, Stamp | None]]) -> list[Occurrence]:
    """One GPU's XIDs with the times incidents.decide splits bursts by.

    The burst gap only needs differences, so any one kind of stamp will do when every XID of the GPU
    carries it: plain `dmesg`'s seconds since boot, syslog's date without a year, or an absolute time.
    Stamps of mixed kinds do not compare, and neither do uptimes or yearless dates that go back (a
    reboot, or a new year, inside the input): then the XIDs keep input order and count as one burst.
    """
    kinds = {stamp.kind if stamp is not None else None for _, stamp in seen}
    if len(kinds) != 1 or None in kinds:
        return [occurrence for occurrence, _ in seen]
    values = [stamp.value for _, stamp in seen if stamp is not None]
    if kinds != {"abs"} and any(after < before for before, after in pairwise(values)):
        return [occurrence for occurrence, _ in seen]
    return [replace(occurrence, ts=value) for (occurrence, _), value in zip(seen, values, strict=True)]


@dataclass(frozen=True, slots=True)
class ListedEvent:
    """A kernel event as the report lists it, with the input it came from (the report names the input)."""

    source: int
    event: KernelEvent

    def to_json(self, file: str | None) -> dict[str, Any]:
        """The event of `diagnose --json`'s `events`; `file`: the input's name, when several were read."""
        event = self.event
        out: dict[str, Any] = {"line": event.line}
        if event.kind is EventKind.SXID:
            out.update(sxid=event.code, pci_bus_id=event.pci_bus_id, severity=event.details.get("severity"))
        else:
            out.update(xid=event.code, pci_bus_id=event.pci_bus_id, pid=event.pid, process=event.process)
        out.update(timestamp=event.timestamp, text=event.text[:EVIDENCE_CHARS])
        if file is not None:
            out["file"] = file
        return out


class KernelFindings:
    """XID and SXid events of one diagnosis, the findings they make, and the XID verdicts."""

    def __init__(self, rules: RuleSet, collapser: Collapser) -> None:
        self.rules = rules
        self.collapser = collapser
        self.events: list[ListedEvent] = []
        self.dropped = 0
        self._xid_specs: dict[int, tuple[Spec, XidEntry | None]] = {}
        # By (input, host, GPU): every node has a GPU at 3b:00, so a bus id names a GPU only with its host.
        self.occurrences: dict[tuple[int, str | None, str | None], list[tuple[Occurrence, Stamp | None]]] = {}

    def add(self, source: int, line: LogLine, event: KernelEvent) -> None:
        if event.code is None or event.kind is EventKind.GPU_BINDING:
            return
        listed = len(self.events) < MAX_EVENTS
        if listed:
            self.events.append(ListedEvent(source, event))
        else:
            self.dropped += 1
        if event.kind is EventKind.SXID:
            self._sxid(source, line, event)
        else:
            self._xid(source, line, event, listed)

    def _sxid(self, source: int, line: LogLine, event: KernelEvent) -> None:
        assert event.code is not None
        fatal = event.details.get("severity") == "Fatal"
        details: dict[str, str | int] = {"sxid": event.code}
        if event.pci_bus_id:
            details["switch"] = event.pci_bus_id
        details.update((k, v[:200]) for k, v in event.details.items() if k in ("device", "link", "message"))
        seen = Seen(source, event.line, event.text[:EVIDENCE_CHARS], line.stamp)
        # The place is the switch: no GPU, and no rank of the job sits on it.
        self.collapser.add(Who(source, host=line.host), _sxid_spec(event.code, fatal, self.rules), seen, details)

    def _xid(self, source: int, line: LogLine, event: KernelEvent, listed: bool) -> None:
        assert event.code is not None
        known = self._xid_specs.get(event.code)
        if known is None:
            entry = load_catalog().get(event.code)
            known = self._xid_specs[event.code] = (_xid_spec(event.code, entry, self.rules), entry)
        spec, entry = known
        details: dict[str, str | int] = {"xid": event.code}
        if event.process:
            details["process"] = event.process
        if event.pid is not None:
            details["pid"] = event.pid
        details.update((k, v[:200]) for k, v in event.details.items())
        if entry is not None and entry.causes:
            details.setdefault("causes", "; ".join(entry.causes)[:200])
        seen = Seen(source, event.line, event.text[:EVIDENCE_CHARS], line.stamp)
        who = Who(source, host=line.host, gpu=event.pci_bus_id, subject_pid=event.pid)
        self.collapser.add(who, spec, seen, details)
        if listed:  # the same bound as the events listed
            occurrence = Occurrence(event.code, event.text, None, ref=event.line, details=event.details)
            key = (source, short_host(line.host), event.pci_bus_id)
            self.occurrences.setdefault(key, []).append((occurrence, line.stamp))

    def judge(self) -> set[str]:
        """Judge each GPU's XIDs together, as the daemon does (`incidents.decide`): the root cause of a
        burst keeps the action its neighbours call for (Xid 154's recovery action, 48 with 63/64), the
        rest are symptoms. Returns the XID classes that were only ever symptoms."""
        verdicts: dict[tuple[int, str | None, str | None], dict[int, Decision]] = {}
        timed = {key: _timed(seen) for key, seen in self.occurrences.items()}
        # An application's crash logs the same Xid on many GPUs of a host at once: no GPU to suspect for it.
        hosts: dict[tuple[int, str | None], dict[str, list[Occurrence]]] = {}
        for (source, host, gpu), occurrences in timed.items():
            hosts.setdefault((source, host), {})[str(gpu)] = occurrences
        crowded = {place: crowd(gpus) for place, gpus in hosts.items()}
        for key, occurrences in timed.items():
            lead: dict[int, Decision] = {}
            for d in decide(occurrences, crowded=crowded[key[:2]]):
                held = lead.get(d.occurrence.code)
                if held is None or (d.root and (not held.root or d.action.rank < held.action.rank)):
                    lead[d.occurrence.code] = d
            verdicts[key] = lead

        def change(who: Who, tally: Tally) -> tuple[Spec, dict[str, str | int]] | None:
            spec = tally.spec
            code = spec.xid
            if code is None:
                return None
            d = verdicts.get((who.source, short_host(who.host), who.gpu), {}).get(code)
            if d is None or (d.action, d.severity) == (spec.action, spec.severity):
                return None
            tier = _xid_tier(d.action, self.rules) if d.root else float(len(self.rules.rules))
            new = replace(spec, severity=d.severity, action=d.action, tier=tier, symptom=not d.root)
            return new, ({"note": d.note} if d.note else {})

        self.collapser.respec(change)
        roots = {f"xid_{code}" for lead in verdicts.values() for code, d in lead.items() if d.root}
        return {f"xid_{code}" for lead in verdicts.values() for code in lead} - roots
