"""The diagnosis API and health metrics: an injected fault becomes a verdict, an acknowledgement clears it."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.polling.poller import FAST
from tests.conftest import FakeClock
from tests.daemon_proc import wait_for


def settle(daemon: Daemon) -> None:
    assert daemon.pipeline.idle.wait(timeout=5)


def health(client: TestClient) -> str:
    return str(client.get("/api/v1/diagnosis").json()["node"]["health"])


def gpu(body: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in body["gpus"] if g["gpu"] == index)


def metric(client: TestClient, name: str, **labels: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_quiet_node(client: TestClient) -> None:
    body = client.get("/api/v1/diagnosis").json()
    assert body["node"] == {
        "health": "healthy",
        "action": "IGNORE",
        "summary": "8 GPUs, 8 up; node healthy",
        "affected": [],
        "incomplete": [],
    }
    assert len(body["gpus"]) == 8 and body["findings"] == [] and body["boot_id"] == "boot-1"
    assert metric(client, "nvidia_gpu_health", gpu="0", status="healthy") == 1.0
    assert metric(client, "gpu_triage_node_health", status="healthy") == 1.0


def test_xid_79_to_verdict_to_acknowledgement(client: TestClient, daemon: Daemon) -> None:
    assert client.post("/api/v1/sim/faults", json={"gpu": 3, "kind": "xid", "xid": 79}).status_code == 201
    wait_for(lambda: health(client) == "unhealthy", timeout=5, interval=0.02, what="the XID to reach the verdict")
    daemon.poller.poll(FAST)  # the simulated GPU fell off the bus with its Xid 79, as a real one does
    body = client.get("/api/v1/diagnosis").json()
    assert body["node"]["action"] == "REBOOT_NODE"
    assert body["node"]["summary"] == "8 GPUs, 7 up; node unhealthy: REBOOT_NODE: GPU 3 Xid 79"
    three = gpu(body, 3)
    assert (three["health"], three["action"], three["pci_bus_id"]) == ("unhealthy", "REBOOT_NODE", "0000:5d:00.0")
    finding = three["findings"][0]
    assert finding["class"] == "xid_79" and finding["playbook"] == "xid-79" and finding["severity"] == "critical"
    assert finding["details"]["since"] > 0 and finding["evidence"][0]["text"].startswith("Xid 79")
    # The GPU lost now is the one its Xid 79 named: one finding, which also says what the driver answers now.
    assert [f["class"] for f in three["findings"]] == ["xid_79"] and three["status"] == "lost"
    assert finding["evidence"][-1] == {"line": None, "text": "GPU 3 is lost (simulated)"}
    assert body["findings"][0]["id"] == finding["id"]
    assert metric(client, "nvidia_gpu_health", gpu="3", status="unhealthy") == 1.0
    assert metric(client, "nvidia_gpu_recommended_action", gpu="3", action="REBOOT_NODE") == 1.0
    assert metric(client, "nvidia_gpu_recommended_action", gpu="2", action="IGNORE") == 1.0
    # An acknowledgement closes the XID's finding; a GPU that still does not answer stays lost until it does.
    ack = client.post("/api/v1/gpus/3/acknowledge", json={"note": "rebooted by hand, ticket OPS-1"})
    assert ack.status_code == 200 and [f["class"] for f in ack.json()["findings"]] == ["gpu_lost"]
    client.delete("/api/v1/sim/faults")  # the node came back from its reboot
    daemon.poller.poll(FAST)
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
    lost = five["findings"][0]
    assert lost["class"] == "gpu_lost" and lost["steps"]
    # When it was lost and what the backend answered: not an invented NVML message, not "line 0".
    assert lost["evidence"] == [{"line": None, "text": "GPU 5 is lost (simulated)"}]
    assert lost["details"]["first_seen"] > 0 and lost["details"]["first_seen_iso"].endswith("Z")


def test_kernel_log_xid_on_a_gpu_the_driver_no_longer_lists(client: TestClient, daemon: Daemon) -> None:
    """The kernel bound 0000:e1:00 to a GPU, which then fell off the bus before the daemon started: the driver
    lists no GPU there. Its Xid 79 is judged as Xid 79 is (REBOOT_NODE), on that bus id, with the kernel's line as
    the only evidence, and no GPU of the node is called lost."""
    kmsg = daemon.settings.kmsg_path
    xid79 = "NVRM: Xid (PCI:0000:e1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    kmsg.write_text(f"NVRM: GPU at PCI:0000:e1:00: GPU-0b11d014-6ba6-4f3e-9e6a-7e1a1234abcd\n{xid79}\n")
    wait_for(lambda: health(client) == "unhealthy", timeout=5, interval=0.02, what="the kernel's XID in the verdict")
    body = client.get("/api/v1/diagnosis").json()
    assert len(body["gpus"]) == 8 and all(g["health"] == "healthy" for g in body["gpus"])
    [found] = body["findings"]
    assert (found["class"], found["action"], found["gpu"]) == ("unknown_device", "REBOOT_NODE", None)
    assert found["details"]["pci_bus_id"] == "0000:e1:00.0" and found["details"]["xid"] == 79
    assert found["details"]["uuid"] == "GPU-0b11d014-6ba6-4f3e-9e6a-7e1a1234abcd"
    assert [e["text"] for e in found["evidence"]] == [xid79]
    assert body["node"]["summary"] == "8 GPUs, 8 up; node unhealthy: REBOOT_NODE: 0000:e1:00.0 Xid 79"


def test_an_xid_on_a_bus_id_that_is_no_gpu_is_judged_by_its_code(client: TestClient, daemon: Daemon) -> None:
    """Xid 13 is an application's fault wherever it is reported: on a bus id no GPU sits at, it makes no REBOOT_NODE,
    no lost GPU and no evidence the driver never gave."""
    with daemon.settings.kmsg_path.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:ee:00): 13, pid=1, name=x, Graphics Exception\n")
    wait_for(lambda: client.get("/api/v1/diagnosis").json()["findings"], timeout=5, interval=0.02, what="a finding")
    body = client.get("/api/v1/diagnosis").json()
    assert (body["node"]["health"], body["node"]["action"]) == ("degraded", "CHECK_APP")
    [found] = body["findings"]
    assert found["class"] == "unknown_device" and found["details"]["xid"] == 13
    assert [e["text"] for e in found["evidence"]] == [
        "NVRM: Xid (PCI:0000:ee:00): 13, pid=1, name=x, Graphics Exception"
    ]
    assert all(g["health"] == "healthy" for g in body["gpus"])


def test_events_api(client: TestClient, daemon: Daemon, clock: FakeClock) -> None:
    for g, code in ((1, 13), (1, 31), (2, 13)):
        client.post("/api/v1/sim/faults", json={"gpu": g, "kind": "xid", "xid": code})
    wait_for(lambda: len(client.get("/api/v1/events").json()["events"]) >= 3, timeout=5, interval=0.02, what="3 events")
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
