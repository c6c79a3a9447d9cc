"""/runbooks/: the index, the HTML pages with live findings on top, the Markdown source, and 404s."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.core.findings import Evidence, Finding
from gpu_triage.diagnosis.core.playbooks import load_playbooks
from gpu_triage.exporter.http.runbooks import runbooks_router

HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


def finding(playbook: str = "xid-79", **overrides: object) -> Finding:
    f = Finding(
        id="xid_79:0000:3b:00.0",
        class_id="xid_79",
        severity=Severity.CRITICAL,
        action=Action.REBOOT_NODE,
        title="The GPU fell off the PCIe bus and no longer answers",
        playbook=playbook,
        gpu="0000:3b:00.0",
        evidence=[Evidence(7, "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.")],
        count=3,
        details={"first_seen": 1_700_000_000, "last_seen": 1_700_000_600},
    )
    for key, value in overrides.items():
        setattr(f, key, value)
    return f


class Live:
    """What the daemon would answer: the test sets it, or makes it fail."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.broken = False

    def __call__(self) -> list[Finding]:
        if self.broken:
            raise RuntimeError("journal unavailable")
        return list(self.findings)


@pytest.fixture
def live() -> Live:
    return Live()


@pytest.fixture
def client(live: Live) -> Iterator[TestClient]:
    app = FastAPI()
    app.include_router(runbooks_router(live, lambda: {"0000:3b:00.0": 1}))  # 0000:5e:00.0 is not listed
    with TestClient(app) as c:
        yield c


def test_index_lists_every_playbook_grouped(client: TestClient) -> None:
    r = client.get("/runbooks/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src" not in r.headers["content-security-policy"]  # nothing but inline style is allowed
    for pid, p in load_playbooks().items():
        assert f'href="{pid}"' in r.text
        assert html.escape(p.summary) in r.text
    groups = re.findall(r"<h2>([^<]+)</h2>", r.text)
    assert groups == ["Actions", "XID codes", "Training-log classes", "Monitoring and other", "Telemetry conditions"]
    assert "Live on this node now" not in r.text


def test_index_marks_playbooks_with_live_findings(client: TestClient, live: Live) -> None:
    live.findings = [finding(), finding(id="xid_79:0000:5e:00.0", gpu="0000:5e:00.0")]
    text = client.get("/runbooks/").text
    live_box = text.split('<section class="live">', 1)[1].split("</section>", 1)[0]
    assert 'href="xid-79"' in live_box and "on <b>0000:5e:00.0, GPU 1 (0000:3b:00.0)</b>" in live_box
    assert 'href="reset-gpu"' not in live_box


def test_page_renders_the_playbook_self_contained(client: TestClient) -> None:
    r = client.get("/runbooks/xid-79")
    assert r.status_code == 200
    text = r.text
    p = load_playbooks()["xid-79"]
    assert "<h1>Xid 79: GPU has fallen off the bus</h1>" in text
    for section in ("meaning", "impact", "diagnosis", "mitigation"):
        assert f'<h2 id="{section}">' in text
    assert "<ol>" in text and "<pre><code" in text  # numbered steps and command blocks
    assert "REBOOT_NODE" in text and p.action.description in text
    assert not re.search(r"<script|<link|<iframe|\bsrc=", text, re.IGNORECASE)
    assert not re.search(r'href="(https?:)?//', text)
    assert "Live on this node now" not in text
    assert "Used for: XID 79, condition gpu_lost." in text


@pytest.mark.parametrize("pid", sorted(load_playbooks()))
def test_every_playbook_page_renders(client: TestClient, pid: str) -> None:
    r = client.get(f"/runbooks/{pid}")
    assert r.status_code == 200
    assert "<script" not in r.text.lower()


def test_live_findings_go_on_top_of_their_own_playbook_only(client: TestClient, live: Live) -> None:
    live.findings = [finding(), finding("reset-gpu", id="other", title="Hung GPU", gpu="0000:86:00.0")]
    text = client.get("/runbooks/xid-79").text
    box = text.split('<section class="live">', 1)[1].split("</section>", 1)[0]
    assert text.index('<section class="live">') < text.index('<h2 id="meaning">')
    assert "Live on this node now (1)" in box
    assert "<code>GPU 1 (0000:3b:00.0)</code>" in box and "0000:86:00.0" not in box
    assert "2023-11-14T22:13:20Z" in box and "2023-11-14T22:23:20Z" in box
    assert "REBOOT_NODE" in box and "sev-critical" in box and "<td>3</td>" in box
    assert "line 7: NVRM: Xid (PCI:0000:3b:00): 79" in box
    other = client.get("/runbooks/reset-gpu").text.split('<section class="live">', 1)[1].split("</section>", 1)[0]
    assert "Hung GPU" in other and "0000:86:00.0" in other and "0000:3b:00.0" not in other
    assert "Live on this node now" not in client.get("/runbooks/xid-48").text


def test_hostile_finding_text_is_escaped(client: TestClient, live: Live) -> None:
    live.findings = [
        finding(
            title=HOSTILE,
            gpu=HOSTILE,
            host=HOSTILE,
            rank=3,
            evidence=[Evidence(1, HOSTILE, source=HOSTILE)],
            details={"first_seen": HOSTILE},
        )
    ]
    for path in ("/runbooks/xid-79", "/runbooks/"):
        text = client.get(path).text
        assert "<script>" not in text and "<img" not in text and "onerror=alert(2)>" not in text
    text = client.get("/runbooks/xid-79").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in text
    assert "(rank 3)" in text


def test_a_failing_live_source_still_serves_the_pages(
    client: TestClient, live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    live.broken = True
    for path in ("/runbooks/xid-79", "/runbooks/"):
        r = client.get(path)
        assert r.status_code == 200
        assert "Live findings are unavailable right now" in r.text
    assert "live findings unavailable" in caplog.text


def test_markdown_source(client: TestClient) -> None:
    r = client.get("/runbooks/reset-gpu.md")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/markdown; charset=utf-8"
    assert r.text == load_playbooks()["reset-gpu"].source
    assert r.text.startswith("---\nid: reset-gpu\n")


@pytest.mark.parametrize("path", ["/runbooks/no-such-page", "/runbooks/no-such-page.md"])
def test_unknown_id_is_a_json_404_listing_valid_ids(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    body = r.json()
    valid = sorted(load_playbooks())
    assert body == {
        "error": f"no runbook 'no-such-page'; valid ids: {', '.join(valid)}",
        "status": 404,
        "valid": valid,
    }
