"""GET /: the node at a glance, for the person paged about it: the verdict on top, then every GPU with its
health, the one action it needs, what was found (each with its runbook), its last XID, and why a job on it is
slow (the performance findings, beside the health and never part of it).

Rendered per request from what the daemon already holds (the published verdict, the snapshot, the XID
totals): no driver call, one small journal query.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

from fastapi.responses import HTMLResponse

from gpu_triage import __version__
from gpu_triage.diagnosis.core.actions import Action, Health
from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.performance.engine import PerformanceReport
from gpu_triage.diagnosis.xid.health import GpuVerdict
from gpu_triage.diagnosis.xid.node_verdict import NodeVerdict
from gpu_triage.exporter.daemon import Daemon, Frame
from gpu_triage.exporter.http.page import badge, document, esc, utc
from gpu_triage.exporter.http.runbooks import gpu_name, used_by
from gpu_triage.exporter.sources.journal import Total
from gpu_triage.exporter.verdict_report import affected, blind_json, name_places, summary


def _findings(findings: Iterable[Finding], indexes: Mapping[str, int]) -> str:
    items = [
        f"<li>{badge(f.severity)} {esc(f.title)}"
        + (f" ({f.count} times)" if f.count > 1 else "")
        + (f" on {esc(gpu_name(f.gpu, indexes))}" if f.gpu and f.gpu not in indexes else "")
        + f' — runbook <a href="/runbooks/{esc(f.playbook)}">{esc(f.playbook)}</a>'
        + used_by(f)
        + "</li>"
        for f in findings
    ]
    return f'<ul class="findings">{"".join(items)}</ul>' if items else '<span class="muted">none</span>'


def _last_xids(totals: Iterable[Total]) -> dict[str, Total]:
    """The most recent XID of each GPU, by uuid and by PCI bus id (a kernel-log XID may lack the uuid)."""
    last: dict[str, Total] = {}
    for t in totals:
        if t.kind != "xid":
            continue
        for key in (t.uuid, t.pci_bus_id):
            if key and (key not in last or t.last_seen > last[key].last_seen):
                last[key] = t
    return last


def _last_xid(t: Total | None) -> str:
    if t is None:
        return '<span class="muted">none</span>'
    total = f", {t.count} in all" if t.count > 1 else ""
    return f'<a href="/api/v1/xid/{t.code}">Xid {t.code}</a><br><span class="muted">{utc(t.last_seen)}{total}</span>'


def _verdict_box(frame: Frame) -> str:
    node = frame.node
    places = affected(frame.snapshot, node)
    what = "" if node.incomplete else "<p>No action needed.</p>"  # a daemon that cannot see cannot say that
    if places:
        named = "".join(f"<li>{esc(name_places([p]))}</li>" for p in places)
        what = f"<p><b>{esc(node.action.value)}</b>: {esc(node.action.description)}</p><ul>{named}</ul>"
    elif node.action is not Action.IGNORE and not node.incomplete:
        what = f"<p><b>{esc(node.action.value)}</b>: {esc(node.action.description)}</p>"
    return (
        f'<section class="verdict verdict-{esc(node.health.value)}">'
        f"<h2>Node {esc(node.health.value)}</h2>{_blind_box(node)}{what}"
        f'<p class="muted">{esc(summary(frame.snapshot, node, places))}</p></section>'
    )


def _blind_box(node: NodeVerdict) -> str:
    """What the verdict could not see, above everything else: a daemon that cannot see must not look green."""
    if not node.incomplete:
        return ""
    items = "".join(
        f"<li><b>{esc(b.what)}</b>: {esc(b.problem)}. {esc(b.fix.capitalize())}.</li>"
        for b in (blind_json(x) for x in node.incomplete)
    )
    head = "<p><b>The verdict is incomplete.</b> gpu-triage cannot read:</p>"
    return f'<div class="incomplete">{head}<ul>{items}</ul></div>'


def _why_slow(report: PerformanceReport, uuid: str) -> str:
    """The GPU's performance findings, one line each: beside its health, never part of it."""
    if report.judged_at is None:
        return '<span class="muted">judging (the first window is not over)</span>'
    items = [
        f"<li>{badge(f.spec.severity)} <b>{esc(f.cls)}</b>: {esc(f.summary())}"
        + "".join(f" ({esc(w.short())})" for w in f.workloads)
        + f' — runbook <a href="/runbooks/{esc(f.spec.playbook)}">{esc(f.spec.playbook)}</a></li>'
        for f in report.by_gpu.get(uuid, ())
    ]
    return f'<ul class="findings">{"".join(items)}</ul>' if items else '<span class="muted">none</span>'


