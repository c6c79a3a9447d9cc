"""GET /runbooks/: the playbooks as self-contained HTML pages, with the node's live findings on top.

Alerts link here (`runbook_url`). Playbook bodies are rendered once, when the router is built; only the
live findings are rendered per request, and everything in them comes from log lines, so it is escaped
(page.py has the rest of what these pages and the landing page share).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from gpu_triage.diagnosis.core.findings import Finding
from gpu_triage.diagnosis.core.playbooks import ACTION_PLAYBOOKS, Playbook, load_playbooks
from gpu_triage.diagnosis.xid.conditions import load_conditions
from gpu_triage.exporter.http.errors import error
from gpu_triage.exporter.http.page import badge, document, esc, utc

log = logging.getLogger(__name__)


@functools.cache
def _markdown() -> Callable[[str], str]:
    """The Markdown renderer, loaded with the first runbook page asked for: a daemon nobody browses never needs
    it, and it is some sixty modules."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render  # our pages carry no raw HTML


@functools.cache
def _referrers() -> dict[str, list[str]]:
    """Who names each playbook, for the pages' "Used for" line: built with the first page rendered, since
    it reads the training-log rules and hang classes, which a daemon nobody browses otherwise never holds."""
    from gpu_triage.diagnosis.knowledge.check import playbook_references

    return playbook_references()


@dataclass(frozen=True, slots=True)
class _Page:
    playbook: Playbook
    body_html: str  # the rendered sections, fixed for the life of the process


def _render(playbook: Playbook, referrers: list[str]) -> _Page:
    toc = " · ".join(f'<a href="#{name.lower()}">{name}</a>' for name, _ in playbook.sections)
    parts = [f"<nav>{toc}</nav>"]
    for name, text in playbook.sections:
        parts.append(f'<h2 id="{name.lower()}">{name}</h2>\n{_markdown()(text)}')
    if referrers:
        parts.append(f'<p class="muted">Used for: {esc(_used_for(referrers))}.</p>')
    return _Page(playbook, "\n".join(parts))


def _used_for(referrers: list[str]) -> str:
    """'XID 8', 'XID 11', 'condition x' -> 'XIDs 8, 11, condition x': one action page serves dozens of codes."""
    codes = [r.removeprefix("XID ") for r in referrers if r.startswith("XID ")]
    xids = [f"XID{'s' if len(codes) > 1 else ''} {', '.join(codes)}"] if codes else []
    actions = [r for r in referrers if r.startswith("action ")]
    rest = [r for r in referrers if not r.startswith(("XID ", "action "))]
    return ", ".join(actions + xids + rest)


def _evidence(finding: Finding) -> str:
    lines = []
    for ev in finding.evidence:
        if ev.line is None:
            lines.append(esc(ev.text))
            continue
        where = f"{ev.source}:{ev.line}" if ev.source else f"line {ev.line}"
        lines.append(f"{esc(where)}: {esc(ev.text)}")
    return "<pre>" + "\n".join(lines) + "</pre>" if lines else ""


def gpu_name(bus: str | None, indexes: Mapping[str, int]) -> str:
    """'GPU 1 (0000:2a:00.0)' for a GPU the driver lists, the bare bus id for one it does not, 'node' for none."""
    if bus is None:
        return "node"
    index = indexes.get(bus)
    return bus if index is None else f"GPU {index} ({bus})"


def used_by(f: Finding) -> str:
    """'<br>used by pod ml/trainer-0 (container main)': who was on the GPU when the finding opened."""
    if not f.workloads:
        return ""
    return f'<br><span class="muted">used by {esc(", ".join(w.describe() for w in f.workloads))}</span>'


def _where(f: Finding, indexes: Mapping[str, int]) -> str:
    where = gpu_name(f.gpu, indexes)
    if f.host:
        where = f"{f.host} {where}"
    if f.rank is not None:
        where += f" (rank {f.rank})"
    return where


def _live_section(found: list[Finding], indexes: Mapping[str, int]) -> str:
    rows = []
    for f in sorted(found, key=lambda f: (f.severity.rank, f.action.rank, f.gpu or "")):
        rows.append(
            f"<tr><td><code>{esc(_where(f, indexes))}</code></td><td>{utc(f.details.get('first_seen'))}</td>"
            f"<td>{utc(f.details.get('last_seen'))}</td><td>{badge(f.severity)}</td>"
            f"<td><b>{esc(f.action.value)}</b></td><td>{f.count}</td>"
            f"<td>{esc(f.title)}{used_by(f)}{_evidence(f)}</td></tr>"
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
        f'<tr><td><code>{esc(cid)}</code></td><td>{esc(c.title)}</td><td><a href="{esc(c.playbook)}">'
        f"{esc(c.playbook)}</a></td></tr>"
        for cid, c in load_conditions().items()
    )
    return (
        "<h2>Telemetry conditions</h2><table><tr><th>Condition</th><th>Meaning</th><th>Runbook</th></tr>\n"
        f"{rows}</table>"
    )


