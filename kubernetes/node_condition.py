#!/usr/bin/env python3
"""gpu-triage-node-condition: the node's gpu-triage verdict as the Node condition GpuTriageUnhealthy.

The sidecar of kubernetes/overlays/node-condition. Every --interval seconds it asks the daemon in the same
pod for /api/v1/diagnosis and writes one condition to its Node's status, the way node-problem-detector
does:

    status True     the node is unhealthy; reason = the action in CamelCase (RebootNode, ResetGpu,
                    ContactSupport...), message = the action, the summary and the root cause's runbook
    status False    healthy (reason Healthy) or degraded, which needs a look but no drain (reason Degraded)
    status Unknown  the daemon does not answer, or a GPU does not (reason NoVerdict / GpuNotAnswering)

It writes when the condition changes and otherwise every --heartbeat seconds, so a thousand nodes cost the
API server a few writes a second at most. It patches the status only: it never cordons, drains, taints or
evicts. The image installs it as /opt/gpu-triage/bin/gpu-triage-node-condition (kubernetes/Containerfile).

Standard library only: it needs nothing the image does not already have.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def _root_cause(diagnosis: dict[str, Any], action: str) -> str:
    """' Root cause: <title> (runbook <id>)' for the most urgent finding that asks for `action`."""
    for finding in diagnosis.get("findings", []):
        if finding.get("action") == action:
            return f" Root cause: {finding.get('title', '?')} (runbook {finding.get('playbook', '?')})."
    return ""


def condition_from(diagnosis: dict[str, Any] | None, error: str = "") -> Condition:
    """The condition for a /api/v1/diagnosis answer, or for none (`error` says why)."""
    if diagnosis is None:
        return Condition("Unknown", "NoVerdict", f"gpu-triage does not answer: {error}"[:MAX_MESSAGE])
    node = diagnosis["node"]
    health, action, summary = str(node["health"]), str(node["action"]), str(node["summary"])
    if health == "unhealthy":
        message = f"{action}: {summary}.{_root_cause(diagnosis, action)}"
        return Condition("True", camel(action), message[:MAX_MESSAGE])
    if health == "unknown":
        return Condition("Unknown", "GpuNotAnswering", summary[:MAX_MESSAGE])
    return Condition("False", "Healthy" if health == "healthy" else "Degraded", summary[:MAX_MESSAGE])


def fetch_diagnosis(url: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/diagnosis", timeout=timeout) as answer:
            body: dict[str, Any] = json.load(answer)
        str(body["node"]["health"])  # a body without a verdict is no answer (KeyError, TypeError)
        return body, ""
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, str(e)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _log(level: str, msg: str, **fields: str) -> None:
    extra = "".join(f" {k}={json.dumps(v)}" for k, v in fields.items())
    print(f"level={level} msg={json.dumps(msg)}{extra}", file=sys.stderr, flush=True)


def _api_server() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-triage-node-condition", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--url", default="http://127.0.0.1:9481", help="the gpu-triage daemon")
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"), help="this node's name (env NODE_NAME)")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between looks at the daemon")
    parser.add_argument("--heartbeat", type=float, default=300.0, help="rewrite an unchanged condition this often")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the daemon or the API")
    parser.add_argument("--api-server", default=None, help="default: the in-cluster API server")
    parser.add_argument("--token-file", type=Path, default=SERVICE_ACCOUNT / "token")
    parser.add_argument("--ca-file", type=Path, default=SERVICE_ACCOUNT / "ca.crt")
    parser.add_argument("--once", action="store_true", help="write the condition once and exit (1: not written)")
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("no node name: give --node or set NODE_NAME (the pod's spec.nodeName)")
    api = NodeStatus(args.api_server or _api_server(), args.node, args.token_file, args.ca_file, args.timeout)
    reporter = Reporter(api, args.heartbeat)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        reporter.load()
    except (OSError, ValueError) as e:
        _log("warn", "cannot read the node's conditions; writing ours anew", node=args.node, error=str(e))
    while True:
        diagnosis, error = fetch_diagnosis(args.url, args.timeout)
        condition = condition_from(diagnosis, error)
        try:
            if reporter.report(condition):
                _log("info", "condition written", node=args.node, status=condition.status, reason=condition.reason)
        except (OSError, ValueError) as e:
            _log("error", "cannot write the node condition", node=args.node, error=str(e))
            if args.once:
                return 1
        if args.once or stopping.wait(args.interval):
            return 0


if __name__ == "__main__":
    sys.exit(main())