def _row(
    label: str,
    status: str,
    verdict: GpuVerdict | None,
    last: Total | None,
    ids: str,
    indexes: Mapping[str, int],
    slow: str,
) -> str:
    health = verdict.health if verdict else Health.UNKNOWN
    action = '<span class="muted">none</span>'
    if verdict is not None and verdict.action is not Action.IGNORE:
        action = f"<b>{esc(verdict.action.value)}</b>"
    return (
        f'<tr class="gpu-{esc(health.value)}"><td><b>{esc(label)}</b></td><td>{badge(health)}</td>'
        f"<td>{action}</td><td>{_findings(verdict.findings if verdict else (), indexes)}</td>"
        f"<td>{_last_xid(last)}</td><td>{slow}</td><td>{esc(status)}</td><td>{ids}</td></tr>"
    )


def _gpu_table(frame: Frame, totals: list[Total], indexes: Mapping[str, int]) -> str:
    by_bus = {v.gpu: v for v in frame.node.gpus}
    last = _last_xids(totals)
    rows = []
    for state in frame.snapshot.gpus:
        g = state.identity
        ids = f"<code>{esc(g.pci_bus_id)}</code><br><code class=muted>{esc(g.uuid)}</code>"
        xid = last.get(g.uuid) or last.get(g.pci_bus_id)
        slow = _why_slow(frame.performance, g.uuid)
        rows.append(_row(f"GPU {g.index}", state.status, by_bus.pop(g.pci_bus_id, None), xid, ids, indexes, slow))
    return (
        '<table id="gpus"><tr><th>GPU</th><th>Health</th><th>Action</th><th>Findings</th><th>Last XID</th>'
        "<th>Why slow</th><th>Status</th><th>PCI bus id, UUID</th></tr>\n" + "\n".join(rows) + "</table>"
    )


def landing_page(daemon: Daemon) -> HTMLResponse:
    frame = daemon.frame  # one render's snapshot and verdict for the whole page
    indexes = {g.identity.pci_bus_id: g.identity.index for g in frame.snapshot.gpus}
    links = [
        (daemon.settings.web_telemetry_path, "Prometheus metrics"),
        ("/api/v1/diagnosis", "the node's verdict as JSON: which GPU, what happened, what to do"),
        ("/api/v1/gpus", "GPUs and their latest readings, as JSON"),
        ("/api/v1/events", "XID history"),
        ("/runbooks/", "playbooks: what to do for every XID, condition and training-log failure"),
        ("/healthz", "liveness"),
        ("/readyz", "readiness"),
        ("/openapi.json", "API description (OpenAPI)"),
    ]
    if daemon.backend.name == "sim":
        links.append(("/api/v1/sim/faults", "simulator faults (POST to inject one)"))
    items = "\n".join(f'<li><a href="{esc(href)}">{esc(href)}</a> {esc(text)}</li>' for href, text in links)
    node_findings = frame.node.findings
    switches = f"<h2>Not on a GPU</h2>{_findings(node_findings, indexes)}" if node_findings else ""
    table = _gpu_table(frame, daemon.xid_totals(), indexes)
    host = socket.gethostname()
    body = (
        f"<h1>gpu-triage on {esc(host)}</h1>\n"
        f'<p class="muted">Version {esc(__version__)}, backend {esc(frame.snapshot.backend)}, '
        f"last read {utc(frame.snapshot.taken_at or None)}.</p>\n"
        f"{_verdict_box(frame)}\n<h2>GPUs</h2>\n{table}\n{switches}\n"
        f"<h2>Endpoints</h2>\n<ul>\n{items}\n</ul>"
    )
    return document(f"gpu-triage on {host}", body)
