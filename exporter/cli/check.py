"""`gpu-triage check`: the verdict of the daemon on this node, for health-check hooks and scripts.

Exit status 0 healthy (OK), 1 degraded (WARNING), 2 unhealthy (CRITICAL), 3 unknown (including: the daemon
does not answer). `--gpus 0,3` narrows the verdict, the output and the exit status to those GPUs. Formats:

    text    "CRITICAL - 8 GPUs, 7 up; node unhealthy: REBOOT_NODE: GPU 3 Xid 79, GPU 5 lost", then one line per
            finding
    json    the /api/v1/diagnosis body (narrowed with --gpus); with no verdict, the same shape saying why
    reason  one line for a drain reason or a refused job: "REBOOT_NODE: GPU 3 Xid 79 job 4242, GPU 5 lost"; a
            verdict that could not see everything starts "INCOMPLETE"

`--performance` adds to the text the performance findings (why a job is slow, which GPUs are held idle), one
line each, after the verdict's. They never change the exit status, and never go into a drain reason.

A daemon that cannot read a source its verdict depends on (the kernel log, the driver's events, its
journal) answers an incomplete verdict: `unknown` unless something it did see is worse, exit 3, and the
line names the source and what to do.
"""

from __future__ import annotations

import json
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from gpu_triage.diagnosis.core.actions import Action, Health, most_urgent
from gpu_triage.diagnosis.core.findings import rank_ranges
from gpu_triage.diagnosis.xid.health import EXIT_CODES
from gpu_triage.exporter.cli.report_text import safe
from gpu_triage.exporter.verdict_report import name_blind, name_places

FORMATS = ("text", "json", "reason")
NAGIOS = {Health.HEALTHY: "OK", Health.DEGRADED: "WARNING", Health.UNHEALTHY: "CRITICAL", Health.UNKNOWN: "UNKNOWN"}
_WORST_FIRST = (Health.UNHEALTHY, Health.UNKNOWN, Health.DEGRADED, Health.HEALTHY)


class NoVerdictError(Exception):
    """The daemon could not be asked, or did not say (the message says which, in one line)."""


@dataclass(frozen=True)
class DaemonClient:
    """How to reach the daemon: `gpu-triage check` and `gpu-triage node-condition` share these options."""

    url: str = "http://127.0.0.1:9481"
    timeout: float = 5.0
    ca_file: str | None = None
    user: str | None = None
    password_file: str | None = None

    @property
    def base(self) -> str:
        url = self.url if "://" in self.url else f"http://{self.url}"  # `localhost:9481`, as typed for curl
        return url.rstrip("/")

    def diagnosis(self) -> dict[str, Any]:
        """GET /api/v1/diagnosis; NoVerdictError when there is none to be had."""
        try:
            verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
            auth = None
            if self.user is not None:
                password = Path(self.password_file).read_text().strip() if self.password_file else ""
                auth = (self.user, password)
            answer = httpx.get(f"{self.base}/api/v1/diagnosis", timeout=self.timeout, verify=verify, auth=auth)
            answer.raise_for_status()
            body: dict[str, Any] = answer.json()
            Health(body["node"]["health"])  # a body without a verdict is no answer
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, KeyError, TypeError, OSError) as e:
            raise NoVerdictError(f"cannot get a verdict from gpu-triage at {self.base}: {e}") from None
        return body


def select(body: dict[str, Any], wanted: list[str]) -> dict[str, Any]:
    """The verdict of the GPUs `wanted` (NVML indexes or GPU UUIDs) alone: the worst of their health, the most
    urgent of their actions, their findings. A source the daemon cannot read leaves every GPU's verdict
    incomplete. NoVerdictError names any GPU that this node does not have."""
    gpus = [g for g in body["gpus"] if {str(g.get("gpu")), str(g.get("uuid"))} & set(wanted)]
    known = {str(g.get(k)) for g in gpus for k in ("gpu", "uuid")}
    if missing := [w for w in wanted if w not in known]:
        listed = ", ".join(str(g["gpu"]) for g in body["gpus"] if g.get("gpu") is not None)
        raise NoVerdictError(f"no GPU {', '.join(missing)} on this node (it has GPUs {listed or 'none'})")
    incomplete = body["node"].get("incomplete") or []
    healths = {Health(g.get("health", Health.UNKNOWN.value)) for g in gpus}
    if incomplete:
        healths.add(Health.UNKNOWN)
    health = next(h for h in _WORST_FIRST if h in healths)
    action = most_urgent([Action(g.get("action", Action.IGNORE.value)) for g in gpus])
    buses = {g.get("pci_bus_id") for g in gpus}
    places = [p for p in body["node"].get("affected") or [] if p.get("gpu") is not None and p["pci_bus_id"] in buses]
    names = ", ".join(str(g["gpu"]) for g in gpus)
    summary = f"GPU{'s' if len(gpus) > 1 else ''} {names} of {len(body['gpus'])}: {health.value}"
    if named := name_places(places):
        summary += f": {named}"
    if incomplete:
        summary += f"; {name_blind(incomplete)}"
    node = {**body["node"], "health": health.value, "action": action.value, "summary": summary, "affected": places}
    return {
        **body,
        "node": node,
        "gpus": gpus,
        "findings": [f for f in body["findings"] if f.get("gpu") in buses or buses & set(_gpus_of(f))],
        "selected": wanted,
    }


