"""`gpu-triage node-condition`: the node's gpu-triage verdict as the Node condition GpuTriageUnhealthy.

The sidecar of kubernetes/overlays/node-condition. Every --interval seconds it asks the daemon (in the same
pod, with the options `gpu-triage check` has: URL, TLS, basic auth) for its verdict and writes one condition
to its Node's status, the way node-problem-detector does:

    status True     the node is unhealthy; reason = the action in CamelCase (RebootNode, ResetGpu,
                    ContactSupport...), message = the action, the summary, the root cause's runbook and who
                    was on its GPU
    status False    healthy (reason Healthy) or degraded, which needs a look but no drain (reason Degraded)
    status Unknown  the daemon does not answer, a GPU does not, or the daemon cannot read a source its verdict
                    depends on, such as the kernel log (reason NoVerdict / GpuNotAnswering / VerdictIncomplete)

It writes when the condition changes and otherwise every --heartbeat seconds, so a thousand nodes cost the
API server a few writes a second at most. It reaches the API server with the pod's service-account token
(read again for every request: the kubelet rotates a projected token) and patches the status only: it never
cordons, drains, taints or evicts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_triage.diagnosis.core.actions import Action, Health
from gpu_triage.exporter.cli.check import DaemonClient, NoVerdictError
from gpu_triage.exporter.http.api_models import Diagnosis

log = logging.getLogger(__name__)
CONDITION = "GpuTriageUnhealthy"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Condition:
    status: str  # "True", "False" or "Unknown", as Kubernetes spells them
    reason: str
    message: str


def camel(action: str) -> str:
    """REBOOT_NODE -> RebootNode: a condition reason is one CamelCase word."""
    return "".join(part.capitalize() for part in action.split("_")) or "Unknown"


def _root_cause(diagnosis: Diagnosis, action: Action) -> str:
    """' Root cause: <title> (runbook <id>), on pod ml/trainer-0.' for the most urgent finding asking `action`."""
    for finding in diagnosis.findings:
        if finding.action is action:
            on = ", ".join(
                f"pod {w.namespace}/{w.pod}" if w.kind == "pod" else f"Slurm job {w.job_id}" for w in finding.workloads
            )
            return f" Root cause: {finding.title} (runbook {finding.playbook})" + (f", on {on}." if on else ".")
    return ""


def condition_from(diagnosis: Diagnosis | None, error: str = "") -> Condition:
    """The condition for a /api/v1/diagnosis answer, or for none (`error` says why)."""
    if diagnosis is None:
        return Condition("Unknown", "NoVerdict", f"gpu-triage does not answer: {error}"[:MAX_MESSAGE])
    node = diagnosis.node
    health, action, summary = node.health, node.action, node.summary
    if health is Health.UNHEALTHY:
        message = f"{action.value}: {summary}.{_root_cause(diagnosis, action)}"
        return Condition("True", camel(action.value), message[:MAX_MESSAGE])
    if health is Health.UNKNOWN:
        why = "VerdictIncomplete" if node.incomplete else "GpuNotAnswering"
        return Condition("Unknown", why, summary[:MAX_MESSAGE])
    return Condition("False", "Healthy" if health is Health.HEALTHY else "Degraded", summary[:MAX_MESSAGE])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def in_cluster_api_server() -> str:
    """The API server as the kubelet tells every pod (KUBERNETES_SERVICE_HOST and _PORT)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class NodeStatus:
    """GET and strategic-merge PATCH of /api/v1/nodes/<node>/status, with the pod's service-account token."""

    def __init__(self, server: str, node: str, token_file: Path, ca_file: Path | None, timeout: float) -> None:
        self.url = f"{server.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}/status"
        self.token_file = token_file
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca_file) if server.startswith("https:") else None

    def _call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        # Read for every call: the kubelet replaces the projected token before it expires.
        headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            # A strategic merge patch merges status.conditions by type: the kubelet's own conditions (Ready,
            # MemoryPressure...) and other writers' stay as they are.
            headers["Content-Type"] = "application/strategic-merge-patch+json"
        request = urllib.request.Request(self.url, data=data, headers=headers, method=method)
        with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as answer:
            result: dict[str, Any] = json.load(answer)
            return result

    def current(self) -> dict[str, Any] | None:
        """Our condition as the Node has it now, if it has it."""
        conditions = self._call("GET").get("status", {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == CONDITION), None)

    def write(self, condition: Condition, transition: str, heartbeat: str) -> None:
        entry = {
            "type": CONDITION,
            "status": condition.status,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": transition,
            "lastHeartbeatTime": heartbeat,
        }
        self._call("PATCH", {"status": {"conditions": [entry]}})


class Reporter:
    """Remembers what the Node says, so that lastTransitionTime moves only when the status does."""

    def __init__(self, api: NodeStatus, heartbeat: float) -> None:
        self.api = api
        self.heartbeat = heartbeat
        self.written: Condition | None = None
        self.transition: str | None = None
        self.written_at = float("-inf")

    def load(self) -> None:
        existing = self.api.current()
        if existing is not None:
            self.written = Condition(
                str(existing.get("status")), str(existing.get("reason")), str(existing.get("message"))
            )
            self.transition = existing.get("lastTransitionTime")

    def report(self, condition: Condition) -> bool:
        """Write `condition` if it changed or the heartbeat is due; True if it was written."""
        now = _now()
        if self.written is None or self.transition is None or condition.status != self.written.status:
            self.transition = now
        due = time.monotonic() - self.written_at >= self.heartbeat
        if condition == self.written and not due:
            return False
        self.api.write(condition, self.transition, now)
        self.written, self.written_at = condition, time.monotonic()
        return True


@dataclass(frozen=True)
class Options:
    daemon: DaemonClient
    node: str
    interval: float
    heartbeat: float
    api_server: str
    token_file: Path
    api_ca_file: Path | None
    once: bool


def run(options: Options) -> int:
    """Look, write, repeat until SIGTERM; with `once`, one look (exit 1 if it could not be written)."""
    api = NodeStatus(options.api_server, options.node, options.token_file, options.api_ca_file, options.daemon.timeout)
    reporter = Reporter(api, options.heartbeat)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        reporter.load()
    except (OSError, ValueError) as e:
        log.warning(
            "cannot read the node's conditions; writing ours anew", extra={"node": options.node, "error": str(e)}
        )
    while True:
        try:
            condition = condition_from(options.daemon.diagnosis())
        except NoVerdictError as e:
            condition = condition_from(None, str(e))
        try:
            if reporter.report(condition):
                extra = {"node": options.node, "status": condition.status, "reason": condition.reason}
                log.info("condition written", extra=extra)
        except (OSError, ValueError) as e:
            log.error("cannot write the node condition", extra={"node": options.node, "error": str(e)})
            if options.once:
                return 1
        if options.once or stopping.wait(options.interval):
            return 0
