"""The HTTP surface: metrics from the cache, probes, the GPU API, fault injection, JSON errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from tests.conftest import FakeClock, settings
from tests.exporter.metrics.test_gpu import PROMETHEUS_ACCEPT


def samples(client: TestClient, name: str) -> dict[str, float]:
    text = client.get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels["gpu"]] = s.value
    return out


def test_metrics_page(client: TestClient) -> None:
    plain = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert len(samples(client, "nvidia_gpu_up")) == 8
    om = client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.headers["content-encoding"] == "gzip" and om.text.endswith("# EOF\n")


def test_a_scrape_never_touches_the_driver(client: TestClient, daemon: Daemon, sim: SimBackend) -> None:
    reads = []
    original = sim.read
    sim.read = lambda gpu, collector: reads.append(1) or original(gpu, collector)  # type: ignore[method-assign]
    for _ in range(20):
        client.get("/metrics")
    assert reads == []


def test_probes(client: TestClient, daemon: Daemon, clock: FakeClock) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    clock.advance(600)  # no poll for ten minutes: the snapshot is stale
    stale = client.get("/readyz")
    assert stale.status_code == 503 and "old" in stale.json()["error"]


def test_not_ready_before_the_first_snapshot(clock: FakeClock, tmp_path: Path) -> None:
    sim = SimBackend(load_scenario("h100-training"), clock=clock)
    daemon = Daemon(sim, settings(tmp_path), clock=clock)  # not started
    with TestClient(create_app(daemon)) as c:
        answer = c.get("/readyz")
        assert answer.status_code == 503 and answer.json()["error"] == "not ready: no snapshot yet"
        assert c.get("/healthz").status_code == 503


def test_gpus_api(client: TestClient) -> None:
    body = client.get("/api/v1/gpus").json()
    assert body["backend"] == "sim" and len(body["gpus"]) == 8
    gpu = body["gpus"][3]
    assert gpu["gpu"] == 3 and gpu["pci_bus_id"] == "0000:5d:00.0" and gpu["status"] == "up"
    assert gpu["inventory"]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["clocks"]["current_hz"]["sm"] > 0 and gpu["thermal"]["fan_ratio"] is None
    assert client.get("/api/v1/gpus/3").json() == gpu
    missing = client.get("/api/v1/gpus/8")
    assert missing.status_code == 404 and missing.json() == {
        "error": "no GPU 8: this node has 8 GPUs",
        "status": 404,
    }
    assert client.get("/api/v1/gpus/x").status_code == 422


def test_openapi_describes_the_api(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/gpus", "/api/v1/sim/faults", "/healthz", "/readyz"} <= set(paths)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/", "/api/v1/diagnosis", "/runbooks/xid-79"])
def test_head_answers_as_get_without_the_body(client: TestClient, path: str) -> None:
    """HEAD is GET without the content (RFC 9110, 9.3.2): probes and load balancers that use it."""
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


def test_head_is_no_way_around_what_get_refuses(client: TestClient) -> None:
    assert client.head("/no/such/path").status_code == 404
    assert client.head("/api/v1/gpus/3/acknowledge").status_code == 405  # a POST route has no GET to run
    assert client.head("/api/v1/gpus/99").status_code == client.get("/api/v1/gpus/99").status_code == 404


def test_unknown_path_is_a_json_404(client: TestClient) -> None:
    answer = client.get("/nope")
    assert answer.status_code == 404 and answer.json() == {"error": "no such path: /nope", "status": 404}


def test_injecting_a_lost_gpu_leaves_the_others_reporting(client: TestClient, daemon: Daemon) -> None:
    created = client.post("/api/v1/sim/faults", json={"gpu": 3, "kind": "gpu_lost"})
    assert created.status_code == 201
    fault = created.json()
    assert fault["id"] and fault["kind"] == "gpu_lost" and fault["gpu"] == 3 and "count" not in fault
    # The answer comes once a poll has read the GPUs since: /metrics shows the fault at once.
    up = samples(client, "nvidia_gpu_up")
    assert up["3"] == 0 and all(v == 1 for gpu, v in up.items() if gpu != "3")
    power = samples(client, "nvidia_gpu_power_watts")
    assert "3" not in power and len(power) == 7
    assert client.get("/api/v1/sim/faults").json()["faults"][0]["id"] == fault["id"]
    assert client.delete(f"/api/v1/sim/faults/{fault['id']}").status_code == 204
    assert samples(client, "nvidia_gpu_up")["3"] == 1


def test_injecting_a_hung_call_keeps_metrics_answering(client: TestClient, daemon: Daemon) -> None:
    assert client.post("/api/v1/sim/faults", json={"gpu": 1, "kind": "hung_call"}).status_code == 201
    answer = client.get("/metrics")  # the POST answered after a poll that waited out its deadline
    assert answer.status_code == 200
    assert samples(client, "nvidia_gpu_up")["1"] == 0
    assert "1" not in samples(client, "nvidia_gpu_temperature_celsius")
    assert client.delete("/api/v1/sim/faults").json() == {"cleared": 1}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"gpu": 12, "kind": "gpu_lost"}, 422, "no GPU 12: this node has GPUs 0..7"),
        ({"gpu": 0, "kind": "nvlink_down", "link": 99}, 422, "no NVLink link 99"),
        ({"gpu": 0, "kind": "xid"}, 422, "'xid' is required for kind xid"),
        ({"gpu": 0, "kind": "boom"}, 422, "kind: Input should be"),
        ({"kind": "gpu_lost"}, 422, "gpu: Field required"),
        # JSON's own types, strictly: true is no GPU 1, nor are "1" or 1.0 (Python's bool is an int).
        ({"gpu": True, "kind": "gpu_lost"}, 422, "gpu: Input should be a valid integer"),
        ({"gpu": "1", "kind": "gpu_lost"}, 422, "gpu: Input should be a valid integer"),
        ({"gpu": 1.0, "kind": "gpu_lost"}, 422, "gpu: Input should be a valid integer"),
        ({"gpu": 0, "kind": "xid", "xid": True}, 422, "xid: Input should be a valid integer"),
        ({"gpu": 0, "kind": "ecc_correctable", "count": True}, 422, "count: Input should be a valid integer"),
        ({"gpu": 0, "kind": "gpu_lost", "duration_seconds": True}, 422, "duration_seconds: Input should be"),
    ],
)
def test_bad_fault_bodies(client: TestClient, body: dict[str, object], status: int, message: str) -> None:
    answer = client.post("/api/v1/sim/faults", json=body)
    assert answer.status_code == status
    assert message in answer.json()["error"]


def test_strict_types_still_take_what_json_means(client: TestClient) -> None:
    answer = client.post("/api/v1/sim/faults", json={"gpu": 2, "kind": "thermal_slowdown", "duration_seconds": 5})
    assert answer.status_code == 201 and answer.json()["duration_seconds"] == 5.0
    assert client.get("/api/v1/sim/faults").json()["faults"][0]["gpu"] == 2


def test_malformed_json_body(client: TestClient) -> None:
    answer = client.post("/api/v1/sim/faults", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "invalid request" in answer.json()["error"]


def test_unknown_fault_id(client: TestClient) -> None:
    answer = client.delete("/api/v1/sim/faults/f999")
    assert answer.status_code == 404 and answer.json()["error"] == "no active fault 'f999'"


class _NotSim(SimBackend):
    name = "nvml"  # any backend that is not the simulator


@pytest.fixture
def nvml_like_client(clock: FakeClock, tmp_path: Path) -> Iterator[TestClient]:
    backend = _NotSim(load_scenario("h100-training"), clock=clock)
    daemon = Daemon(backend, settings(tmp_path, backend="nvml"), clock=clock)
    with TestClient(create_app(daemon)) as c:
        yield c


def test_fault_injection_only_on_the_simulator(nvml_like_client: TestClient) -> None:
    answer = nvml_like_client.post("/api/v1/sim/faults", json={"gpu": 0, "kind": "gpu_lost"})
    assert answer.status_code == 404
    assert "--backend sim" in answer.json()["error"]
