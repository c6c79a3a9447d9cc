"""`gpu-triage check`: the verdict of the daemon on this node, for health-check hooks and scripts.

Exit status 0 healthy (OK), 1 degraded (WARNING), 2 unhealthy (CRITICAL), 3 unknown (including: the daemon
does not answer). `--gpus 0,3` narrows the verdict, the output and the exit status to those GPUs. Formats:

    text    "CRITICAL - 8 GPUs, 7 up; node unhealthy: REBOOT_NODE: GPU 3 Xid 79, GPU 5 lost", then one line per
            finding
    json    a versioned object (`CheckJson`, version 1): the verdict's word, exit status and reason line,
            whether it is incomplete, then the /api/v1/diagnosis body (narrowed with --gpus; null, with
            `error` saying why, when there is no verdict). One top-level key a line, so that a shell
            script can read the scalars with sed (slurm/gpu-triage-healthcheck does)
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, TextIO

import httpx
from pydantic import BaseModel, ValidationError

from gpu_triage.diagnosis.core.actions import Action, Health, most_urgent
from gpu_triage.diagnosis.core.findings import rank_ranges
from gpu_triage.diagnosis.xid.health import EXIT_CODES
from gpu_triage.exporter.cli.report_text import safe
from gpu_triage.exporter.http.api_models import Diagnosis, FindingOut, WorkloadOut
from gpu_triage.exporter.verdict_report import name_blind, name_places

FORMATS = ("text", "json", "reason")
# A verdict is kilobytes (64 GPUs with 30,000 unknown devices: under 100 KiB); more is another server.
MAX_ANSWER_BYTES: Final = 16 << 20
Word = Literal["OK", "WARNING", "CRITICAL", "UNKNOWN"]
NAGIOS: dict[Health, Word] = {
    Health.HEALTHY: "OK",
    Health.DEGRADED: "WARNING",
    Health.UNHEALTHY: "CRITICAL",
    Health.UNKNOWN: "UNKNOWN",
}
_WORST_FIRST = (Health.UNHEALTHY, Health.UNKNOWN, Health.DEGRADED, Health.HEALTHY)
JSON_VERSION: Final = 1  # of CheckJson: a key removed or changed in meaning is a new version; added keys are not


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

    def diagnosis(self) -> Diagnosis:
        """GET /api/v1/diagnosis, parsed as the daemon's model; NoVerdictError when there is none to be had."""
        try:
            verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
            auth = None
            if self.user is not None:
                password = Path(self.password_file).read_text().strip() if self.password_file else ""
                auth = (self.user, password)
            content = self._get(f"{self.base}/api/v1/diagnosis", verify, auth)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError, OSError) as e:
            raise NoVerdictError(f"cannot get a verdict from gpu-triage at {self.base}: {e}") from None
        try:
            return Diagnosis.model_validate_json(content)
        except ValidationError as e:  # another server on the port, or a daemon whose verdict this one cannot read
            raise NoVerdictError(f"gpu-triage at {self.base} answered no verdict: {_first_problem(e)}") from None

    def _get(self, url: str, verify: ssl.SSLContext | bool, auth: tuple[str, str] | None) -> bytes:
        """The body, read within `timeout` in all and up to MAX_ANSWER_BYTES: httpx's timeout bounds each read,
        so a peer that trickles, or answers without end, would otherwise hold `check` (and the node-condition
        sidecar, which asks again and again) for ever, or fill its memory."""
        deadline = time.monotonic() + self.timeout
        with httpx.stream("GET", url, timeout=self.timeout, verify=verify, auth=auth) as answer:
            answer.raise_for_status()
            chunks, size = [], 0
            for chunk in answer.iter_bytes():  # decoded: a compressed answer is bounded by what it unpacks to
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise ValueError(f"the answer is over {MAX_ANSWER_BYTES // (1 << 20)} MiB")
                if time.monotonic() > deadline:
                    raise ValueError(f"the answer took over {self.timeout:g} s")
                chunks.append(chunk)
        return b"".join(chunks)


