"""The one-shot commands: `gpu-triage xid` (explain a code) and `gpu-triage check` (for health-check hooks)."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any, TextIO

import httpx

from diagnosis.actions import Action, Health
from diagnosis.health import EXIT_CODES
from exporter.diagnosis_api import xid_json

_NAGIOS = {Health.HEALTHY: "OK", Health.DEGRADED: "WARNING", Health.UNHEALTHY: "CRITICAL", Health.UNKNOWN: "UNKNOWN"}


def explain_xid(code: int, as_json: bool, out: TextIO = sys.stdout) -> int:
    from fastapi import HTTPException

    try:
        entry = xid_json(code)
    except HTTPException as e:
        print(f"gpu-triage: {e.detail}", file=sys.stderr)
        return 1
    if as_json:
        json.dump(entry, out, indent=2)
        out.write("\n")
        return 0
    wrap = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="    ")
    lines = [
        f"Xid {entry['xid']}  {entry['mnemonic']}",
        *wrap.wrap(entry["title"]),
        f"  severity: {entry['severity']}    action: {entry['action']}",
        *wrap.wrap(entry["action_description"]),
        "  likely causes:",
        *(wrap.fill(f"- {cause}") for cause in entry["causes"]),
        f"  NVIDIA's buckets: immediate {entry['nvidia_immediate_bucket'] or '-'}, "
        f"investigatory {entry['nvidia_investigatory_bucket'] or '-'}",
    ]
    if entry["deviation"]:
        lines += wrap.wrap(f"why we differ: {entry['deviation']}")
    if entry["context"]:
        lines.append(f"  the verdict also weighs: {', '.join(entry['context'])}")
    lines.append(f"  playbook: {entry['runbook']}  (curl localhost:9481{entry['runbook']}.md)")
    out.write("\n".join(lines) + "\n")
    return 0


def check(url: str, timeout: float, as_json: bool, out: TextIO = sys.stdout) -> int:
    """The node verdict from the local daemon: exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    try:
        answer = httpx.get(f"{url.rstrip('/')}/api/v1/diagnosis", timeout=timeout)
        answer.raise_for_status()
        body: dict[str, Any] = answer.json()
        health = Health(body["node"]["health"])
    except (httpx.HTTPError, ValueError, KeyError) as e:
        out.write(f"UNKNOWN - cannot get a verdict from gpu-triage at {url}: {e}\n")
        return EXIT_CODES[Health.UNKNOWN]
    if as_json:
        json.dump(body, out, indent=2)
        out.write("\n")
        return EXIT_CODES[health]
    out.write(f"{_NAGIOS[health]} - {body['node']['summary']}\n")
    for gpu in body["gpus"]:
        for finding in gpu.get("findings", []):
            if finding["action"] == Action.IGNORE.value:
                continue
            where = f"GPU {gpu['gpu']}" if gpu["gpu"] is not None else gpu.get("pci_bus_id", "?")
            out.write(f"  {where}: {finding['title']} [{finding['severity']}] -> {finding['action']}")
            out.write(f" (runbook: {url.rstrip('/')}/runbooks/{finding['playbook']})\n")
    return EXIT_CODES[health]
