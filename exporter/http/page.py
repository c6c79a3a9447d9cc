"""What the HTML pages (`/` and `/runbooks/`) share: one self-contained look, escaping, badges, times.

The pages are opened from a phone at night, often on a network that cannot reach the internet: no
external CSS, JS or fonts. Everything shown that came from a log line or the driver is escaped, and the
Content-Security-Policy forbids scripts should an escape ever be missed.
"""

from __future__ import annotations

import html

from fastapi.responses import HTMLResponse

from gpu_triage.diagnosis.core.actions import Health, Severity
from gpu_triage.exporter.verdict_report import iso_time

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:72em;margin:1.5em auto;padding:0 1em;color:#222}
h1{font-size:1.6em;margin:.3em 0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
code,pre{font:13px/1.4 ui-monospace,monospace;background:#f4f4f4}code{padding:0 .2em}
pre{padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #ddd;padding:.3em .5em;text-align:left;
vertical-align:top}th{background:#f4f4f4}a{color:#0645ad}nav{font-size:.9em;color:#555}
.sev{display:inline-block;padding:0 .5em;border-radius:.3em;color:#fff;font-size:.85em;font-weight:600}
.sev-critical,.sev-unhealthy{background:#c0392b}.sev-warning,.sev-degraded{background:#d68910}
.sev-info{background:#2874a6}.sev-healthy{background:#1e8449}.sev-unknown{background:#666}
.live{border:2px solid #c0392b;border-radius:.4em;padding:0 1em 1em;background:#fdf2f0}
.live h2{border:0;margin-top:.6em;color:#c0392b}.muted{color:#666;font-size:.9em}
.verdict{border-left:.5em solid #666;padding:.4em 1em;background:#f6f6f6;margin:1em 0}
.verdict h2{border:0;margin:.2em 0}.verdict-unhealthy{border-color:#c0392b;background:#fdf2f0}
.verdict-degraded{border-color:#d68910;background:#fef5e7}.verdict-healthy{border-color:#1e8449;background:#eafaf1}
.verdict-unknown{border-color:#7d3c98;background:#f5eef8}
.incomplete{border:2px solid #7d3c98;border-radius:.4em;padding:0 1em;margin:.4em 0;background:#fff}
tr.gpu-unhealthy td:first-child{box-shadow:inset .3em 0 #c0392b}
tr.gpu-degraded td:first-child{box-shadow:inset .3em 0 #d68910}
ul.findings{margin:0;padding-left:1.1em}#gpus td:first-child,#gpus td:nth-child(3){white-space:nowrap}
#gpus code{font-size:12px}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def badge(level: Severity | Health) -> str:
    """A coloured label for a severity (critical, warning, ...) or a health (unhealthy, degraded, ...)."""
    return f'<span class="sev sev-{esc(level.value)}">{esc(level.value)}</span>'


def utc(seconds: float | str | int | None) -> str:
    """Unix seconds as the API writes them (`first_seen_iso`), so a time on a page can be searched for in
    its JSON; anything else is shown as it came, escaped."""
    if seconds is None:
        return "—"
    try:
        return iso_time(float(seconds))
    except (ValueError, OverflowError, OSError):
        return esc(seconds)


def document(title: str, body: str) -> HTMLResponse:
    page = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
    return HTMLResponse(page, headers={"Content-Security-Policy": CSP})
