"""From what the daemon knows to what diagnosis/ needs: the node's verdict, kept current.

The journal holds the XIDs and the operator's marks, the snapshot holds the telemetry; this module
turns them into diagnosis/xid/health.py inputs, asks for the verdict and exposes it as metrics and JSON.
A GPU's recent XIDs and its marks (the latest acknowledgement, the latest resets) are kept in memory,
loaded from the journal at start and kept current as they are journaled: a verdict reads nothing from
the journal, however many marks it holds.

How the verdict is shown: metrics/verdicts.py (/metrics), verdict_report.py (JSON and the summary line).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from gpu_triage.diagnosis.core.actions import Action, GpuStatus, Health
from gpu_triage.diagnosis.core.findings import Finding, Workload
from gpu_triage.diagnosis.xid.catalog import UNKNOWN_XID
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.xid.health import GpuVerdict, Telemetry, assess_gpu
from gpu_triage.diagnosis.xid.incidents import GPU_INSTANCE, Occurrence, crowd
from gpu_triage.diagnosis.xid.node_verdict import (
    Blind,
    NodeVerdict,
    assess_node,
    sxid_findings,
    unknown_device_findings,
)
from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.backends.readings import (
    ClockEventReason,
    Clocks,
    Ecc,
    HealthWatch,
    LinkState,
    NvLink,
    Recovery,
    Remapping,
)
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.sources.journal import Event, Journal, Mark
from gpu_triage.exporter.verdict_report import all_findings, summary

log = logging.getLogger(__name__)
HISTORY_SECONDS = 7 * 86400.0  # what the classifier looks back on (repeats, returns after a reboot)
# Per GPU and code: a storm of one code (Xid 13 by the thousand) must not push an earlier, rarer one (the
# Xid 48 that decides the verdict) out of what the classifier sees.
_HISTORY_PER_CODE = 1000
MARKS_PER_GPU = 64  # resets kept per GPU: older ones fall outside what the verdict looks back on
# GPUs whose resets are kept: a node's, and the few the kernel log binds that the driver no longer lists; a log
# that binds thousands (corrupt, or another machine's) must not grow the table.
_MAX_RESET_GPUS = 1024
_RECENT_IDS = 4096  # events a second source may still enrich (it reports within seconds)
_THERMAL = ClockEventReason.HW_THERMAL_SLOWDOWN.bit | ClockEventReason.SW_THERMAL_SLOWDOWN.bit
_POWER_BRAKE = ClockEventReason.HW_POWER_BRAKE_SLOWDOWN.bit


# How evidence lines name the backend that said what they say.
_SAID_BY = {"nvml": "NVML", "dcgm": "DCGM", "sim": "the simulator"}


def telemetry(state: GpuState, links_seen_up: Collection[int] = (), backend: str = "nvml") -> Telemetry:
    """`links_seen_up`: links of this GPU that were up at some point; only those can be down (an
    uncabled link is inactive from the start and is not a fault)."""
    recovery, remap, ecc, health = state.get(Recovery), state.get(Remapping), state.get(Ecc), state.get(HealthWatch)
    clocks, links = state.get(Clocks), state.get(NvLink)
    reasons = (clocks.event_reasons or 0) if clocks else 0
    return Telemetry(
        status=GpuStatus(state.status),
        lost_since=state.lost.since if state.lost else None,
        lost_answer=state.lost.answer if state.lost else None,
        source=_SAID_BY.get(backend, backend),
        recovery_action=recovery.action if recovery else None,
        row_remap_pending=remap.pending if remap else None,
        row_remap_failure=remap.failure if remap else None,
        uncorrected_ecc=ecc.uncorrected_volatile if ecc else None,
        retired_pages_pending=ecc.retired_pages_pending if ecc else None,
        thermal_slowdown=bool(reasons & _THERMAL),
        power_brake=bool(reasons & _POWER_BRAKE),
        nvlink_down=tuple(
            link.link
            for link in (links.links if links else ())
            if link.state == LinkState.INACTIVE and link.link in links_seen_up
        ),
        health_incidents=tuple((i.system, i.failed, i.message) for i in (health.incidents or ())) if health else (),
    )


def occurrence(e: Event) -> Occurrence:
    return Occurrence(e.code, e.text, e.ts, e.boot_id, e.kmsg_seq or e.id, details=e.details)


class Verdicts:
    def __init__(self, journal: Journal, boot_id: str) -> None:
        self._journal = journal
        self._boot_id = boot_id
        self._lock = threading.Lock()
        # By uuid (or PCI bus id when the uuid is unknown), then by code; and the bus id each key was seen on.
        self._xids: dict[str, dict[int, deque[Occurrence]]] = {}
        self._bus_of: dict[str, str] = {}
        self._sxids: deque[Occurrence] = deque(maxlen=_HISTORY_PER_CODE)
        # Recent events by journal id, to replace one in place when the kernel log enriches it.
        self._recent: OrderedDict[int, tuple[deque[Occurrence], Occurrence]] = OrderedDict()
        self._acknowledged: dict[str, float] = {}  # uuid -> the latest acknowledgement
        self._resets: dict[str, deque[float]] = {}  # uuid -> when the driver brought the GPU up, latest last
        self._since: dict[str, float] = {}  # finding id -> when we first saw it open
        # finding id -> who was on its GPU when we first saw it open, and whether that was final (taken once
        # every workload source had answered; before, an empty answer may only mean "not read yet").
        self._who: dict[str, tuple[tuple[Workload, ...], bool]] = {}
        # The last verdict logged, per GPU (PCI bus id) and for the node: a change is logged once.
        self._told: dict[str, tuple[Health, Action]] = {}
        self._told_node = _FINE
        self._links_up: dict[str, set[int]] = {}  # uuid -> NVLinks seen up since the daemon started
        # PCI bus id -> the telemetry and verdict of a GPU with no XID history, at the last update. Without XIDs
        # a GPU's verdict is its telemetry's alone (no clock, boot, clear or reset bears on it), so the same
        # telemetry is the same verdict: a quiet node's GPUs are judged again only when what they read changes.
        self._quiet: dict[str, tuple[Telemetry, GpuVerdict]] = {}
        self.node = NodeVerdict(Health.UNKNOWN, Action.IGNORE, (), ())

    def load(self, now: float) -> None:
        """The journal's recent history and marks, at start: old news, so not logged again."""
        events, marks = self._journal.events(since=now - HISTORY_SECONDS, limit=100_000), self._journal.marks()
        for event in events:  # all read first: a read that fails leaves nothing half loaded
            self._add(event)
        self.add_marks(marks)

    def add_marks(self, marks: Sequence[Mark]) -> None:
        """Marks as they are journaled: only the latest acknowledgement and MARKS_PER_GPU resets count."""
        with self._lock:
            for m in marks:
                if m.kind == "acknowledged":
                    self._acknowledged[m.uuid] = max(m.ts, self._acknowledged.get(m.uuid, m.ts))
                elif m.kind == "init":
                    resets = self._resets.pop(m.uuid, None) or deque(maxlen=MARKS_PER_GPU)
                    resets.append(m.ts)
                    self._resets[m.uuid] = resets  # newest last: a log full of bindings lets the oldest go
                    if len(self._resets) > _MAX_RESET_GPUS:
                        del self._resets[next(iter(self._resets))]

    def add(self, event: Event) -> None:
        """A new event, or a journaled one another source made richer (same id): replaced, not added.
        A new one is logged, once."""
        if not self._add(event):
            _log_event(event)

    def _add(self, event: Event) -> bool:
        """Whether the event was known already."""
        new = occurrence(event)
        with self._lock:
            known = self._recent.get(event.id) if event.id else None
            if known is not None:
                history, old = known
                with contextlib.suppress(ValueError):  # unless it aged out of the history meanwhile
                    history[history.index(old)] = new
            elif event.kind == "sxid":
                history = self._sxids
                history.append(new)
            else:
                key = event.uuid or event.pci_bus_id or ""
                history = self._xids.setdefault(key, {}).setdefault(event.code, deque(maxlen=_HISTORY_PER_CODE))
                history.append(new)
                if event.pci_bus_id:
                    self._bus_of[key] = event.pci_bus_id
            if event.id:
                self._recent[event.id] = (history, new)
                if len(self._recent) > _RECENT_IDS:
                    self._recent.popitem(last=False)
        return known is not None

    def update(
        self,
        snapshot: Snapshot,
        now: float,
        workloads: Mapping[str, tuple[Workload, ...]] | None = None,
        *,
        settled: bool = True,
        incomplete: Sequence[Blind] = (),
    ) -> NodeVerdict:
        """Recompute every GPU's verdict. The caller publishes it (`self.node = ...`) once the metrics
        that show it are rendered too, so the API and /metrics never disagree. `workloads` (by PCI bus id)
        says who uses each GPU now; `settled`, whether every source of that has answered yet; `incomplete`,
        the sources the verdict depends on that cannot be read now."""
        with self._lock:
            self._forget_before(now - HISTORY_SECONDS)
            gpus = []
            seen: set[str] = set()
            histories = {
                s.identity.uuid: [*self._history(s.identity.uuid), *self._history(s.identity.pci_bus_id)]
                for s in snapshot.gpus
            }
            crowded = crowd(histories)  # one application's crash on many GPUs: no GPU to suspect for its repeats
            quiet: dict[str, tuple[Telemetry, GpuVerdict]] = {}
            for state in snapshot.gpus:
                g = state.identity
                seen |= {g.uuid, g.pci_bus_id}
                telemetry = self._telemetry(state, snapshot.backend)
                history = histories[g.uuid]
                if history:
                    gpus.append(self._assess(g.pci_bus_id, g.uuid, history, telemetry, now, crowded))
                    continue
                last = self._quiet.get(g.pci_bus_id)
                if last is not None and last[0] == telemetry:
                    verdict = _copy(last[1])
                else:
                    verdict = self._assess(g.pci_bus_id, g.uuid, history, telemetry, now, crowded)
                quiet[g.pci_bus_id] = (telemetry, verdict)
                gpus.append(verdict)
            self._quiet = quiet  # the GPUs listed now: one that got XIDs, or left, is judged afresh
            node = assess_node(
                gpus, [*sxid_findings(list(self._sxids), boot_id=self._boot_id), *self._unknown(seen, now)], incomplete
            )
            self._stamp(node, now, workloads or {}, settled)
            indexes = {s.identity.pci_bus_id: s.identity for s in snapshot.gpus}
            _fill_steps(node, {bus: g.index for bus, g in indexes.items()})
            self._log_changes(node, indexes, snapshot)
        return node

    def _unknown(self, seen: set[str], now: float) -> list[Finding]:
        """XIDs on bus ids that are none of the GPUs the driver lists (one that fell off the bus before we
        started, another device): judged as their codes are, never as a lost GPU."""
        out = []
        for key in self._xids:
            if key in seen or not (xids := self._history(key)):
                continue
            bus = self._bus_of.get(key, key)
            uuid = key if key != bus else None
            out += unknown_device_findings(
                bus, xids, boot_id=self._boot_id, now=now, uuid=uuid, cleared_at=self._acknowledged.get(key)
            )
        return out

    def _log_changes(self, node: NodeVerdict, gpus: dict[str, GpuIdentity], snapshot: Snapshot) -> None:
        """Each GPU's verdict, and the node's, when it differs from the last one logged (at start: from
        healthy, so a healthy node starts quietly). The summary is built only for a change: every render
        passes here, and a change is rare."""
        for v in node.gpus:
            was = self._told.get(v.gpu, _FINE)
            if (v.health, v.action) == was:
                continue
            self._told[v.gpu] = (v.health, v.action)
            g = gpus.get(v.gpu)
            log.info(
                "GPU verdict changed",
                extra={
                    "gpu": g.index if g else None,
                    "pci_bus_id": v.gpu,
                    "uuid": g.uuid if g else None,
                    "health": v.health.value,
                    "action": v.action.value,
                    "was": f"{was[0].value} {was[1].value}",
                    **({"cause": v.findings[0].title} if v.findings else {}),
                },
            )
        # While a source has not been read yet (the daemon has just started) the node is unknown for a moment:
        # not a change worth a line.
        if (node.health, node.action) != self._told_node and not any(b.starting for b in node.incomplete):
            was = self._told_node
            self._told_node = (node.health, node.action)
            log.info(
                "node verdict changed",
                extra={
                    "health": node.health.value,
                    "action": node.action.value,
                    "was": f"{was[0].value} {was[1].value}",
                    "summary": summary(snapshot, node),
                },
            )

    def _history(self, key: str) -> list[Occurrence]:
        return [o for by_code in self._xids.get(key, {}).values() for o in by_code]

    def _forget_before(self, cutoff: float) -> None:
        """A daemon up for months decides on the same span of history as one just started."""
        for history in (*(d for by_code in self._xids.values() for d in by_code.values()), self._sxids):
            while history and history[0].ts is not None and history[0].ts < cutoff:
                history.popleft()

    def _telemetry(self, state: GpuState, backend: str) -> Telemetry:
        links = state.get(NvLink)
        seen = self._links_up.setdefault(state.identity.uuid, set())
        seen.update(link.link for link in (links.links if links else ()) if link.up)
        return telemetry(state, seen, backend)

    def _assess(
        self, bus: str, uuid: str, history: list[Occurrence], t: Telemetry, now: float, crowded: frozenset[int]
    ) -> GpuVerdict:
        return assess_gpu(
            bus,
            history,
            t,
            boot_id=self._boot_id,
            now=now,
            cleared_at=self._acknowledged.get(uuid),
            resets=sorted(self._resets.get(uuid, ())),
            crowded=crowded,
        )

    def _stamp(
        self, node: NodeVerdict, now: float, workloads: Mapping[str, tuple[Workload, ...]], settled: bool
    ) -> None:
        """Give every open finding a `since` (its first XID, or when we first saw the condition) and the
        workloads on its GPU then: the job that hit an XID, not whichever job runs on the GPU an hour later."""
        open_ids = set()
        for finding in all_findings(node):
            open_ids.add(finding.id)
            first = finding.details.get("first_seen")
            finding.details["since"] = int(first) if first is not None else int(self._since.setdefault(finding.id, now))
            who = self._who.get(finding.id)
            if finding.gpu is not None and (who is None or not who[1]):
                who = (_in_scope(finding, workloads.get(finding.gpu, ())), settled)
                self._who[finding.id] = who
            finding.workloads = who[0] if who else ()
        for stale in set(self._since) - open_ids:
            del self._since[stale]
        for stale in set(self._who) - open_ids:
            del self._who[stale]

    def open_findings(self) -> list[Finding]:
        return all_findings(self.node)


