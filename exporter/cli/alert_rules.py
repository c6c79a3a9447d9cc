"""The shipped alert rules (alerts/gpu-triage.rules.yml) as text: where their links point, and their XID list.

Both jobs work on the file's text rather than on parsed YAML, so that its comments, order and layout survive:

- `render` points every `runbook_url` at `<runbook_base>/<id>` (and, if asked, prefixes the relative
  `dashboard_url`s with a Grafana base) for teams that publish the playbooks somewhere other than the
  daemon. By default the links go to the daemon that raised the alert (`http://<instance>/runbooks/<id>`),
  which needs no setup and works on a network that cannot reach a wiki.
- `critical_xid_rules` writes the `GpuXidCritical` rules from the XID catalog (every code of severity
  critical, one rule per playbook so each links its own page) and `update_generated` puts them between the
  file's markers. A test keeps the committed file equal to what the catalog gives; after a catalog change,
  `python -m gpu_triage.exporter.cli.alert_rules alerts/gpu-triage.rules.yml` rewrites the block.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.xid.catalog import XidCatalog
from gpu_triage.diagnosis.xid.catalog_data import load_catalog

BEGIN_MARKER = "# BEGIN generated critical-XID rules"
END_MARKER = "# END generated critical-XID rules"
XID_WINDOW_SECONDS = 3600  # how long after its last occurrence a critical XID keeps its alert, at most
DEFAULT_RUNBOOK_BASE = "http://{{ $labels.instance }}/runbooks"  # the daemon that raised the alert

_RUNBOOK_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# `runbook_url: <value>` / `dashboard_url: <value>` on one line, as every rule in the shipped file has them.
_URL_LINE = re.compile(
    r"^(?P<key>[ \t]*(?:-[ \t]+)?(?P<name>runbook_url|dashboard_url):[ \t]*)(?P<value>.*?)[ \t]*$", re.M
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ACTION = re.compile(r"\{\{.*?\}\}")
_GLUE = "\x00"  # stands for a space that wrapping must not break at
_RULE_INDENT = " " * 6  # rules of a group: `groups:` / `  - name:` / `    rules:` / `      - alert:`
_WHICH_GPU = (
    "{{ if $labels.gpu }}GPU {{ $labels.gpu }} ({{ $labels.uuid }}){{ else }}A GPU the driver no longer lists{{ end }}"
)
_WHICH_GPU_SHORT = "{{ if $labels.gpu }}GPU {{ $labels.gpu }}{{ else }}an unlisted GPU{{ end }}"


def _scalar(value: str, where: int) -> str:
    """The string a one-line YAML scalar stands for (quoted or plain)."""
    if value[:1] in {'"', "'"}:
        loaded = yaml.safe_load(value)
        if not isinstance(loaded, str):
            raise ValueError(f"line {where}: not a string: {value}")
        return loaded
    if not value or value[:1] in {"|", ">", "&", "*", "!"}:
        raise ValueError(f"line {where}: the URL must be written on the key's line, got {value!r}")
    return value


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is a subset of it)."""
    return json.dumps(text, ensure_ascii=False)


def _base(value: str, what: str) -> str:
    """An absolute http(s) URL without its trailing slash: a relative one would make every alert's link
    resolve against whatever page shows it (Alertmanager's, a chat client's), which is no link at all."""
    base = value.strip().rstrip("/")
    if not base or _CONTROL.search(base):
        raise ValueError(f"{what} must be a non-empty URL on one line, got {value!r}")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{what} must be an absolute http:// or https:// URL, got {value!r}")
    return base


def runbook_ids(rules_text: str) -> list[str]:
    """The runbook id at the end of every `runbook_url`, in file order (repeats included)."""
    out = []
    for m in _URL_LINE.finditer(rules_text):
        if m.group("name") == "runbook_url":
            out.append(_runbook_id(_scalar(m.group("value"), _line_of(rules_text, m.start()))))
    return out


def _runbook_id(url: str) -> str:
    rid = url.rsplit("/", 1)[-1]
    if not _RUNBOOK_ID.fullmatch(rid):
        raise ValueError(f"runbook_url {url!r} does not end with a runbook id (lower-case words joined by dashes)")
    return rid


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def render(rules_text: str, runbook_base: str | None, *, dashboard_base: str | None = None) -> str:
    """`rules_text` with every runbook_url set to `<runbook_base>/<id>`; everything else is left as it was.

    `runbook_base` None keeps the links to the daemon. `dashboard_base` (e.g. `https://grafana.example.com`)
    prefixes every relative `dashboard_url`; None leaves them relative. A runbook_url that does not end
    with a runbook id is an error (ValueError), so a hand-edited file cannot silently lose a link.
    """
    rbase = None if runbook_base is None else _base(runbook_base, "the runbook base")
    dbase = None if dashboard_base is None else _base(dashboard_base, "the dashboard base")

    def replace(m: re.Match[str]) -> str:
        value = _scalar(m.group("value"), _line_of(rules_text, m.start()))
        if m.group("name") == "runbook_url":
            rid = _runbook_id(value)
            return m.group("key") + _quoted(f"{rbase}/{rid}") if rbase is not None else m.group(0)
        if dbase is not None and value.startswith("/"):
            return m.group("key") + _quoted(dbase + value)
        return m.group(0)

    out = _URL_LINE.sub(replace, rules_text)
    if rbase is not None:
        # A runbook_url written some other way (a flow mapping, a block scalar) would keep its old link
        # without a word; refuse instead.
        stale = [url for url in _values(out, "runbook_url") if not url.startswith(f"{rbase}/")]
        if stale:
            raise ValueError(f"runbook_url not on a line of its own, left unchanged: {', '.join(stale)}")
    return out


