"""The typed contracts: /openapi.json carries a response schema for every /api/v1 route, and each model
writes exactly the keys diagnosis/, the journal and the simulator put in their own JSON (`to_json()`), so that
a key a model lacks cannot quietly leave the API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.fr_decode import SandboxDecoder
from gpu_triage.exporter.http.api_models import DiagnoseReport, Diagnosis, GpuReadings, JournalEvent
from gpu_triage.exporter.sources.journal import Event
from gpu_triage.exporter.verdict_report import all_findings, finding_out
from tests.conftest import REPO
from tests.daemon_proc import wait_for

API = "/api/v1"
FIXTURES = REPO / "tests/fixtures"
# Where the API's answers are built: none may fall back to an untyped dict.
TYPED = [
    *sorted((REPO / "exporter/http").glob("*.py")),
    REPO / "exporter/verdict_report.py",
    REPO / "exporter/xid_explain.py",
    REPO / "exporter/performance.py",
    REPO / "exporter/cli/check.py",
]


def test_openapi_has_a_response_schema_for_every_api_route(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    operations = [
        (path, method, op) for path, ops in spec["paths"].items() if path.startswith(API) for method, op in ops.items()
    ]
    assert len(operations) >= 10
    for path, method, op in operations:
        ok = {code: answer for code, answer in op["responses"].items() if code.startswith("2")}
        assert ok, f"{method} {path}: no success response"
        for code, answer in ok.items():
            if code == "204":
                continue
            schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
            ref = schema.get("$ref", "")
            assert ref.startswith("#/components/schemas/"), f"{method} {path} {code}: no schema ({schema})"
            assert schemas[ref.rsplit("/", 1)[1]]["properties"], f"{method} {path}: an empty object"


def test_no_untyped_dict_builds_an_answer() -> None:
    for path in TYPED:
        text = path.read_text()
        assert not re.search(r"dict\[str,\s*Any\]", text), f"{path.relative_to(REPO)} builds an untyped dict"


def test_the_readings_model_has_every_collector() -> None:
    """A collector the model lacked would be dropped from /api/v1/gpus without a word."""
    assert {c.value for c in Collector} <= set(GpuReadings.model_fields)


def _training_inputs() -> list[Path]:
    return sorted((FIXTURES / "training").rglob("*.log")) + sorted((FIXTURES / "kmsg").glob("*.log"))


@pytest.mark.parametrize("path", _training_inputs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_diagnose_report_keeps_every_key_of_the_report(path: Path) -> None:
    """POST /api/v1/diagnose: the model's JSON is the report's own `to_json()`, key for key, in order."""
    with path.open("rb") as f:
        report = diagnose([(path.name, iter([f.read()]))]).to_json()
    typed = DiagnoseReport.model_validate(report).body()
    assert typed == report
    assert _key_order(typed) == _key_order(report)


def test_flight_recorder_report_keeps_the_hang_table() -> None:
    dumps = [p for p in sorted((FIXTURES / "flight_recorder/never_joined").rglob("*")) if p.is_file()]
    with SandboxDecoder() as decode:
        report = diagnose([(p.name, iter([p.read_bytes()])) for p in dumps], decode=decode).to_json()
    assert "hang" in report
    typed = DiagnoseReport.model_validate(report).body()
    assert typed == report and _key_order(typed) == _key_order(report)


def test_a_finding_of_the_daemon_is_its_own_json_plus_workloads_and_times(client: TestClient, daemon: Daemon) -> None:
    for body in (
        {"gpu": 3, "kind": "xid", "xid": 79},
        {"gpu": 5, "kind": "gpu_lost"},
        {"gpu": 2, "kind": "xid", "xid": 13},
    ):
        assert client.post(f"{API}/sim/faults", json=body).status_code == 201
    # The XIDs come through the event path, a moment after the answer.
    wait_for(lambda: len(all_findings(daemon.verdicts.node)) >= 3, what="three findings")
    findings = all_findings(daemon.verdicts.node)
    assert {f.class_id for f in findings} >= {"xid_79", "gpu_lost", "xid_13"}
    for f in findings:
        own, typed = f.to_json(), finding_out(f).body()
        added = {k: typed.pop(k) for k in [*typed] if k not in own}
        assert typed == own | {"details": typed["details"]}
        assert set(added) <= {"workloads"}
        iso = {k: v for k, v in typed["details"].items() if k not in own["details"]}  # type: ignore[union-attr]
        assert set(iso) == {f"{k}_iso" for k in ("first_seen", "last_seen", "since") if k in own["details"]}
    # What the daemon answers validates as the model `check` reads it with.
    Diagnosis.model_validate_json(client.get(f"{API}/diagnosis").content)


def test_journal_events_keep_every_key() -> None:
    xid = Event(
        1.5,
        "b1",
        "kmsg,nvml",
        "xid",
        79,
        "NVRM: Xid 79",
        3,
        "GPU-3",
        "0000:5d:00.0",
        42,
        "python",
        details={"a": "1"},
        id=1,
    )
    sxid = Event(2.5, "b1", "kmsg", "sxid", 24007, "SXid", pci_bus_id="0000:c3:00.0", id=2)
    for event in (xid, sxid):
        own = event.to_json()
        typed = JournalEvent.model_validate(own).body()
        assert typed == own and list(typed) == list(own)


def _key_order(value: Any) -> Any:
    """Every object's keys, in order, all the way down."""
    if isinstance(value, dict):
        return [(k, _key_order(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_key_order(v) for v in value]
    return None
