"""The background-worker helper every long-lived thread of the daemon runs on."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from gpu_triage.exporter.worker import Worker


def test_stop_wakes_a_turn_waiting_on_stopping_at_once() -> None:
    turns = threading.Semaphore(0)
    worker: Worker

    def turn() -> None:
        turns.release()
        worker.stopping.wait(3600)  # an hour's interval: only stop() can end this wait in time

    worker = Worker("test-waiting", turn)
    worker.start()
    assert turns.acquire(timeout=5), "the first turn runs"
    t0 = time.monotonic()
    assert worker.stop(timeout=5), "the thread has ended"
    assert time.monotonic() - t0 < 1.0
    assert not worker.alive and not turns.acquire(timeout=0), "no turn after stop"


def test_wake_unblocks_a_turn_that_waits_on_something_else() -> None:
    bell = threading.Event()
    waiting = threading.Event()

    def turn() -> None:
        waiting.set()
        bell.wait(3600)

    worker = Worker("test-wake", turn, wake=bell.set)
    worker.start()
    assert waiting.wait(5)
    assert worker.stop(timeout=5)
    assert not worker.alive


def test_an_exception_is_logged_counted_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    second = threading.Event()

    def turn() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("a bug in the turn")
        second.set()
        worker.stopping.wait(3600)

    worker = Worker("test-failing", turn, retry=0.01)
    with caplog.at_level(logging.ERROR, logger="gpu_triage.exporter.worker"):
        worker.start()
        assert second.wait(5), "turned again after the failure"
    assert worker.failures == 1 and worker.alive
    (record,) = [r for r in caplog.records if r.name == "gpu_triage.exporter.worker"]
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)
    assert record.__dict__["worker"] == "test-failing"
    assert worker.stop(timeout=5)


def test_stop_during_the_retry_wait_ends_it_at_once() -> None:
    failed = threading.Event()

    def turn() -> None:
        failed.set()
        raise RuntimeError("always")

    worker = Worker("test-retry", turn, retry=3600)
    worker.start()
    assert failed.wait(5)
    t0 = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - t0 < 1.0 and worker.failures == 1


def test_a_turn_that_sets_stopping_is_the_last() -> None:
    turns = 0

    def turn() -> None:
        nonlocal turns
        turns += 1
        if turns == 3:
            worker.stopping.set()

    worker = Worker("test-last", turn)
    worker.start()
    assert worker.join(timeout=5)
    assert turns == 3 and not worker.alive


def test_starting_twice_is_an_error() -> None:
    worker = Worker("test-twice", lambda: worker.stopping.wait(3600))
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="started already"):
            worker.start()
    finally:
        assert worker.stop(timeout=5)
    with pytest.raises(RuntimeError):
        worker.start()  # not restartable either: a stopped worker's owner makes a new one


def test_a_worker_never_started_stops_and_joins_at_once() -> None:
    worker = Worker("test-idle", lambda: None)
    assert worker.stop(timeout=5) and worker.join(timeout=5)
    assert not worker.started and not worker.alive


def test_stop_from_its_own_thread_does_not_wait_for_itself() -> None:
    returned: list[bool] = []

    def turn() -> None:
        returned.append(worker.stop(timeout=30))

    worker = Worker("test-self", turn)
    worker.start()
    assert worker.join(timeout=5)
    assert returned == [False], "stop() from the worker's thread returns at once, the thread not yet ended"


def test_the_thread_carries_the_name_and_is_a_daemon() -> None:
    seen: list[threading.Thread] = []

    def turn() -> None:
        seen.append(threading.current_thread())
        worker.stopping.set()

    worker = Worker("test-named", turn)
    worker.start()
    assert worker.join(timeout=5)
    assert seen[0].name == "test-named" and seen[0].daemon
