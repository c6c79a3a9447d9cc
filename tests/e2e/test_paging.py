"""The paging path, end to end: simulated GPU faults become Alertmanager notifications that link playbooks.

gpu-triage runs on the simulator; a real Prometheus scrapes it every second and evaluates the shipped rules;
a real Alertmanager routes with the shipped example config, its receivers all pointed at a webhook this test
serves. Faults go in through the simulator's API, exactly as an operator would try them; what comes out is
checked where the on-call engineer would see it: the notifications.
"""

from __future__ import annotations

import contextlib
import functools
import html
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpu_triage.diagnosis.core.playbooks import load_playbooks
from tests.e2e.servers import Server, alertmanager, gpu_triage, prometheus, query, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "gpu-triage.rules.yml"
AM_CONFIG = REPO / "alerts" / "alertmanager.yml"
HOLD = "2s"  # every `for:` of the rules, in the copy this test loads
TIMEOUT = 30.0

Key = tuple[str, str]  # (alertname, gpu)


class Webhook:
    """Alertmanager's notifications as they arrive: one entry per POSTed alert group."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.url = ""

    def alerts(self) -> list[tuple[str, dict[str, Any]]]:
        """(receiver, alert) for every alert of every notification so far."""
        with self.lock:
            return [(p["receiver"], a) for p in self.payloads for a in p["alerts"]]

    def seen(self, status: str) -> dict[Key, tuple[str, dict[str, Any]]]:
        """The alerts seen with `status` (firing / resolved), by (alertname, gpu): receiver and alert."""
        return {
            (a["labels"]["alertname"], a["labels"].get("gpu", "")): (receiver, a)
            for receiver, a in self.alerts()
            if a["status"] == status
        }

    def wait(self, status: str, keys: set[Key]) -> dict[Key, tuple[str, dict[str, Any]]]:
        """`seen(status)` once it holds every one of `keys`."""

        def complete() -> dict[Key, tuple[str, dict[str, Any]]] | None:
            seen = self.seen(status)
            return seen if keys <= set(seen) else None

        try:
            result: dict[Key, tuple[str, dict[str, Any]]] = wait_for(complete, TIMEOUT, what=f"{status} {keys}")
        except AssertionError:
            missing = sorted(keys - set(self.seen(status)))
            raise AssertionError(f"no {status} notification for {missing}; got {self.summary()}") from None
        return result

    def summary(self) -> list[str]:
        return [
            f"{r}:{a['status']}:{a['labels'].get('alertname')}/{a['labels'].get('gpu', '')}" for r, a in self.alerts()
        ]


@contextlib.contextmanager
def webhook() -> Iterator[Webhook]:
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with hook.lock:
                hook.payloads.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's output is the assertions, not an access log

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def fast_rules(tmp_path: Path) -> Path:
    """The shipped rules with every `for:` cut to seconds.

    The hold times (1 minute to 6 hours) are what promtool's unit tests check; here they would only make the
    test take minutes. Everything else, the expressions and annotations included, is the shipped file.
    """
    text, count = re.subn(r"^([ \t]+for:[ \t]*)\S+", rf"\g<1>{HOLD}", RULES.read_text(encoding="utf-8"), flags=re.M)
    assert count > 0
    path = tmp_path / "gpu-triage.rules.yml"
    path.write_text(text, encoding="utf-8")
    return path


def fast_alertmanager(hook: Webhook) -> dict[str, Any]:
    """The example config with notifications flushed within a second and every receiver sent to `hook`.

    The receivers keep their names, so each notification says which route it took.
    """
    config: dict[str, Any] = yaml.safe_load(AM_CONFIG.read_text(encoding="utf-8"))
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    for route in config["route"]["routes"]:
        route.pop("repeat_interval", None)
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{hook.url}/{r['name']}", "send_resolved": True}]}
        for r in config["receivers"]
    ]
    return config


def inject(daemon: Server, gpu: int, kind: str, **fields: Any) -> str:
    answer = httpx.post(f"{daemon.url}/api/v1/sim/faults", json={"gpu": gpu, "kind": kind, **fields}, timeout=10)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def clear(daemon: Server, fault_id: str) -> None:
    httpx.delete(f"{daemon.url}/api/v1/sim/faults/{fault_id}", timeout=10).raise_for_status()


def acknowledge(daemon: Server, gpu: int) -> None:
    answer = httpx.post(f"{daemon.url}/api/v1/gpus/{gpu}/acknowledge", json={"note": "paging e2e"}, timeout=10)
    answer.raise_for_status()


def am_alerts(am: Server, alertname: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{am.url}/api/v2/alerts", params={"filter": f'alertname="{alertname}"'}, timeout=10)
    answer.raise_for_status()
    alerts: list[dict[str, Any]] = answer.json()
    return alerts


def suppressed(am: Server, alertname: str) -> list[dict[str, Any]]:
    return [a for a in am_alerts(am, alertname) if a["status"]["state"] == "suppressed"]


def test_faults_page_with_runbooks_and_resolve(tmp_path: Path) -> None:
    with (
        gpu_triage(tmp_path) as daemon,
        webhook() as hook,
        alertmanager(tmp_path, fast_alertmanager(hook)) as am,
        prometheus(
            tmp_path,
            [daemon.url.removeprefix("http://")],
            rule_files=[fast_rules(tmp_path)],
            alertmanager=am.url.removeprefix("http://"),
        ) as prom,
    ):
        instance = daemon.url.removeprefix("http://")

        # A healthy node: Prometheus has the rules and the data, evaluates for longer than any hold, and
        # nothing is pending or firing.
        wait_for(lambda: len(query(prom, "nvidia_gpu_up == 1")) == 8, TIMEOUT, what="8 GPUs up in Prometheus")
        wait_for(lambda: query(prom, "count_over_time(nvidia_gpu_up[10s]) >= 3"), TIMEOUT, what="3 scrapes")
        rules = httpx.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        assert {g["name"] for g in rules} >= {"gpu-triage.actions", "gpu-triage.xid", "gpu-triage.hardware"}
        assert query(prom, "ALERTS") == [], "a healthy node raised alerts"
        assert hook.alerts() == []

        # 1. An Xid 79 on GPU 1, its first XID ever (the journal is new): the counter series is born at 1,
        #    which increase() would miss. What happened and what to do both page; the GPU falls off the bus
        #    with it, as a real one does.
        faults = {"xid79": inject(daemon, 1, "xid", xid=79)}
        hook.wait("firing", {("GpuNodeRebootRequired", "1")})
        [fallen] = [
            f for f in httpx.get(f"{daemon.url}/api/v1/sim/faults", timeout=10).json()["faults"] if f["gpu"] == 1
        ]
        assert fallen["kind"] == "gpu_lost"
        faults["fallen"] = fallen["id"]

        # 2. With the reboot page up: an Xid 48 with a failed row remap on GPU 2, a thermal slowdown on GPU 3,
        #    GPU 4 falling off the bus.
        faults["xid48"] = inject(daemon, 2, "xid", xid=48)
        faults["remap"] = inject(daemon, 2, "row_remap_failure")
        faults["thermal"] = inject(daemon, 3, "thermal_slowdown")
        faults["lost"] = inject(daemon, 4, "gpu_lost")
        expected = {
            ("GpuXidCritical", "1"): ("critical", "pager", "xid-79"),
            ("GpuLost", "1"): ("critical", "pager", "xid-79"),
            ("GpuNodeRebootRequired", "1"): ("critical", "pager", "reboot-node"),
            ("GpuXidCritical", "2"): ("critical", "pager", "xid-48"),
            ("GpuRowRemapFailure", "2"): ("critical", "pager", "xid-64"),
            ("GpuRmaRequired", "2"): ("critical", "pager", "contact-support"),
            ("GpuThermalSlowdown", "3"): ("warning", "ticket", "check-cooling"),
            ("GpuLost", "4"): ("critical", "pager", "xid-79"),
            ("GpuNodeRebootRequired", "4"): ("critical", "pager", "reboot-node"),
        }
        firing = hook.wait("firing", set(expected))
        for key, (severity, receiver, runbook) in expected.items():
            got_receiver, alert = firing[key]
            labels = alert["labels"]
            assert (labels["alertname"], labels["gpu"]) == key
            assert (labels["severity"], labels["instance"], got_receiver) == (severity, instance, receiver), alert
            assert alert["annotations"]["runbook_url"] == f"http://{instance}/runbooks/{runbook}"
            assert f"GPU {key[1]}" in alert["annotations"]["description"]
        assert firing[("GpuXidCritical", "1")][1]["labels"]["xid"] == "79"
        assert firing[("GpuXidCritical", "2")][1]["labels"]["xid"] == "48"
        # Nothing else: the hot GPU may also cross the temperature threshold while the test runs.
        assert set(firing) - set(expected) <= {("GpuTemperatureHigh", "3")}, sorted(firing)

        # Every link opens the playbook it names, served by the daemon that raised the alert.
        playbooks = load_playbooks()
        for url in sorted({alert["annotations"]["runbook_url"] for _, alert in firing.values()}):
            page = httpx.get(url, timeout=10)
            assert page.status_code == 200, f"{url}: {page.status_code} {page.text[:200]}"
            assert html.escape(playbooks[url.rsplit("/", 1)[-1]].title, quote=True) in page.text, url

        # 3. A pending row remap on GPU 5 while the node needs a reboot: the reboot explains it (and the
        #    drain-and-reset it asks for), so Alertmanager holds both back.
        faults["pending"] = inject(daemon, 5, "row_remap_pending")
        for name in ("GpuRowRemapPending", "GpuDrainAndResetRequired"):
            held = wait_for(functools.partial(suppressed, am, name), TIMEOUT, what=f"{name} inhibited in Alertmanager")
            assert held[0]["labels"]["gpu"] == "5"
            assert held[0]["status"]["inhibitedBy"], held
        assert not {k for k in hook.seen("firing") if k[1] == "5"}, "an inhibited alert was sent"

        # 4. Recovery: GPUs 1 and 2 acknowledged, the lasting faults of GPUs 1, 2, 3 and 4 cleared. Every alert
        #    resolves at the webhook; with no reboot pending, GPU 5's alerts are let through.
        acknowledge(daemon, 1)
        acknowledge(daemon, 2)
        for name in ("fallen", "remap", "thermal", "lost"):
            clear(daemon, faults[name])
        hook.wait("resolved", set(firing))
        released = hook.wait("firing", {("GpuRowRemapPending", "5"), ("GpuDrainAndResetRequired", "5")})
        assert released[("GpuRowRemapPending", "5")][0] == "ticket"
        assert released[("GpuDrainAndResetRequired", "5")][0] == "ticket"
