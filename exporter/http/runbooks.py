"""GET /runbooks/: the playbooks as self-contained HTML pages, with the node's live findings on top.

Alerts link here (`runbook_url`), usually opened from a phone at night and often on a node that cannot
reach the internet: no external CSS, JS or fonts. Playbook bodies are rendered once, when the router is
built; only the live findings are rendered per request, and everything in them comes from log lines,
so it is escaped (and the Content-Security-Policy forbids scripts should an escape ever be missed).
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response
from markdown_it import MarkdownIt

from gpu_triage.diagnosis.actions import Severity
from gpu_triage.diagnosis.conditions import load_conditions
from gpu_triage.diagnosis.data_check import playbook_references
from gpu_triage.diagnosis.findings import Finding
from gpu_triage.diagnosis.playbooks import ACTION_PLAYBOOKS, Playbook, load_playbooks

log = logging.getLogger(__name__)

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:60em;margin:1.5em auto;padding:0 1em;color:#222}
h1{font-size:1.6em;margin:.3em 0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
code,pre{font:13px/1.4 ui-monospace,monospace;background:#f4f4f4}code{padding:0 .2em}
pre{padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #ddd;padding:.3em .5em;text-align:left;
vertical-align:top}th{background:#f4f4f4}a{color:#0645ad}nav{font-size:.9em;color:#555}
.sev{display:inline-block;padding:0 .5em;border-radius:.3em;color:#fff;font-size:.85em;font-weight:600}
.sev-critical{background:#c0392b}.sev-warning{background:#d68910}.sev-info{background:#2874a6}
.sev-unknown{background:#666}.live{border:2px solid #c0392b;border-radius:.4em;padding:0 1em 1em;
background:#fdf2f0}.live h2{border:0;margin-top:.6em;color:#c0392b}.muted{color:#666;font-size:.9em}
"""
_md = MarkdownIt("commonmark", {"html": False}).enable("table")  # our pages carry no raw HTML


@dataclass(frozen=True, slots=True)
class _Page:
    playbook: Playbook
    body_html: str  # the rendered sections, fixed for the life of the process


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _badge(severity: Severity) -> str:
    return f'<span class="sev sev-{_esc(severity.value)}">{_esc(severity.value)}</span>'


def _document(title: str, body: str) -> HTMLResponse:
    page = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
    return HTMLResponse(page, headers={"Content-Security-Policy": _CSP})


def _render(playbook: Playbook, referrers: list[str]) -> _Page:
    toc = " · ".join(f'<a href="#{name.lower()}">{name}</a>' for name, _ in playbook.sections)
    parts = [f"<nav>{toc}</nav>"]
    for name, text in playbook.sections:
        parts.append(f'<h2 id="{name.lower()}">{name}</h2>\n{_md.render(text)}')
    if referrers:
        parts.append(f'<p class="muted">Used for: {_esc(_used_for(referrers))}.</p>')
    return _Page(playbook, "\n".join(parts))


def _used_for(referrers: list[str]) -> str:
    """'XID 8', 'XID 11', 'condition x' -> 'XIDs 8, 11, condition x': one action page serves dozens of codes."""
    codes = [r.removeprefix("XID ") for r in referrers if r.startswith("XID ")]
    xids = [f"XID{'s' if len(codes) > 1 else ''} {', '.join(codes)}"] if codes else []
    actions = [r for r in referrers if r.startswith("action ")]
    rest = [r for r in referrers if not r.startswith(("XID ", "action "))]
    return ", ".join(actions + xids + rest)


def _when(value: str | int | None) -> str:
    """Unix seconds from a finding's details as UTC; anything else is shown as it came, escaped."""
    if value is None:
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(value)))
    except (ValueError, OverflowError, OSError):
        return _esc(value)


def _evidence(finding: Finding) -> str:
    lines = []
    for ev in finding.evidence:
        where = f"{ev.source}:{ev.line}" if ev.source else f"line {ev.line}"
        lines.append(f"{_esc(where)}: {_esc(ev.text)}")
    return "<pre>" + "\n".join(lines) + "</pre>" if lines else ""


def _live_section(found: list[Finding]) -> str:
    rows = []
    for f in sorted(found, key=lambda f: (f.severity.rank, f.action.rank, f.gpu or "")):
        where = f.gpu or "node"
        if f.host:
            where = f"{f.host} {where}"
        if f.rank is not None:
            where += f" (rank {f.rank})"
        rows.append(
            f"<tr><td><code>{_esc(where)}</code></td><td>{_when(f.details.get('first_seen'))}</td>"
            f"<td>{_when(f.details.get('last_seen'))}</td><td>{_badge(f.severity)}</td>"
            f"<td><b>{_esc(f.action.value)}</b></td><td>{f.count}</td>"
            f"<td>{_esc(f.title)}{_evidence(f)}</td></tr>"
        )
    return (
        f'<section class="live"><h2>Live on this node now ({len(found)})</h2>\n'
        "<table><tr><th>GPU</th><th>Since</th><th>Last seen</th><th>Severity</th><th>Action</th>"
        "<th>Count</th><th>Finding and evidence</th></tr>\n" + "\n".join(rows) + "</table></section>"
    )


def _group(pid: str) -> str:
    if pid in ACTION_PLAYBOOKS:
        return "Actions"
    if pid.startswith("xid-"):
        return "XID codes"
    if pid.startswith("nccl-"):
        return "Training-log classes"
    return "Monitoring and other"


