"""A wall clock that jumps (NTP stepping it, an operator's `date -s`) changes the times the daemon
reports, never whether it polls or whether it says it is ready: those run on the monotonic clock."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import time_machine
from fastapi.testclient import TestClient

from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.polling.poller import FAST, Poller
from tests.conftest import FakeClock
from tests.daemon_proc import wait_for


def test_polling_goes_on_when_the_real_wall_clock_steps_back() -> None:
    """The process's own wall clock (time.time, datetime.now) is set back an hour mid-run."""
    sim = SimBackend(load_scenario("h100-training"))
    polls: list[float] = []
    lock = threading.Lock()

    def seen(_: object) -> None:
        with lock:
            polls.append(time.monotonic())

    p = Poller(sim, interval=0.05, slow_interval=0.5, timeout=0.5, on_snapshot=seen)
    p.start()
    try:
        wait_for(lambda: len(polls) >= 3, 10, interval=0.02, what="polls on schedule")
        with time_machine.travel(time.time() - 3600, tick=True):
            before = len(polls)
            wait_for(lambda: len(polls) >= before + 5, 10, interval=0.02, what="polls after the clock stepped back")
    finally:
        p.stop()
        sim.close()


def test_readiness_goes_stale_when_polls_stop_even_after_the_wall_clock_stepped_back(
    client: TestClient, daemon: Daemon, clock: FakeClock
) -> None:
    assert client.get("/readyz").status_code == 200
    clock.step(-3600)  # the wall clock is set back an hour...
    clock.advance(600)  # ...and then ten minutes pass without a poll
    stale = client.get("/readyz")
    assert stale.status_code == 503 and "600s old" in stale.json()["error"]


def test_a_snapshot_just_taken_is_fresh_even_after_the_wall_clock_jumped_ahead(
    client: TestClient, daemon: Daemon, clock: FakeClock
) -> None:
    clock.step(+3600)
    daemon.poller.poll(FAST)
    clock.step(+3600)
    assert client.get("/readyz").status_code == 200


def test_a_clock_step_is_logged_once(caplog: pytest.LogCaptureFixture, clock: FakeClock) -> None:
    sim = SimBackend(load_scenario("h100-training"), clock=clock)
    p = Poller(sim, interval=5, slow_interval=60, timeout=0.3, clock=clock, monotonic=clock.monotonic)
    p.discover()
    caplog.set_level(logging.INFO)
    for _ in range(3):
        clock.advance(5)
        p.poll(FAST)
    clock.step(-3600)
    for _ in range(5):
        clock.advance(5)
        p.poll(FAST)
    steps = [r for r in caplog.records if r.getMessage() == "the wall clock stepped"]
    assert len(steps) == 1 and steps[0].levelno == logging.WARNING
    assert round(vars(steps[0])["seconds"]) == -3600
    sim.close()
