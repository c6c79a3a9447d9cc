"""The diagnosis API and health metrics: an injected fault becomes a verdict, an acknowledgement clears it."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient

from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.polling.poller import FAST
from tests.conftest import FakeClock


def settle(daemon: Daemon) -> None:
    assert daemon.pipeline.idle.wait(timeout=5)


def gpu(body: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in body["gpus"] if g["gpu"] == index)


def metric(client: TestClient, name: str, **labels: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_quiet_node(client: TestClient) -> None:
    body = client.get("/api/v1/diagnosis").json()
    assert body["node"] == {"health": "healthy", "action": "IGNORE", "summary": "8 GPUs, 8 up; node healthy"}
    assert len(body["gpus"]) == 8 and body["findings"] == [] and body["boot_id"] == "boot-1"
    assert metric(client, "nvidia_gpu_health", gpu="0", status="healthy") == 1.0
    assert metric(client, "gpu_triage_node_health", status="healthy") == 1.0


def test_xid_79_to_verdict_to_acknowledgement(client: TestClient, daemon: Daemon) -> None:
    assert client.post("/api/v1/sim/faults", json={"gpu": 3, "kind": "xid", "xid": 79}).status_code == 201
    deadline = time.monotonic() + 5
    while client.get("/api/v1/diagnosis").json()["node"]["health"] != "unhealthy":
        assert time.monotonic() < deadline, "the XID never reached the verdict"
        time.sleep(0.02)
    body = client.get("/api/v1/diagnosis").json()
    assert body["node"]["action"] == "REBOOT_NODE"
    assert body["node"]["summary"] == "8 GPUs, 8 up; node unhealthy: REBOOT_NODE on GPU 3"
    three = gpu(body, 3)
    assert (three["health"], three["action"], three["pci_bus_id"]) == ("unhealthy", "REBOOT_NODE", "0000:5d:00.0")
    finding = three["findings"][0]
    assert finding["class"] == "xid_79" and finding["playbook"] == "xid-79" and finding["severity"] == "critical"
    assert finding["details"]["since"] > 0 and finding["evidence"][0]["text"].startswith("Xid 79")
    assert body["findings"][0]["id"] == finding["id"]
    assert metric(client, "nvidia_gpu_health", gpu="3", status="unhealthy") == 1.0
    assert metric(client, "nvidia_gpu_recommended_action", gpu="3", action="REBOOT_NODE") == 1.0
    assert metric(client, "nvidia_gpu_recommended_action", gpu="2", action="IGNORE") == 1.0
    ack = client.post("/api/v1/gpus/3/acknowledge", json={"note": "rebooted by hand, ticket OPS-1"})
    assert ack.status_code == 200 and ack.json()["health"] == "healthy"
    assert client.get("/api/v1/diagnosis").json()["node"]["health"] == "healthy"
    assert metric(client, "nvidia_gpu_recommended_action", gpu="3", action="IGNORE") == 1.0


def test_acknowledging_an_unknown_gpu(client: TestClient) -> None:
    answer = client.post("/api/v1/gpus/9/acknowledge")
    assert answer.status_code == 404 and "no GPU 9" in answer.json()["error"]


def test_a_lost_gpu_is_unhealthy_without_any_xid(client: TestClient, daemon: Daemon) -> None:
    client.post("/api/v1/sim/faults", json={"gpu": 5, "kind": "gpu_lost"})
    daemon.poller.poll(FAST)
    five = gpu(client.get("/api/v1/diagnosis").json(), 5)
    assert (five["status"], five["health"], five["action"]) == ("lost", "unhealthy", "REBOOT_NODE")
    assert five["findings"][0]["class"] == "gpu_lost" and five["findings"][0]["steps"]


def test_kernel_log_xid_on_a_gpu_the_driver_no_longer_lists(client: TestClient, daemon: Daemon) -> None:
    kmsg = daemon.settings.kmsg_path
    kmsg.write_text(
        "NVRM: GPU at PCI:0000:e1:00: GPU-0b11d014-6ba6-4f3e-9e6a-7e1a1234abcd\n"
        "NVRM: Xid (PCI:0000:e1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    )
    deadline = time.monotonic() + 5
    while len(client.get("/api/v1/diagnosis").json()["gpus"]) < 9:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    body = client.get("/api/v1/diagnosis").json()
    missing = body["gpus"][-1]
    assert missing["status"] == "missing" and missing["action"] == "REBOOT_NODE"
    assert body["node"]["health"] == "unhealthy"


def test_events_api(client: TestClient, daemon: Daemon, clock: FakeClock) -> None:
    for g, code in ((1, 13), (1, 31), (2, 13)):
        client.post("/api/v1/sim/faults", json={"gpu": g, "kind": "xid", "xid": code})
    deadline = time.monotonic() + 5
    while len(client.get("/api/v1/events").json()["events"]) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert [e["xid"] for e in client.get("/api/v1/events", params={"gpu": 1}).json()["events"]] == [13, 31]
    assert [e["gpu"] for e in client.get("/api/v1/events", params={"xid": 13}).json()["events"]] == [1, 2]
    one = client.get("/api/v1/events", params={"limit": 1}).json()["events"]
    assert len(one) == 1 and one[0]["sources"] == ["sim"] and one[0]["uuid"].startswith("GPU-")
    assert client.get("/api/v1/events", params={"since": str(clock.now + 1)}).json()["events"] == []
    assert len(client.get("/api/v1/events", params={"until": "2000-01-01T00:00:00Z"}).json()["events"]) == 0
    bad = client.get("/api/v1/events", params={"since": "yesterday-ish"})
    assert bad.status_code == 422 and "is not a time" in bad.json()["error"]


def test_xid_api(client: TestClient) -> None:
    body = client.get("/api/v1/xid/48").json()
    assert body["mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE" and body["runbook"] == "/runbooks/xid-48"
    assert body["action"] == "RESET_GPU" and body["nvidia_immediate_bucket"] == "WORKFLOW_XID_48"
    unknown = client.get("/api/v1/xid/999")
    assert unknown.status_code == 404 and "not in NVIDIA's catalog" in unknown.json()["error"]