def _order(p: Playbook) -> tuple[int, int, str]:
    """Actions by urgency, XID pages by their lowest code (xid-nvlink5 sits at 144), the rest by id."""
    if p.id in ACTION_PLAYBOOKS:
        return (ACTION_PLAYBOOKS[p.id].rank, 0, p.id)
    codes = [int(c) for c in p.applies_to if c.isdigit()]
    return (0, min(codes, default=0), p.id)


def _conditions_table() -> str:
    rows = "\n".join(
        f'<tr><td><code>{_esc(cid)}</code></td><td>{_esc(c.title)}</td><td><a href="{_esc(c.playbook)}">'
        f"{_esc(c.playbook)}</a></td></tr>"
        for cid, c in load_conditions().items()
    )
    return (
        "<h2>Telemetry conditions</h2><table><tr><th>Condition</th><th>Meaning</th><th>Runbook</th></tr>\n"
        f"{rows}</table>"
    )


def _index(pages: Mapping[str, _Page], live: dict[str, list[Finding]], note: str, conditions: str) -> HTMLResponse:
    groups: dict[str, list[str]] = {
        "Actions": [],
        "XID codes": [],
        "Training-log classes": [],
        "Monitoring and other": [],
    }
    for pid in sorted(pages, key=lambda pid: _order(pages[pid].playbook)):
        groups[_group(pid)].append(pid)
    parts = ["<h1>gpu-triage runbooks</h1>", note]
    if live:
        items = "".join(
            f'<li><a href="{_esc(pid)}">{_esc(pages[pid].playbook.title)}</a>: {len(found)} live finding(s)</li>'
            for pid, found in sorted(live.items())
            if pid in pages
        )
        parts.append(f'<section class="live"><h2>Live on this node now</h2><ul>{items}</ul></section>')
    for name, ids in groups.items():
        if not ids:
            continue
        rows = "\n".join(_index_row(pages[pid].playbook, len(live.get(pid, []))) for pid in ids)
        parts.append(
            f"<h2>{name}</h2><table><tr><th>Runbook</th><th>Severity</th><th>Action</th><th>Live</th></tr>\n"
            f"{rows}</table>"
        )
    parts.append(conditions)
    return _document("gpu-triage runbooks", "\n".join(parts))


def _index_row(p: Playbook, live: int) -> str:
    return (
        f'<tr><td><a href="{_esc(p.id)}"><b>{_esc(p.title)}</b></a> <code>{_esc(p.id)}</code><br>'
        f'<span class="muted">{_esc(p.summary)}</span></td><td>{_badge(p.severity)}</td>'
        f"<td>{_esc(p.action.value)}</td><td>{f'<b>{live}</b>' if live else ''}</td></tr>"
    )


def runbooks_router(live_findings: Callable[[], list[Finding]]) -> APIRouter:
    """`/runbooks/`, `/runbooks/{id}` and `/runbooks/{id}.md`; `live_findings` gives the open findings."""
    playbooks = load_playbooks()  # checked with the rest of the data when the daemon started
    refs = playbook_references()
    pages = {pid: _render(p, refs.get(pid, [])) for pid, p in playbooks.items()}
    conditions = _conditions_table()
    valid = sorted(pages)
    router = APIRouter(prefix="/runbooks", tags=["runbooks"])

    def not_found(pid: str) -> JSONResponse:
        message = f"no runbook {pid!r}; valid ids: {', '.join(valid)}"
        return JSONResponse({"error": message, "status": 404, "valid": valid}, status_code=404)

    def live() -> tuple[dict[str, list[Finding]], str]:
        # The pages must open even when the daemon cannot say what is live: they are the fallback.
        try:
            found = live_findings()
        except Exception:
            log.exception("live findings unavailable for the runbook pages")
            return {}, '<p class="muted">Live findings are unavailable right now (see the daemon log).</p>'
        out: dict[str, list[Finding]] = {}
        for f in found:
            out.setdefault(f.playbook, []).append(f)
        return out, ""

    @router.get("/", response_class=HTMLResponse, summary="Every runbook, and which have live findings")
    def index() -> HTMLResponse:
        by_playbook, note = live()
        return _index(pages, by_playbook, note, conditions)

    # Registered before /{pid}, which would otherwise take "xid-79.md" as an id.
    @router.get("/{pid}.md", summary="A runbook's Markdown source", response_model=None)
    def source(pid: str) -> Response:
        page = pages.get(pid)
        if page is None:
            return not_found(pid)
        return Response(page.playbook.source, media_type="text/markdown; charset=utf-8")

    @router.get("/{pid}", response_class=HTMLResponse, summary="A runbook, with its live findings on top")
    def runbook(pid: str) -> Response:
        page = pages.get(pid)
        if page is None:
            return not_found(pid)
        p = page.playbook
        by_playbook, note = live()
        head = (
            f'<nav><a href="./">All runbooks</a> · <a href="{_esc(p.id)}.md">Markdown source</a></nav>\n'
            f"<h1>{_esc(p.title)}</h1>\n<p>{_badge(p.severity)} Action <b>{_esc(p.action.value)}</b>: "
            f"{_esc(p.action.description)}</p>\n<p><i>{_esc(p.summary)}</i></p>"
        )
        found = by_playbook.get(p.id, [])
        live_html = _live_section(found) if found else note
        return _document(f"{p.title} (gpu-triage runbook)", f"{head}\n{live_html}\n{page.body_html}")

    return router
