"""Write endpoints cannot be forged: a page in an operator's browser cannot acknowledge a GPU or inject a
fault; with users in the web config every write needs a password; --web.read-only refuses them all."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from fastapi.testclient import TestClient

from gpu_triage.exporter.backends.sim import SimBackend
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.http.web_config import WebConfig
from tests.conftest import FakeClock, settings

ACK = "/api/v1/gpus/3/acknowledge"
JSON = {"content-type": "application/json"}


def acknowledgements(daemon: Daemon) -> int:
    return sum(m.kind == "acknowledged" for m in daemon.journal.marks())


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"content-type": "text/plain"}, 415),
        ({"content-type": "application/x-www-form-urlencoded"}, 415),
        ({"content-type": "multipart/form-data; boundary=x"}, 415),
        ({**JSON, "origin": "http://evil.example"}, 403),
        ({**JSON, "origin": "null"}, 403),
        ({**JSON, "sec-fetch-site": "cross-site"}, 403),
        ({**JSON, "sec-fetch-site": "same-site"}, 403),
    ],
)
def test_forged_acknowledgements_are_refused(
    client: TestClient, daemon: Daemon, headers: dict[str, str], status: int
) -> None:
    answer = client.post(ACK, content=b'{"note": "x"}', headers=headers)
    assert answer.status_code == status, answer.text
    assert answer.json()["status"] == status
    assert acknowledgements(daemon) == 0


@pytest.mark.parametrize(
    "headers",
    [
        JSON,
        {**JSON, "origin": "http://testserver"},  # the daemon's own pages
        {**JSON, "sec-fetch-site": "same-origin"},
        {**JSON, "sec-fetch-site": "none"},  # typed into the address bar, or a tool that sends it
    ],
)
def test_genuine_acknowledgements_pass(client: TestClient, daemon: Daemon, headers: dict[str, str]) -> None:
    assert client.post(ACK, content=b'{"note": "x"}', headers=headers).status_code == 200
    assert acknowledgements(daemon) == 1


def test_acknowledging_without_a_body_needs_no_content_type(client: TestClient, daemon: Daemon) -> None:
    """`curl -XPOST .../acknowledge`, as the verdict's next steps print it."""
    assert client.post(ACK).status_code == 200
    assert acknowledgements(daemon) == 1


def test_simulator_faults_are_writes_too(client: TestClient) -> None:
    body = b'{"gpu": 1, "kind": "gpu_lost"}'
    forged = client.post("/api/v1/sim/faults", content=body, headers={"content-type": "text/plain"})
    assert forged.status_code == 415
    cross = client.delete("/api/v1/sim/faults", headers={"origin": "http://evil.example"})
    assert cross.status_code == 403
    assert client.get("/api/v1/sim/faults").json()["faults"] == []


def test_diagnose_takes_plain_text_but_not_from_other_sites(client: TestClient) -> None:
    answer = client.post("/api/v1/diagnose", content=b"hello\n", headers={"content-type": "text/plain"})
    assert answer.status_code == 200
    cross = client.post(
        "/api/v1/diagnose", content=b"hello\n", headers={"content-type": "text/plain", "origin": "http://evil.example"}
    )
    assert cross.status_code == 403  # a browser page may not make the node do work on its behalf either


@pytest.fixture
def read_only(sim: SimBackend, clock: FakeClock, tmp_path: Path) -> Iterator[tuple[TestClient, Daemon]]:
    clock.advance(120)
    d = Daemon(sim, settings(tmp_path, web_read_only=True), clock=clock, boot_id="boot-1")
    d.start()
    with TestClient(create_app(d)) as c:
        yield c, d
    d.stop()


def test_read_only_refuses_every_write(read_only: tuple[TestClient, Daemon]) -> None:
    client, daemon = read_only
    answer = client.post(ACK, json={"note": "x"})
    assert answer.status_code == 403 and "--web.read-only" in answer.json()["error"]
    assert client.post("/api/v1/sim/faults", json={"gpu": 1, "kind": "gpu_lost"}).status_code == 403
    assert client.delete("/api/v1/sim/faults").status_code == 403
    assert acknowledgements(daemon) == 0 and client.get("/api/v1/sim/faults").json()["faults"] == []
    # Reading goes on, and so does diagnosing a log, which changes nothing.
    assert client.get("/metrics").status_code == 200 and client.get("/api/v1/diagnosis").status_code == 200
    assert client.post("/api/v1/diagnose", content=b"hello\n").status_code == 200


HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))


def basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_with_users_writes_need_the_password_and_probes_do_not(daemon: Daemon) -> None:
    with TestClient(create_app(daemon, WebConfig(users={"ops": HASH}))) as c:
        assert c.post(ACK, json={"note": "x"}).status_code == 401
        assert c.post(ACK, json={"note": "x"}, headers=basic("ops", "wrong")).status_code == 401
        assert acknowledgements(daemon) == 0
        assert c.post(ACK, json={"note": "x"}, headers=basic("ops", "s3cret")).status_code == 200
        assert c.get("/metrics").status_code == 401 and c.get("/api/v1/diagnosis").status_code == 401
        # kubelet's probes cannot send credentials; they say only "alive" and "ready".
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ready"}
        assert c.get("/healthz/").status_code == 401 and c.get("/readyz?x=1").status_code == 200