def reason(body: dict[str, Any]) -> str:
    """One line: each action with the places that need it, the root cause and who was there; then what the
    verdict could not see."""
    node = body["node"]
    health, action = Health(node["health"]), Action(node["action"])
    parts = []
    incomplete = node.get("incomplete")
    if named := name_places(node.get("affected") or [], who=True):
        parts.append(named)
    elif action is not Action.IGNORE and not incomplete:
        parts.append(action.value)
    if incomplete:
        parts.append("INCOMPLETE: " + ", ".join(f"{b['what']} ({b['problem']})" for b in incomplete))
    return " ".join("; ".join(parts or [NAGIOS[health]]).split())  # one line, whatever the parts hold


def _text(body: dict[str, Any], base: str) -> str:
    """The verdict, then one line per finding that asks for something, most urgent first: an application's Xid
    on many GPUs is one line for them all, the node's own findings (NVSwitches, unknown devices, sources it
    cannot read) name their place."""
    lines = [f"{NAGIOS[Health(body['node']['health'])]} - {body['node']['summary']}"]
    index = {g.get("pci_bus_id"): g.get("gpu") for g in body["gpus"]}
    for finding in body["findings"]:
        lines += _finding_line(_place(finding, index), finding, base)
    # Pod, container and job names are whoever made them: none may add a line or drive the terminal.
    return "\n".join(safe(line) for line in lines) + "\n"


def _place(finding: dict[str, Any], index: dict[Any, Any]) -> str:
    details = finding.get("details", {})
    if (bus := finding.get("gpu")) is not None:
        where = f"GPU {index[bus]}" if index.get(bus) is not None else str(bus)
        return where + (f" instance {details['gpu_instance']}" if "gpu_instance" in details else "")
    if gpus := _gpus_of(finding):
        numbers = [index[b] for b in gpus if index.get(b) is not None]
        return f"GPUs {rank_ranges(numbers)}" if len(numbers) == len(gpus) else "GPUs " + ", ".join(gpus)
    if str(finding.get("class", "")).startswith("sxid"):
        return "NVSwitch"
    return str(details.get("pci_bus_id") or "gpu-triage")


def _gpus_of(finding: dict[str, Any]) -> list[str]:
    """The bus ids of a finding folded across GPUs (diagnosis/training/findings/fold.py), or none."""
    listed = finding.get("details", {}).get("gpus")
    return [b for b in str(listed).split(", ") if b] if listed else []


def _finding_line(where: str, finding: dict[str, Any], base: str) -> list[str]:
    if finding["action"] == Action.IGNORE.value:
        return []
    line = f"  {where}: {finding['title']} [{finding['severity']}] -> {finding['action']}"
    line += f" (runbook: {base}/runbooks/{finding['playbook']})"
    if who := ", ".join(_describe(w) for w in finding.get("workloads", [])):
        line += f"; used by {who}"
    return [line]


def _describe(w: dict[str, Any]) -> str:
    if w.get("kind") == "pod":
        return f"pod {w.get('namespace')}/{w.get('pod')} (container {w.get('container')})"
    step = f" step {w['step']}" if w.get("step") else ""
    return f"Slurm job {w.get('job_id')}{step}" + (f" ({w['user']})" if w.get("user") else "")


def no_verdict(message: str) -> dict[str, Any]:
    """What --format json prints when there is no verdict: the same shape, unknown, and why."""
    return {
        "node": {"health": Health.UNKNOWN.value, "action": Action.IGNORE.value, "summary": message},
        "gpus": [],
        "findings": [],
        "error": message,
    }


def performance_lines(body: dict[str, Any], base: str) -> list[str]:
    """The performance section as text lines (the GPUs `select` kept, when --gpus narrowed the verdict)."""
    perf = body.get("performance")
    if not isinstance(perf, dict):
        return ["performance: not reported by this daemon"]
    if not perf.get("judged"):
        return ["performance: judging (the first window is not over)"]
    kept = {g.get("gpu") for g in body["gpus"]}
    lines = []
    for gpu in perf.get("gpus", []):
        if gpu.get("gpu") not in kept:
            continue
        for f in gpu.get("findings", []):
            who = ", ".join(_describe(w) for w in f.get("workloads", []))
            line = f"  GPU {gpu['gpu']}: {f['class']} [{f['severity']}] {f['summary']}"
            lines.append(line + (f"; used by {who}" if who else "") + f" (runbook: {base}/runbooks/{f['playbook']})")
    return ["performance:" + ("" if lines else " no finding"), *lines]


def check(
    daemon: DaemonClient,
    fmt: str = "text",
    gpus: str | None = None,
    out: TextIO = sys.stdout,
    *,
    performance: bool = False,
) -> int:
    """Print the verdict in `fmt` and return the exit status for it (`performance` adds lines, never changes it)."""
    wanted = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else []
    try:
        body = daemon.diagnosis()
        if wanted:
            body = select(body, wanted)
    except NoVerdictError as e:
        message = str(e)
        if fmt == "json":
            out.write(json.dumps(no_verdict(message), indent=2) + "\n")
        else:
            out.write(f"UNKNOWN - {safe(message)}\n")
        return EXIT_CODES[Health.UNKNOWN]
    health = Health(body["node"]["health"])
    if fmt == "json":
        out.write(json.dumps(body, indent=2) + "\n")
    elif fmt == "reason":
        out.write(safe(reason(body)) + "\n")
    else:
        out.write(_text(body, daemon.base))
        if performance:
            out.write("".join(safe(line) + "\n" for line in performance_lines(body, daemon.base)))
    return EXIT_CODES[health]
