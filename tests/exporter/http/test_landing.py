"""GET /: the node's verdict on top, then per GPU its health, action, findings with runbooks and last XID.

tests/e2e/test_pages_browser.py looks at the same page in a real browser."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.exporter.daemon import Daemon
from tests.daemon_proc import wait_for


def row(page: str, label: str) -> str:
    """The table row of one GPU, tags and all."""
    m = re.search(rf"<tr class=\"gpu-\w+\"><td><b>{re.escape(label)}</b></td>.*?</tr>", page)
    assert m, f"no row for {label}"
    return m.group(0)


def test_a_healthy_node(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "script-src" not in page.headers["content-security-policy"]
    for link in ("/metrics", "/api/v1/diagnosis", "/api/v1/gpus", "/healthz", "/readyz", "/runbooks/"):
        assert f'href="{link}"' in page.text
    assert 'href="/api/v1/sim/faults"' in page.text  # on the simulator
    assert '<section class="verdict verdict-healthy"><h2>Node healthy</h2><p>No action needed.</p>' in page.text
    for index in range(8):
        r = row(page.text, f"GPU {index}")
        assert 'sev-healthy">healthy<' in r and ">none<" in r and "<td>up</td>" in r
    assert "0000:18:00.0" in row(page.text, "GPU 0")


def test_an_unhealthy_gpu_shows_its_action_runbook_and_last_xid(client: TestClient, daemon: Daemon) -> None:
    client.post("/api/v1/sim/faults", json={"gpu": 1, "kind": "xid", "xid": 79})
    client.post("/api/v1/sim/faults", json={"gpu": 6, "kind": "xid", "xid": 13})

    def page() -> str | None:
        text = client.get("/").text
        return text if "verdict-unhealthy" in text and "Xid 13" in text else None

    text = wait_for(page, 10, interval=0.05, what="both XIDs on the landing page")
    verdict = text.split('<section class="verdict verdict-unhealthy">', 1)[1].split("</section>", 1)[0]
    assert "<h2>Node unhealthy</h2>" in verdict
    # Every GPU that needs an action is named, the most urgent first.
    assert f"<p><b>REBOOT_NODE</b>: {Action.REBOOT_NODE.description}</p>" in verdict
    assert "<ul><li>REBOOT_NODE: GPU 1 Xid 79</li><li>CHECK_APP: GPU 6 Xid 13</li></ul>" in verdict
    assert text.index("verdict-unhealthy") < text.index('<table id="gpus">')

    one = row(text, "GPU 1")
    assert one.startswith('<tr class="gpu-unhealthy">') and 'sev-unhealthy">unhealthy<' in one
    assert "<b>REBOOT_NODE</b>" in one and 'sev-critical">critical<' in one
    assert 'runbook <a href="/runbooks/xid-79">xid-79</a>' in one and '<a href="/api/v1/xid/79">Xid 79</a>' in one
    six = row(text, "GPU 6")
    assert six.startswith('<tr class="gpu-degraded">') and "<b>CHECK_APP</b>" in six and "Xid 13" in six
    assert 'href="/runbooks/xid-13"' in six
    assert "Xid" not in row(text, "GPU 2")
    for link in re.findall(r'href="(/runbooks/[^"]+)"', text):
        assert client.get(link).status_code == 200, link


def test_the_last_xid_stays_after_an_acknowledgement(client: TestClient) -> None:
    client.post("/api/v1/sim/faults", json={"gpu": 3, "kind": "xid", "xid": 48})
    wait_for(lambda: "verdict-unhealthy" in client.get("/").text, 10, interval=0.05, what="GPU 3 unhealthy")
    client.post("/api/v1/gpus/3/acknowledge", json={})
    three = row(client.get("/").text, "GPU 3")
    assert 'sev-healthy">healthy<' in three and "Xid 48" in three