def _values(text: str, key: str) -> list[str]:
    """Every value of `key` in the YAML documents of `text`, at any depth."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == key and isinstance(v, str):
                    found.append(v)
                walk(v)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for document in yaml.safe_load_all(text):
        walk(document)
    return found


def critical_xids(catalog: XidCatalog | None = None) -> dict[tuple[str, Action], list[int]]:
    """The catalog's critical codes, by (playbook, action): one GpuXidCritical rule each, in code order."""
    groups: dict[tuple[str, Action], list[int]] = {}
    for entry in catalog if catalog is not None else load_catalog():
        if entry.severity is Severity.CRITICAL:
            groups.setdefault((entry.playbook, entry.action), []).append(entry.code)
    return groups


def _folded(key: str, text: str, indent: str) -> list[str]:
    """`key: >-` and `text` wrapped under it; folding joins the lines with single spaces, as written.

    Lines are not broken inside a `{{ ... }}` action: it would still work, but no one could read it.
    """
    glued = _ACTION.sub(lambda m: m.group(0).replace(" ", _GLUE), text)
    body = textwrap.wrap(glued, width=116 - len(indent), break_long_words=False, break_on_hyphens=False)
    return [f"{indent}{key}: >-", *(f"{indent}  {line.replace(_GLUE, ' ')}" for line in body)]


def critical_xid_rules(catalog: XidCatalog | None = None) -> str:
    """The generated block: the GpuXidCritical rules, indented as rules of a group, ending with a newline.

    Why the expression looks as it does: `nvidia_gpu_xid_errors_total` is created at 1 by a GPU's first
    XID, so `increase()` would miss that first one; the last-seen timestamp is there from the first XID on.
    The alert drops out as soon as gpu-triage judges the GPU healthy again (an acknowledgement, a GPU reset
    or a reboot closes the XID's finding) and an hour after the last XID at the latest.
    """
    lines = []
    for (playbook, action), codes in critical_xids(catalog).items():
        pattern = "|".join(str(c) for c in codes)
        # No gpu label: the XID came from the kernel log for a GPU the driver no longer lists (it fell off
        # the bus before the daemon started), so there is no index to name or to acknowledge.
        description = (
            f"{_WHICH_GPU} on {{{{ $labels.instance }}}} reported XID {{{{ $labels.xid }}}} "
            "{{ $value | humanizeDuration }} ago. "
            f"{action.description} "
            "`gpu-triage xid {{ $labels.xid }}` on the node explains the code; the findings are at "
            "http://{{ $labels.instance }}/api/v1/diagnosis. The alert clears when gpu-triage sees the GPU healthy "
            "again (after the reset or reboot, or an acknowledgement: POST /api/v1/gpus/<gpu>/acknowledge on the "
            "node) or an hour after the last XID."
        )
        lines += [
            f"{_RULE_INDENT}- alert: GpuXidCritical",
            f"{_RULE_INDENT}  expr: >-",
            f'{_RULE_INDENT}    (time() - nvidia_gpu_xid_last_seen_timestamp_seconds{{xid=~"{pattern}"}}) '
            f"< {XID_WINDOW_SECONDS}",
            f'{_RULE_INDENT}    unless on (job, instance, uuid) nvidia_gpu_health{{status="healthy"}} == 1',
            f"{_RULE_INDENT}  labels:",
            f"{_RULE_INDENT}    severity: critical",
            # Rules that share a name need a label to tell them apart (promtool's duplicate-rules lint).
            f"{_RULE_INDENT}    playbook: {playbook}",
            f"{_RULE_INDENT}  annotations:",
            f'{_RULE_INDENT}    summary: "Critical XID {{{{ $labels.xid }}}} on {_WHICH_GPU_SHORT} '
            f'of {{{{ $labels.instance }}}}"',
            *_folded("description", description, _RULE_INDENT + "    "),
            f"{_RULE_INDENT}    runbook_url: {_quoted(f'{DEFAULT_RUNBOOK_BASE}/{playbook}')}",
            f"{_RULE_INDENT}    dashboard_url: "
            '"/d/gpu-triage-node?var-instance={{ $labels.instance }}&var-gpu={{ $labels.gpu }}"',
        ]
    return "\n".join(lines) + "\n"


def update_generated(rules_text: str, catalog: XidCatalog | None = None) -> str:
    """`rules_text` with the block between the markers replaced by `critical_xid_rules(catalog)`."""
    lines = rules_text.splitlines(keepends=True)
    begin = [i for i, line in enumerate(lines) if line.strip() == BEGIN_MARKER]
    end = [i for i, line in enumerate(lines) if line.strip() == END_MARKER]
    if len(begin) != 1 or len(end) != 1 or begin[0] > end[0]:
        raise ValueError(f"the rules need exactly one {BEGIN_MARKER!r} line followed by one {END_MARKER!r} line")
    return "".join([*lines[: begin[0] + 1], critical_xid_rules(catalog), *lines[end[0] :]])


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the generated block of the rules file(s) named in `argv` in place."""
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m gpu_triage.exporter.cli.alert_rules RULES_FILE...", file=sys.stderr)
        return 2
    for name in paths:
        path = Path(name)
        text = path.read_text(encoding="utf-8")
        updated = update_generated(text)
        if updated != text:
            path.write_text(updated, encoding="utf-8")
            print(f"{path}: critical-XID rules updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