def _first_problem(e: ValidationError) -> str:
    """'node.health: Field required (+2 more)': where the body is not a verdict, in one line."""
    errors = e.errors(include_url=False, include_input=False)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"[:300]


def select(body: Diagnosis, wanted: list[str]) -> Diagnosis:
    """The verdict of the GPUs `wanted` (NVML indexes or GPU UUIDs) alone: the worst of their health, the most
    urgent of their actions, their findings. A source the daemon cannot read leaves every GPU's verdict
    incomplete. NoVerdictError names any GPU that this node does not have."""
    gpus = [g for g in body.gpus if {str(g.gpu), g.uuid} & set(wanted)]
    known = {str(k) for g in gpus for k in (g.gpu, g.uuid)}
    if missing := [w for w in wanted if w not in known]:
        listed = ", ".join(str(g.gpu) for g in body.gpus)
        raise NoVerdictError(f"no GPU {', '.join(missing)} on this node (it has GPUs {listed or 'none'})")
    incomplete = body.node.incomplete
    healths = {g.health or Health.UNKNOWN for g in gpus}
    if incomplete:
        healths.add(Health.UNKNOWN)
    health = next(h for h in _WORST_FIRST if h in healths)
    action = most_urgent([g.action or Action.IGNORE for g in gpus])
    buses = {g.pci_bus_id for g in gpus}
    places = [p for p in body.node.affected if p.gpu is not None and p.pci_bus_id in buses]
    names = ", ".join(str(g.gpu) for g in gpus)
    summary = f"GPU{'s' if len(gpus) > 1 else ''} {names} of {len(body.gpus)}: {health.value}"
    if named := name_places(places):
        summary += f": {named}"
    if incomplete:
        summary += f"; {name_blind(incomplete)}"
    node = body.node.model_copy(update={"health": health, "action": action, "summary": summary, "affected": places})
    findings = [f for f in body.findings if f.gpu in buses or buses & set(_gpus_of(f))]
    return body.model_copy(update={"node": node, "gpus": gpus, "findings": findings})


def reason(body: Diagnosis) -> str:
    """One line: each action with the places that need it, the root cause and who was there; then what the
    verdict could not see."""
    node = body.node
    parts = []
    if named := name_places(node.affected, who=True):
        parts.append(named)
    elif node.action is not Action.IGNORE and not node.incomplete:
        parts.append(node.action.value)
    if node.incomplete:
        parts.append("INCOMPLETE: " + ", ".join(f"{b.what} ({b.problem})" for b in node.incomplete))
    return " ".join("; ".join(parts or [NAGIOS[node.health]]).split())  # one line, whatever the parts hold


def _text(body: Diagnosis, base: str) -> str:
    """The verdict, then one line per finding that asks for something, most urgent first: an application's Xid
    on many GPUs is one line for them all, the node's own findings (NVSwitches, unknown devices, sources it
    cannot read) name their place."""
    lines = [f"{NAGIOS[body.node.health]} - {body.node.summary}"]
    index = {g.pci_bus_id: g.gpu for g in body.gpus}
    for finding in body.findings:
        lines += _finding_line(_place(finding, index), finding, base)
    # Pod, container and job names are whoever made them: none may add a line or drive the terminal.
    return "\n".join(safe(line) for line in lines) + "\n"


def _place(finding: FindingOut, index: dict[str | None, int]) -> str:
    details = finding.details
    if (bus := finding.gpu) is not None:
        where = f"GPU {index[bus]}" if bus in index else bus
        return where + (f" instance {details['gpu_instance']}" if "gpu_instance" in details else "")
    if gpus := _gpus_of(finding):
        numbers = [index[b] for b in gpus if b in index]
        return f"GPUs {rank_ranges(numbers)}" if len(numbers) == len(gpus) else "GPUs " + ", ".join(gpus)
    if finding.class_id.startswith("sxid"):
        return "NVSwitch"
    return str(details.get("pci_bus_id") or "gpu-triage")


