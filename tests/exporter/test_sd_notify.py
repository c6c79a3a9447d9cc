"""sd_notify against a real AF_UNIX datagram socket standing in for systemd: the notifier, the watchdog
thread, and `gpu-triage serve` as systemd would start it (Type=notify, WatchdogSec=)."""

from __future__ import annotations

import itertools
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpu_triage.exporter.sd_notify import Notifier, Watchdog
from gpu_triage.exporter.settings import parse_duration
from tests.conftest import REPO
from tests.daemon_proc import serve

# How long systemd gives the daemon after SIGTERM before it kills it: TimeoutStopSec= of the shipped unit.
_STOP = re.search(r"^TimeoutStopSec=(\S+)$", (REPO / "systemd" / "gpu-triage.service").read_text(), re.M)
assert _STOP is not None
STOP_TIMEOUT = parse_duration(_STOP[1])


@dataclass(frozen=True)
class Message:
    at: float  # time.monotonic() when it arrived
    assignments: tuple[str, ...]

    def get(self, key: str) -> str | None:
        return next((a.split("=", 1)[1] for a in self.assignments if a.startswith(f"{key}=")), None)


class FakeSystemd:
    """The receiving end of $NOTIFY_SOCKET, as PID 1 holds it: a bound AF_UNIX datagram socket."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.messages: list[Message] = []

    def receive(self, timeout: float) -> Message | None:
        """The next message, waiting up to `timeout` s for it (0: only one that has arrived already)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except (TimeoutError, BlockingIOError):
            return None
        message = Message(time.monotonic(), tuple(data.decode().split("\n")))
        self.messages.append(message)
        return message

    def next(self, timeout: float = 1.0) -> tuple[str, ...]:
        message = self.receive(timeout)
        assert message is not None, f"nothing arrived within {timeout}s"
        return message.assignments

    def queued(self) -> list[Message]:
        """What has arrived already. A datagram is queued here before the sender's send() returns, so once the
        sending is done (the ticks called, the thread or the process ended) this is all there will be."""
        got = []
        while (message := self.receive(0)) is not None:
            got.append(message)
        return got

    def collect(self, seconds: float) -> list[Message]:
        """Everything that arrives in the next `seconds`."""
        deadline, got = time.monotonic() + seconds, []
        while (left := deadline - time.monotonic()) > 0:
            if (message := self.receive(left)) is not None:
                got.append(message)
        return got

    def wait_for(self, key: str, value: str | None = None, timeout: float = 20.0) -> Message:
        """The next message that sets `key` (to `value`, if given)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.receive(left)
            if message is not None and message.get(key) is not None and value in (None, message.get(key)):
                return message
        wanted = f"{key}={value}" if value is not None else f"{key}="
        raise AssertionError(f"no {wanted} within {timeout}s; got {[m.assignments for m in self.messages]}")

    def close(self) -> None:
        self.sock.close()


def pings(messages: list[Message]) -> list[float]:
    return [m.at for m in messages if m.get("WATCHDOG") == "1"]


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[tuple[FakeSystemd, str]]:
    path = str(tmp_path / "notify.sock")
    fake = FakeSystemd(path)
    yield fake, path
    fake.close()


@pytest.fixture
def notifier_for() -> Iterator[Callable[..., Notifier]]:
    made: list[Notifier] = []

    def make(notify_socket: str | None, **env: str) -> Notifier:
        notifier = Notifier({**({"NOTIFY_SOCKET": notify_socket} if notify_socket else {}), **env})
        made.append(notifier)
        return notifier

    yield make
    for notifier in made:
        notifier.close()


# --- the notifier -------------------------------------------------------------------------------------


def test_without_notify_socket_everything_is_a_no_op(notifier_for: Callable[..., Notifier]) -> None:
    notifier = notifier_for(None, WATCHDOG_USEC="30000000")
    assert not notifier.enabled and notifier.watchdog_interval is None
    assert not notifier.ready("x") and not notifier.status("x") and not notifier.watchdog()
    assert not notifier.stopping()
    watchdog = Watchdog(notifier, lambda: True, lambda: "x")
    watchdog.start()
    assert not any(t.name == "sd-watchdog" for t in threading.enumerate())
    watchdog.stop()


def test_messages_reach_a_socket_in_the_filesystem(
    systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]
) -> None:
    fake, path = systemd
    notifier = notifier_for(path)
    assert notifier.ready("8 GPUs, 8 up; node healthy")
    assert fake.next() == ("READY=1", "STATUS=8 GPUs, 8 up; node healthy")
    assert notifier.watchdog()
    assert fake.next() == ("WATCHDOG=1",)
    # A newline would start another assignment: the status line stays one line.
    assert notifier.status("two\nlines")
    assert fake.next() == ("STATUS=two lines",)


def test_abstract_namespace_socket(notifier_for: Callable[..., Notifier]) -> None:
    name = f"gpu-triage-test-{os.getpid()}-{uuid.uuid4().hex}"
    fake = FakeSystemd(b"\0" + name.encode())
    try:
        notifier = notifier_for(f"@{name}")
        assert notifier.enabled and notifier.ready()
        assert fake.next() == ("READY=1",)
    finally:
        fake.close()


def test_stopping_is_said_once(systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]) -> None:
    fake, path = systemd
    notifier = notifier_for(path)
    assert notifier.stopping() and not notifier.stopping()
    assert fake.queued()[0].get("STOPPING") == "1"
    assert len(fake.messages) == 1


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(
    env: dict[str, str], interval: float | None, systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]
) -> None:
    assert notifier_for(systemd[1], **env).watchdog_interval == interval


def test_a_socket_that_is_not_there_is_logged_once_and_never_raises(
    tmp_path: Path, notifier_for: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "later.sock"
    notifier = notifier_for(str(path))
    with caplog.at_level(logging.INFO, logger="gpu_triage.exporter.sd_notify"):
        assert not notifier.ready() and not notifier.watchdog() and not notifier.status("x")
        assert [r.getMessage() for r in caplog.records] == ["cannot notify systemd"]
        fake = FakeSystemd(str(path))
        try:
            assert notifier.watchdog()
            assert fake.receive(1) is not None
        finally:
            fake.close()
    assert [r.getMessage() for r in caplog.records] == ["cannot notify systemd", "notifying systemd again"]


# --- the watchdog thread ------------------------------------------------------------------------------


def test_pings_are_due_every_interval(systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]) -> None:
    fake, path = systemd
    watchdog = Watchdog(notifier_for(path, WATCHDOG_USEC="2000000"), lambda: True, lambda: "8 GPUs, 8 up")
    assert watchdog.interval == 1.0
    for now in (0.0, 0.4, 0.99, 1.0, 1.5, 2.0):
        watchdog.tick(now)
    got = fake.queued()
    # Pinged at 0, 1 and 2; the status line went out once, with the first ping, as it never changed.
    assert [m.assignments for m in got] == [("WATCHDOG=1", "STATUS=8 GPUs, 8 up"), ("WATCHDOG=1",), ("WATCHDOG=1",)]


def test_pings_stop_while_the_poll_loop_hangs_and_resume_after(
    systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    fake, path = systemd
    caplog.set_level(logging.INFO, logger="gpu_triage.exporter.sd_notify")
    loop_turning = [True]
    watchdog = Watchdog(notifier_for(path, WATCHDOG_USEC="2000000"), lambda: loop_turning[0], lambda: "8 GPUs, 8 up")
    for now in (0.0, 1.0):
        watchdog.tick(now)
    loop_turning[0] = False  # the poll loop hangs
    for now in (2.0, 3.0, 4.0, 5.0):
        watchdog.tick(now)
    loop_turning[0] = True
    for now in (5.5, 6.0, 6.5):
        watchdog.tick(now)
    assert [m.assignments for m in fake.queued()] == [
        ("WATCHDOG=1", "STATUS=8 GPUs, 8 up"),
        ("WATCHDOG=1",),
        # 2.0 to 5.0: no ping for a hung poll loop, and the status line says why, once.
        (f"STATUS={Watchdog.STALLED}; 8 GPUs, 8 up",),
        # 5.5: pinged as soon as the loop turns again, not at the next whole interval.
        ("WATCHDOG=1", "STATUS=8 GPUs, 8 up"),
        ("WATCHDOG=1",),  # 6.5
    ]
    messages = [r.getMessage() for r in caplog.records if r.name == "gpu_triage.exporter.sd_notify"]
    assert sum("stalled" in m for m in messages) == 1 and sum("resumed" in m for m in messages) == 1, messages


def test_the_thread_looks_again_while_stalled_and_stops_for_good(
    systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]
) -> None:
    # The status is looked at only hourly here: while the loop is stalled only the ping cadence can wake the
    # thread, so that a loop that turns again is pinged for before systemd gives up on it.
    fake, path = systemd
    loop_turning = threading.Event()
    loop_turning.set()
    notifier = notifier_for(path, WATCHDOG_USEC="400000")
    watchdog = Watchdog(notifier, loop_turning.is_set, lambda: "8 GPUs, 8 up", status_interval=3600)
    watchdog.start()
    try:
        fake.wait_for("WATCHDOG", timeout=10)
        loop_turning.clear()
        fake.wait_for("STATUS", f"{Watchdog.STALLED}; 8 GPUs, 8 up", timeout=10)
        loop_turning.set()
        resumed = fake.wait_for("WATCHDOG", timeout=10)
    finally:
        watchdog.stop()
    assert resumed.assignments == ("WATCHDOG=1", "STATUS=8 GPUs, 8 up")
    assert not any(t.name == "sd-watchdog" for t in threading.enumerate())
    assert fake.queued() == []


def test_callbacks_that_raise_do_not_stop_the_thread(
    systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    fake, path = systemd

    def broken() -> str:
        raise RuntimeError("bug in the status line")

    watchdog = Watchdog(notifier_for(path, WATCHDOG_USEC="200000"), lambda: True, broken, status_interval=0.05)
    watchdog.start()
    try:
        got = [fake.wait_for("WATCHDOG", timeout=10) for _ in range(3)]
    finally:
        watchdog.stop()
    assert not any(m.get("STATUS") for m in fake.messages), got
    assert sum("status callback failed" in r.getMessage() for r in caplog.records) == 1


def test_a_raising_alive_callback_counts_as_a_stalled_loop(
    systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]
) -> None:
    fake, path = systemd

    def broken() -> bool:
        raise RuntimeError("bug in the heartbeat")

    watchdog = Watchdog(notifier_for(path, WATCHDOG_USEC="2000000"), broken, lambda: "8 GPUs, 8 up")
    for now in (0.0, 1.0, 2.0):
        watchdog.tick(now)
    assert [m.assignments for m in fake.queued()] == [(f"STATUS={Watchdog.STALLED}; 8 GPUs, 8 up",)]


def test_without_watchdog_sec_only_the_status_is_kept_current(
    systemd: tuple[FakeSystemd, str], notifier_for: Callable[..., Notifier]
) -> None:
    fake, path = systemd
    up = ["8 GPUs, 8 up"]
    looked = threading.Semaphore(0)

    def status() -> str:
        looked.release()
        return up[0]

    watchdog = Watchdog(notifier_for(path), lambda: True, status, status_interval=0.05)
    watchdog.start()
    try:
        fake.wait_for("STATUS", "8 GPUs, 8 up", timeout=10)
        up[0] = "8 GPUs, 7 up"
        fake.wait_for("STATUS", "8 GPUs, 7 up", timeout=10)
        while looked.acquire(blocking=False):  # the looks so far
            pass
        for _ in range(4):  # a few more looks at an unchanged status
            assert looked.acquire(timeout=10)
    finally:
        watchdog.stop()
    assert [m.assignments for m in fake.messages] == [("STATUS=8 GPUs, 8 up",), ("STATUS=8 GPUs, 7 up",)]


# --- gpu-triage serve under a stand-in systemd --------------------------------------------------------


@dataclass
class Run:
    before_ready: list[Message]
    ready: Message
    readyz_at_ready: int
    logged_before_ready: str
    serving: list[Message]  # from READY=1 up to SIGTERM
    serving_until: float  # time.monotonic() when SIGTERM was sent
    stopping: list[Message]  # from SIGTERM on
    returncode: int
    stop_seconds: float
    output: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """`gpu-triage serve` on the simulator with NOTIFY_SOCKET and WatchdogSec=1s, as systemd starts it;
    a GPU is made to fall off the bus while it serves, then it gets SIGTERM."""
    home = tmp_path_factory.mktemp("sd")
    fake = FakeSystemd(str(home / "notify.sock"))
    env = {"NOTIFY_SOCKET": str(home / "notify.sock"), "WATCHDOG_USEC": "1000000"}
    try:
        with serve(home, "--collector.interval", "1s", env=env, wait_ready=False) as daemon:
            ready = fake.wait_for("READY", timeout=30)
            # Straight away: systemd would now start the units ordered after this one. What the daemon logged
            # before it sent READY=1 is in its log by now (each record is flushed); what it logs later is not.
            logged = daemon.output()
            readyz = httpx.get(f"{daemon.url}/readyz", timeout=5).status_code
            before_ready = fake.messages[:-1]
            fake.collect(1.5)
            # The fault goes in from another thread, so that every datagram is timestamped as it arrives.
            with ThreadPoolExecutor(1) as pool:
                lost = pool.submit(httpx.post, f"{daemon.url}/api/v1/sim/faults", json={"gpu": 5, "kind": "gpu_lost"})
                fake.collect(2.5)
                assert lost.result().status_code == 201
            serving = fake.messages[len(before_ready) + 1 :]
            sent = time.monotonic()
            daemon.process.send_signal(signal.SIGTERM)
            daemon.process.wait(timeout=30)
            stop_seconds = time.monotonic() - sent
            stopping = fake.queued()  # it has exited: everything it sent is here
    finally:
        fake.close()
    returncode = daemon.process.returncode
    return Run(before_ready, ready, readyz, logged, serving, sent, stopping, returncode, stop_seconds, daemon.output())


def test_ready_only_once_the_first_snapshot_is_served(run: Run) -> None:
    assert run.readyz_at_ready == 200, "READY=1 came before /readyz would answer 200"
    # The backend was open, the first snapshot taken and the sockets bound before READY=1 was sent.
    assert "msg=started" in run.logged_before_ready and "msg=listening" in run.logged_before_ready, (
        run.logged_before_ready
    )
    assert (run.ready.get("STATUS") or "").startswith("8 GPUs, 8 up")
    # Before READY=1 only a "starting" status: no watchdog pings for a daemon that is not up yet.
    assert [m.get("STATUS") for m in run.before_ready] == ["starting: opening the GPU backend"]


def test_watchdog_pinged_well_within_watchdog_sec(run: Run) -> None:
    # WatchdogSec=1s: pings are due every 0.5 s; the serving window is over 4 s long.
    times = pings(run.serving)
    gaps = [b - a for a, b in itertools.pairwise([*times, run.serving_until])]
    assert len(times) >= 6, times
    assert max(gaps) < 1.0, f"a gap as long as WatchdogSec= would get the daemon killed: {gaps}"


def test_status_follows_the_node(run: Run) -> None:
    statuses = [s for m in run.serving if (s := m.get("STATUS")) is not None]
    assert any(s.startswith("8 GPUs, 7 up") for s in statuses), statuses


def test_sigterm_says_stopping_and_exits_cleanly(run: Run) -> None:
    assert run.returncode == 0, run.output
    assert run.stop_seconds < STOP_TIMEOUT, f"stopping took {run.stop_seconds:.1f}s, past TimeoutStopSec="
    stopping = [i for i, m in enumerate(run.stopping) if m.get("STOPPING") == "1"]
    assert len(stopping) == 1, run.stopping
    assert pings(run.stopping[stopping[0] :]) == [], "no watchdog pings once stopping"