def _index(
    playbooks: Mapping[str, Playbook],
    live: dict[str, list[Finding]],
    note: str,
    conditions: str,
    indexes: Mapping[str, int],
) -> HTMLResponse:
    groups: dict[str, list[str]] = {
        "Actions": [],
        "XID codes": [],
        "Training-log classes": [],
        "Monitoring and other": [],
    }
    for pid in sorted(playbooks, key=lambda pid: _order(playbooks[pid])):
        groups[_group(pid)].append(pid)
    parts = ["<h1>gpu-triage runbooks</h1>", note]
    if live:
        items = "".join(
            f'<li><a href="{esc(pid)}">{esc(playbooks[pid].title)}</a> on '
            f"<b>{esc(', '.join(sorted({_where(f, indexes) for f in found})))}</b></li>"
            for pid, found in sorted(live.items())
            if pid in playbooks
        )
        parts.append(f'<section class="live"><h2>Live on this node now</h2><ul>{items}</ul></section>')
    for name, ids in groups.items():
        if not ids:
            continue
        rows = "\n".join(_index_row(playbooks[pid], len(live.get(pid, []))) for pid in ids)
        parts.append(
            f"<h2>{name}</h2><table><tr><th>Runbook</th><th>Severity</th><th>Action</th><th>Live</th></tr>\n"
            f"{rows}</table>"
        )
    parts.append(conditions)
    return document("gpu-triage runbooks", "\n".join(parts))


def _index_row(p: Playbook, live: int) -> str:
    return (
        f'<tr><td><a href="{esc(p.id)}"><b>{esc(p.title)}</b></a> <code>{esc(p.id)}</code><br>'
        f'<span class="muted">{esc(p.summary)}</span></td><td>{badge(p.severity)}</td>'
        f"<td>{esc(p.action.value)}</td><td>{f'<b>{live}</b>' if live else ''}</td></tr>"
    )


def runbooks_router(
    live_findings: Callable[[], list[Finding]], gpu_indexes: Callable[[], Mapping[str, int]] = dict
) -> APIRouter:
    """`/runbooks/`, `/runbooks/{id}` and `/runbooks/{id}.md`; `live_findings` gives the open findings,
    `gpu_indexes` the NVML index of each PCI bus id, to name the GPUs they are on."""
    playbooks = load_playbooks()  # checked with the rest of the data when the daemon started
    rendered: dict[str, _Page] = {}  # each page on its first request, then kept: the text is fixed
    lock = threading.Lock()

    def page_of(pid: str) -> _Page | None:
        if (page := rendered.get(pid)) is None and (playbook := playbooks.get(pid)) is not None:
            with lock:  # another request may have rendered it while this one waited
                if (page := rendered.get(pid)) is None:
                    page = rendered[pid] = _render(playbook, _referrers().get(pid, []))
        return page

    conditions = _conditions_table()
    valid = sorted(playbooks)
    router = APIRouter(prefix="/runbooks", tags=["runbooks"])

    def not_found(pid: str) -> JSONResponse:
        return error(404, f"no runbook {pid!r}; valid ids: {', '.join(valid)}", valid=valid)

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
        return _index(playbooks, by_playbook, note, conditions, gpu_indexes())

    # Registered before /{pid}, which would otherwise take "xid-79.md" as an id.
    @router.get("/{pid}.md", summary="A runbook's Markdown source", response_model=None)
    def source(pid: str) -> Response:
        playbook = playbooks.get(pid)
        if playbook is None:
            return not_found(pid)
        return Response(playbook.source, media_type="text/markdown; charset=utf-8")

    @router.get("/{pid}", response_class=HTMLResponse, summary="A runbook, with its live findings on top")
    def runbook(pid: str) -> Response:
        page = page_of(pid)
        if page is None:
            return not_found(pid)
        p = page.playbook
        by_playbook, note = live()
        head = (
            f'<nav><a href="./">All runbooks</a> · <a href="{esc(p.id)}.md">Markdown source</a></nav>\n'
            f"<h1>{esc(p.title)}</h1>\n<p>{badge(p.severity)} Action <b>{esc(p.action.value)}</b>: "
            f"{esc(p.action.description)}</p>\n<p><i>{esc(p.summary)}</i></p>"
        )
        found = by_playbook.get(p.id, [])
        live_html = _live_section(found, gpu_indexes()) if found else note
        return document(f"{p.title} (gpu-triage runbook)", f"{head}\n{live_html}\n{page.body_html}")

    return router
