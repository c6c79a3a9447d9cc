"""The daemon log tells the story: each XID once at warning, each verdict change once at info, quiet at rest;
and the diagnosis API gives live findings their next steps and readable times."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from tests.conftest import FakeClock, settings
from tests.daemon_proc import wait_for


def records(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpu_triage.exporter.verdicts" and r.getMessage() == message]


def unhealthy(client: TestClient, gpu: int) -> bool:
    body = client.get("/api/v1/diagnosis").json()
    return next(g for g in body["gpus"] if g["gpu"] == gpu)["health"] == "unhealthy"


def test_an_xid_is_logged_once_with_where_and_what_to_do(
    client: TestClient, daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert records(caplog, "GPU verdict changed") == [], "a healthy node starts quietly"
    client.post("/api/v1/sim/faults", json={"gpu": 5, "kind": "xid", "xid": 48})
    wait_for(lambda: unhealthy(client, 5), 10, interval=0.02, what="the XID to reach the verdict")
    gpu5 = daemon.snapshot.gpus[5].identity
    daemon.refresh()  # a later poll: nothing new to say

    [xid] = records(caplog, "XID")
    assert xid.levelno == logging.WARNING
    assert tuple(vars(xid)[k] for k in ("xid", "gpu", "pci_bus_id", "uuid")) == (48, 5, gpu5.pci_bus_id, gpu5.uuid)
    assert vars(xid)["action"] == "RESET_GPU" and vars(xid)["source"] == "sim"
    [change] = records(caplog, "GPU verdict changed")
    assert change.levelno == logging.INFO
    assert tuple(vars(change)[k] for k in ("gpu", "health", "action", "was")) == (
        5,
        "unhealthy",
        "RESET_GPU",
        "healthy IGNORE",
    )
    [node] = records(caplog, "node verdict changed")
    assert vars(node)["summary"] == "8 GPUs, 8 up; node unhealthy: RESET_GPU: GPU 5 Xid 48"

    caplog.clear()
    client.post("/api/v1/gpus/5/acknowledge", json={"note": "OPS-7"})
    ack = [r for r in caplog.records if r.getMessage() == "GPU acknowledged"]
    assert [(r.levelno, vars(r)["gpu"], vars(r)["note"]) for r in ack] == [(logging.INFO, 5, "OPS-7")]
    [back] = records(caplog, "GPU verdict changed")
    assert tuple(vars(back)[k] for k in ("gpu", "health", "was")) == (5, "healthy", "unhealthy RESET_GPU")
    assert records(caplog, "XID") == []


def test_a_restart_does_not_log_old_xids_again(
    client: TestClient, daemon: Daemon, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client.post("/api/v1/sim/faults", json={"gpu": 2, "kind": "xid", "xid": 79})
    wait_for(lambda: unhealthy(client, 2), 10, interval=0.02, what="the XID to reach the verdict")
    daemon.stop()
    caplog.clear()
    caplog.set_level(logging.INFO)
    again = Daemon(
        SimBackend(load_scenario("h100-training"), clock=clock), settings(tmp_path), clock=clock, boot_id="boot-1"
    )
    again.start()
    try:
        again.refresh()
        assert records(caplog, "XID") == []
        # The verdict it starts with is not healthy: that is said once, for the GPU and the node.
        [change] = records(caplog, "GPU verdict changed")
        assert (vars(change)["gpu"], vars(change)["action"]) == (2, "REBOOT_NODE")
        assert len(records(caplog, "node verdict changed")) == 1
    finally:
        again.stop()


def test_live_findings_carry_steps_and_iso_times(client: TestClient, daemon: Daemon) -> None:
    client.post("/api/v1/sim/faults", json={"gpu": 5, "kind": "xid", "xid": 48})
    wait_for(lambda: unhealthy(client, 5), 10, interval=0.02, what="the XID to reach the verdict")
    body = client.get("/api/v1/diagnosis").json()
    finding = body["findings"][0]
    assert finding["class"] == "xid_48"
    assert finding["steps"] == [
        Action.RESET_GPU.description,
        "`gpu-triage xid 48` says what the code means; the runbook is /runbooks/xid-48.",
        "Once it is done, close the finding: `curl -s -XPOST localhost:9481/api/v1/gpus/5/acknowledge` "
        "(a reboot closes it too).",
    ]
    details = finding["details"]
    for key in ("first_seen", "last_seen", "since"):
        assert details[f"{key}_iso"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(details[key]))
    assert body["generated_at_iso"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(body["generated_at"]))
    per_gpu = next(g for g in body["gpus"] if g["gpu"] == 5)["findings"][0]
    assert per_gpu == finding
    # A condition's steps come from its data, untouched.
    client.post("/api/v1/sim/faults", json={"gpu": 1, "kind": "gpu_lost"})
    assert unhealthy(client, 1)
    lost = next(g for g in client.get("/api/v1/diagnosis").json()["gpus"] if g["gpu"] == 1)["findings"][0]
    assert lost["class"] == "gpu_lost" and lost["steps"] and "acknowledge" not in " ".join(lost["steps"])