_FINE = (Health.HEALTHY, Action.IGNORE)


def _copy(verdict: GpuVerdict) -> GpuVerdict:
    """A verdict kept from the last update, for this one: its findings copied, because _stamp writes into them
    (`since`, who was on the GPU), and the last frame's must stay as they were shown."""
    if not verdict.findings:
        return verdict
    return replace(verdict, findings=tuple(replace(f, details=dict(f.details)) for f in verdict.findings))


def _log_event(event: Event) -> None:
    """An XID or SXID as it arrives: what, where, and the action its code calls for on its own."""
    if event.kind == "sxid":
        fields: dict[str, object] = {"sxid": event.code, "pci_bus_id": event.pci_bus_id}
        log.warning("NVSwitch SXID", extra={**fields, "source": event.sources, "text": event.text})
        return
    entry = load_catalog().get(event.code)
    action = entry.action if entry else UNKNOWN_XID.action
    fields = {"xid": event.code, "gpu": event.gpu_index, "pci_bus_id": event.pci_bus_id, "uuid": event.uuid}
    log.warning("XID", extra={**fields, "action": action.value, "source": event.sources, "text": event.text})


def _in_scope(finding: Finding, workloads: tuple[Workload, ...]) -> tuple[Workload, ...]:
    """Who a finding hit: for an XID the driver put in one MIG instance, the workloads of that instance, unless
    what it calls for (a reset, a reboot, an RMA) takes the whole GPU, and with it every instance's work."""
    instance = finding.details.get(GPU_INSTANCE)
    if instance is None or finding.action.rank <= Action.RESET_GPU.rank:
        return workloads
    return tuple(w for w in workloads if w.gpu_instance is not None and str(w.gpu_instance) == str(instance))


def _fill_steps(node: NodeVerdict, indexes: dict[str, int]) -> None:
    """Next steps for the XID findings that came without any: the action, then how to close the finding.

    diagnosis/ knows the code and the action; only the daemon knows the GPU's index and that it can be
    acknowledged here.
    """
    for v in node.gpus:
        index = indexes.get(v.gpu)
        for f in v.findings:
            code = f.xid
            if f.steps or code is None:
                continue
            steps = [f.action.description]
            steps.append(f"`gpu-triage xid {code}` says what the code means; the runbook is /runbooks/{f.playbook}.")
            if index is not None and f.action not in (Action.REBOOT_NODE, Action.CONTACT_SUPPORT, Action.IGNORE):
                steps.append(
                    "Once it is done, close the finding: "
                    f"`curl -s -XPOST localhost:9481/api/v1/gpus/{index}/acknowledge` (a reboot closes it too)."
                )
            f.steps = steps
