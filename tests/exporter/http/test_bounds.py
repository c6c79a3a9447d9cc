"""Every input is bounded: query parameters, bodies and fault parameters answer 4xx, never 500, and a
client's mistake leaves no traceback in the log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpu_triage.exporter.backends.sim import SimBackend
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.http.diagnosis import CpuBudgetError, within_cpu
from tests.conftest import FakeClock, settings


@pytest.mark.parametrize(
    "query",
    [
        f"gpu={10**400}",
        f"xid={10**400}",
        f"gpu=-{10**30}",
        "xid=99999999999999999999",
        "limit=0",
        "kind=nope",
        "since=yesterday-ish",
        f"since={'9' * 400}",
    ],
)
def test_event_filters_out_of_range_are_client_errors(
    client: TestClient, query: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        answer = client.get(f"/api/v1/events?{query}")
    assert answer.status_code == 422, answer.text
    assert answer.json()["status"] == 422
    assert not [r for r in caplog.records if r.exc_info], "a client error logged a traceback"


@pytest.mark.parametrize("path", [f"/api/v1/gpus/{10**30}", f"/api/v1/xid/{10**30}"])
def test_huge_path_integers_are_client_errors(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code in (404, 422), answer.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gpu": 0, "kind": "hung_call", "duration_seconds": 1e300}, "duration_seconds"),
        ('{"gpu": 0, "kind": "gpu_lost", "duration_seconds": 1e999}', "duration_seconds"),  # JSON for infinity
        ({"gpu": 10**30, "kind": "gpu_lost"}, "gpu"),
        ({"gpu": 0, "kind": "nvlink_down", "link": 10**30}, "link"),
    ],
)
def test_fault_parameters_are_bounded(client: TestClient, body: dict[str, object] | str, message: str) -> None:
    if isinstance(body, str):
        answer = client.post("/api/v1/sim/faults", content=body, headers={"content-type": "application/json"})
    else:
        answer = client.post("/api/v1/sim/faults", json=body)
    assert answer.status_code == 422, answer.text
    assert message in answer.json()["error"].lower()
    assert client.get("/api/v1/sim/faults").json()["faults"] == []
    assert client.get("/metrics").status_code == 200


def test_a_json_body_over_the_limit_is_refused_from_its_length(client: TestClient) -> None:
    note = "x" * 100_000
    answer = client.post("/api/v1/gpus/0/acknowledge", json={"note": note})
    assert answer.status_code == 413, answer.text
    assert "KiB" in answer.json()["error"]


def test_a_chunked_body_is_counted_while_it_is_read(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"note": "'
        for _ in range(1000):
            yield b"x" * 1000
        yield b'"}'

    answer = client.post("/api/v1/gpus/0/acknowledge", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413, answer.text
    assert client.get("/api/v1/diagnosis").json()["node"]["health"] == "healthy"


def test_diagnose_keeps_its_own_limit(daemon: Daemon) -> None:
    with TestClient(create_app(daemon)) as c:
        log = b"NCCL WARN Call to ibv_poll_cq failed\n" * 2000  # 74 KB: over the JSON limit, under diagnose's
        assert c.post("/api/v1/diagnose", content=log, headers={"content-type": "text/plain"}).status_code == 200
        too_big = c.post(
            "/api/v1/diagnose",
            content=b"",
            headers={"content-type": "text/plain", "content-length": str(daemon.settings.diagnose_max_bytes + 1)},
        )
        assert too_big.status_code == 413 and "--diagnose.max-bytes" in too_big.json()["error"]


def test_a_diagnosis_has_a_cpu_time_budget(sim: SimBackend, clock: FakeClock, tmp_path: Path) -> None:
    """A log that costs more CPU time than --diagnose.max-cpu is refused with 413 saying so, and the next
    request is served: the slot is free again. The log is what the pure-Python scan finds slowest, lines
    that hold a signature's literal; a real one is fine under the default budget."""
    daemon = Daemon(sim, settings(tmp_path, diagnose_max_cpu=0.05), clock, monotonic=clock.monotonic)
    daemon.start()
    try:
        with TestClient(create_app(daemon)) as c:
            heavy = b"".join(
                f"rank {i}: RuntimeError: CUDA error: no kernel image {i} is available for execution\n".encode()
                for i in range(200_000)
            )  # 16 MB of distinct lines, each one classified
            refused = c.post("/api/v1/diagnose", content=heavy, headers={"content-type": "text/plain"})
            assert refused.status_code == 413, refused.text
            assert "--diagnose.max-cpu" in refused.json()["error"]
            small = c.post("/api/v1/diagnose", content=b"epoch 3 loss 1.2\n", headers={"content-type": "text/plain"})
            assert small.status_code == 200 and small.json()["findings"] == []
    finally:
        daemon.stop()


def test_the_budget_is_the_cpu_time_of_the_thread_that_reads_the_chunks() -> None:
    def burn() -> Iterator[bytes]:
        while True:
            yield b"x" * 10

    seen = 0
    with pytest.raises(CpuBudgetError):
        for _ in within_cpu(burn(), 0.02):
            seen += 1
            sum(range(10_000))  # the consumer's work is what counts
    assert seen > 1
    assert list(within_cpu(iter([b"a", b"b"]), 10.0)) == [b"a", b"b"]
