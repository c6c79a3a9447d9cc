"""A quiet source sleeps in one poll(2) until it has something to read or is told to stop: no timer wakes it."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.exporter.sources import file_changes, kmsg, stop_signal
from gpu_triage.exporter.sources.stop_signal import StopSignal, poll_fd, wait_readable
from tests.daemon_proc import wait_for
from tests.exporter.sources.test_kmsg import follow


class CountingPoll:
    """select.poll, counting the poll(2) calls made on every poll object (each is one sleep and one wake)."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self._poll = select.poll

    def __call__(self) -> Any:
        real = self._poll()
        counter = self

        class Poll:
            def register(self, fd: int, mask: int) -> None:
                real.register(fd, mask)

            def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
                with counter.lock:
                    counter.calls += 1
                return real.poll(timeout)

        return Poll()


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> CountingPoll:
    counting = CountingPoll()
    monkeypatch.setattr(stop_signal.select, "poll", counting)
    return counting


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_wait_on_a_stop_signal_sleeps_in_one_poll_until_set(polls: CountingPoll, pipe: tuple[int, int]) -> None:
    stop = StopSignal()
    waiter, result = _in_thread(lambda: wait_readable(pipe[0], stop, None))
    time.sleep(0.5)  # a wait that woke every 0.1 s to look at the event would have polled five times by now
    assert waiter.is_alive() and polls.calls == 1
    stop.set()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and result == [False], "stop ends the wait at once, with nothing to read"
    assert stop.is_set()
    stop.close()


def test_data_on_the_descriptor_ends_the_wait(pipe: tuple[int, int]) -> None:
    stop = StopSignal()
    waiter, result = _in_thread(lambda: wait_readable(pipe[0], stop, None))
    os.write(pipe[1], b"x")
    waiter.join(timeout=5)
    assert result == [True] and not stop.is_set()
    assert wait_readable(pipe[0], stop, 0.0), "still readable: nothing was read"
    stop.close()


def test_a_set_signal_ends_every_later_wait_until_cleared(pipe: tuple[int, int]) -> None:
    stop = StopSignal()
    stop.set()
    stop.set()
    assert wait_readable(pipe[0], stop, None) is False  # returns at once: no timeout needed
    stop.clear()
    t0 = time.monotonic()
    assert wait_readable(pipe[0], stop, 0.2) is False
    assert time.monotonic() - t0 >= 0.15, "cleared: the wait lasts its timeout again"
    stop.close()


def test_a_plain_event_still_stops_the_wait(pipe: tuple[int, int]) -> None:
    stop = threading.Event()
    waiter, result = _in_thread(lambda: wait_readable(pipe[0], stop, None))
    stop.set()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and result == [False]


def test_a_closed_signal_is_an_event_and_nothing_else() -> None:
    stop = StopSignal()
    assert poll_fd(stop) == stop.fileno()
    stop.close()
    stop.close()
    assert poll_fd(stop) is None and stop.closed
    stop.set()  # writes nothing into a descriptor number that may now be another file's
    assert stop.wait(0)


@pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")
def test_a_quiet_followed_file_is_looked_at_only_at_its_recheck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, polls: CountingPoll
) -> None:
    """The kernel-log follower of a file nobody writes: asleep between its rechecks, and it stops at once."""
    monkeypatch.setattr(file_changes, "RECHECK_SECONDS", 60.0)
    path = tmp_path / "kern.log"
    path.write_text("")
    follower, got = follow(path)
    try:
        deadline = time.monotonic() + 10
        while polls.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert follower.stats.up
        time.sleep(0.5)
        assert polls.calls == 1, "asleep in one poll: no timer looks at the stop event"
        with path.open("a") as f:
            f.write("6,1,0,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
        assert got.wait_for(1)[0].text.startswith("NVRM: Xid")
    finally:
        t0 = time.monotonic()
        follower.stop()
    assert not follower.running and time.monotonic() - t0 < 1.0, "stop() wakes the sleeping reader"


def test_the_real_dev_kmsg_reader_sleeps_until_stopped(polls: CountingPoll) -> None:
    device = Path("/dev/kmsg")
    if not os.access(device, os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    follower, got = follow(device)
    try:
        got.wait_for(1)  # the ring buffer read up to its end; then the reader waits for the next record
        time.sleep(0.5)
        assert 1 <= polls.calls <= 3, "a quiet /dev/kmsg costs a poll per record that arrives, not one per interval"
    finally:
        follower.stop()
    assert not follower.running


@pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")
def test_a_followed_file_that_goes_away_is_reported_while_the_reader_sleeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asleep with no timer, the reader still finds out that its kernel log is gone, and says it cannot read it."""
    monkeypatch.setattr(file_changes, "RECHECK_SECONDS", 60.0)  # only the deletion itself can wake it in time
    monkeypatch.setattr(kmsg, "_ROTATION_GRACE_SECONDS", 0.2)
    path = tmp_path / "kern.log"
    path.write_text("")
    follower, _ = follow(path)
    try:
        wait_for(lambda: follower.stats.up, interval=0.01, what="the file followed")
        path.unlink()
        wait_for(lambda: not follower.stats.up, timeout=10, interval=0.01, what="the missing file reported")
        assert "No such file" in (follower.stats.error or "")
    finally:
        follower.stop()
