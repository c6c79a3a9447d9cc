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


REBOUND = "rebind.attacker.test:19482"
# What a browser sends for a page on rebind.attacker.test once that name resolves to the node: to the browser
# it is the page's own origin.
REBINDING = {**JSON, "host": REBOUND, "origin": f"http://{REBOUND}", "sec-fetch-site": "same-origin"}


def test_dns_rebinding_cannot_acknowledge_or_inject_faults(client: TestClient, daemon: Daemon) -> None:
    answer = client.post(ACK, content=b"{}", headers=REBINDING)
    assert answer.status_code == 421, answer.text
    assert "rebind.attacker.test" in answer.json()["error"] and "--web.allowed-hosts" in answer.json()["error"]
    assert acknowledgements(daemon) == 0
    fault = client.post("/api/v1/sim/faults", content=b'{"gpu": 1, "kind": "gpu_lost"}', headers=REBINDING)
    assert fault.status_code == 421
    assert client.delete("/api/v1/sim/faults", headers={"host": REBOUND}).status_code == 421
    diagnose = client.post("/api/v1/diagnose", content=b"x\n", headers={**REBINDING, "content-type": "text/plain"})
    assert diagnose.status_code == 421  # nor make the node work for the page
    assert client.get("/api/v1/sim/faults").json()["faults"] == []
    # Reading stays open whatever the name, as Prometheus (which sends its target's name) expects.
    assert client.get("/metrics", headers={"host": REBOUND}).status_code == 200
    assert client.get("/api/v1/diagnosis", headers={"host": REBOUND}).status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:9481",
        "10.1.2.3",  # an address cannot be rebound, whichever of the node's it is
        "[::1]:9481",
        "localhost:9481",
        "LOCALHOST.",
        "node.localhost",  # browsers resolve every .localhost name to the machine itself
        "testserver",  # --web.allowed-hosts (tests/conftest.py)
        "TestServer:80",
    ],
)
def test_the_daemon_s_own_names_can_still_change_state(client: TestClient, daemon: Daemon, host: str) -> None:
    answer = client.post(ACK, content=b"{}", headers={**JSON, "host": host, "origin": f"http://{host}"})
    assert answer.status_code == 200, answer.text
    assert acknowledgements(daemon) == 1


def test_the_machine_s_name_and_the_listen_address_names_are_its_own(
    sim: SimBackend, clock: FakeClock, tmp_path: Path
) -> None:
    import socket

    clock.advance(120)
    d = Daemon(sim, settings(tmp_path, web_listen_address=["gpu-node-7.example:9481"]), clock=clock)
    d.start()
    try:
        with TestClient(create_app(d)) as c:
            for host in (socket.gethostname(), "gpu-node-7.example", "gpu-node-7"):
                assert c.post(ACK, headers={"host": f"{host}:9481"}).status_code == 200, host
            assert c.post(ACK, headers={"host": "gpu-node-8.example:9481"}).status_code == 421
    finally:
        d.stop()


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