def _gpus_of(finding: FindingOut) -> list[str]:
    """The bus ids of a finding folded across GPUs (diagnosis/training/findings/fold.py), or none."""
    listed = finding.details.get("gpus")
    return [b for b in str(listed).split(", ") if b] if listed else []


def _finding_line(where: str, finding: FindingOut, base: str) -> list[str]:
    if finding.action is Action.IGNORE:
        return []
    line = f"  {where}: {finding.title} [{finding.severity.value}] -> {finding.action.value}"
    line += f" (runbook: {base}/runbooks/{finding.playbook})"
    if who := ", ".join(_describe(w) for w in finding.workloads):
        line += f"; used by {who}"
    return [line]


def _describe(w: WorkloadOut) -> str:
    if w.kind == "pod":
        return f"pod {w.namespace}/{w.pod} (container {w.container})"
    step = f" step {w.step}" if w.step else ""
    return f"Slurm job {w.job_id}{step}" + (f" ({w.user})" if w.user else "")


class CheckJson(BaseModel):
    """What `gpu-triage check --format json` prints (version 1): the verdict's word, exit status and reason
    line first, one top-level key a line, then the /api/v1/diagnosis body it judged (narrowed with --gpus)."""

    version: Literal[1]
    status: Word
    exit_code: int
    health: Health
    action: Action
    reason: str  # as --format reason prints it
    incomplete: bool  # a source the verdict depends on cannot be read
    error: str | None  # why there is no verdict (then `diagnosis` is null)
    selected: list[str] | None  # --gpus
    diagnosis: Diagnosis | None


def check_json(body: Diagnosis | None, wanted: list[str], error: str | None = None) -> str:
    if body is None:
        health, action, line, blind = Health.UNKNOWN, Action.IGNORE, f"UNKNOWN - {error}", False
    else:
        health, action, line, blind = body.node.health, body.node.action, reason(body), bool(body.node.incomplete)
    out = CheckJson(
        version=JSON_VERSION,
        status=NAGIOS[health],
        exit_code=EXIT_CODES[health],
        health=health,
        action=action,
        reason=safe(line),
        incomplete=blind,
        error=error,
        selected=wanted or None,
        diagnosis=body,
    )
    # exclude_unset: the body keeps what the daemon left out (every key of CheckJson itself is always set).
    return json.dumps(out.model_dump(mode="json", by_alias=True, exclude_unset=True), indent=2) + "\n"


def performance_lines(body: Diagnosis, base: str) -> list[str]:
    """The performance section as text lines (the GPUs `select` kept, when --gpus narrowed the verdict)."""
    perf = body.performance
    if perf is None:
        return ["performance: not reported by this daemon"]
    if not perf.judged:
        return ["performance: judging (the first window is not over)"]
    kept = {g.gpu for g in body.gpus}
    lines = []
    for gpu in perf.gpus:
        if gpu.gpu not in kept:
            continue
        for f in gpu.findings:
            who = ", ".join(_describe(w) for w in f.workloads)
            line = f"  GPU {gpu.gpu}: {f.class_id} [{f.severity.value}] {f.summary}"
            lines.append(line + (f"; used by {who}" if who else "") + f" (runbook: {base}/runbooks/{f.playbook})")
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
            out.write(check_json(None, wanted, message))
        else:
            out.write(f"UNKNOWN - {safe(message)}\n")
        return EXIT_CODES[Health.UNKNOWN]
    health = body.node.health
    if fmt == "json":
        out.write(check_json(body, wanted))
    elif fmt == "reason":
        out.write(safe(reason(body)) + "\n")
    else:
        out.write(_text(body, daemon.base))
        if performance:
            out.write("".join(safe(line) + "\n" for line in performance_lines(body, daemon.base)))
    return EXIT_CODES[health]
