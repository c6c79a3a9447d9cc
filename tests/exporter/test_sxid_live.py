"""The daemon's live path keeps NVSwitch SXids: journaled, counted, and in the node's verdict."""

from __future__ import annotations

from fastapi.testclient import TestClient

from gpu_triage.exporter.daemon import Daemon
from tests.daemon_proc import wait_for

FATAL = "[ 2100.000000] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n"


def test_a_fatal_sxid_makes_the_node_unhealthy_and_is_counted(client: TestClient, daemon: Daemon) -> None:
    daemon.settings.kmsg_path.write_text(FATAL)
    wait_for(
        lambda: client.get("/api/v1/diagnosis").json()["findings"],
        timeout=10,
        interval=0.05,
        what="the SXid never reached the verdict",
    )
    body = client.get("/api/v1/diagnosis").json()
    [finding] = body["findings"]
    assert (finding["class"], finding["severity"], finding["action"]) == (
        "sxid_fatal",
        "critical",
        "RESTART_FABRIC_MANAGER",
    )
    assert finding["details"]["sxid_20034"] == 1 and finding["gpu"] is None
    assert (body["node"]["health"], body["node"]["action"]) == ("unhealthy", "RESTART_FABRIC_MANAGER")
    [event] = client.get("/api/v1/events", params={"kind": "sxid"}).json()["events"]
    assert (event["sxid"], event["pci_bus_id"]) == (20034, "0000:85:00.0")
    metrics = client.get("/metrics").text
    assert 'nvidia_nvswitch_sxid_errors_total{pci_bus_id="0000:85:00.0",sxid="20034"} 1.0' in metrics
