"""Generated requests for every operation in /openapi.json (schemathesis): none answers 500, and every
answer that succeeds is what its schema says.

Valid and invalid parameters and bodies alike, on the simulator: a client's mistake is a 4xx with the
API's error shape, and the daemon keeps serving. A 2xx body is checked against the response schema the
route declares (its pydantic model), by schemathesis's own validator rather than the model that wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case
from schemathesis.generation import GenerationMode
from schemathesis.openapi import from_asgi
from schemathesis.schemas import BaseSchema
from schemathesis.specs.openapi.checks import response_schema_conformance

from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from tests.conftest import settings as daemon_settings


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSchema]:
    sim = SimBackend(load_scenario("h100-training"))
    # A short read deadline: a generated hung_call fault makes each later poll wait it out.
    daemon = Daemon(sim, daemon_settings(tmp_path_factory.mktemp("fuzz"), collector_timeout=0.1))
    daemon.start()
    try:
        yield from_asgi("/openapi.json", create_app(daemon))
    finally:
        daemon.stop()


def test_no_500_and_every_answer_fits_its_schema(api: BaseSchema) -> None:
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 10, "the schema lists the API"
    for operation, mode in itertools.product(operations, GenerationMode):  # valid inputs, then invalid ones

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def no_500(case: Case) -> None:
            response = case.call()
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500, f"{where}: {response.status_code} {response.text}"
            if response.status_code >= 400 and response.headers.get("content-type") == "application/json":
                body = response.json()
                assert body["status"] == response.status_code and body["error"], f"{where}: {body}"
            elif response.status_code < 300:
                case.validate_response(response, checks=[response_schema_conformance])

        try:
            no_500()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, f"{operation.label}: no valid request to generate"
            # An operation that takes no parameters or body has no invalid ones either.
