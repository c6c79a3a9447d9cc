"""The server's main loop, which wakes once a second rather than uvicorn's ten: a SIGTERM still stops it at
once, and the Date header (RFC 9110: the time the answer was made) still turns with the wall clock's second.

The server runs in this (the main) thread, where signals land, as `gpu-triage serve` runs it.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
import uvicorn

from gpu_triage.exporter.http.server import _Server

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")


async def _hello(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def _serve(server: _Server, beside: Callable[[str], None]) -> float:
    """Run `server` here until it stops, `beside(url)` in a thread once it serves; the seconds from the end
    of `beside` to the server's return. A server still running 20 s after `beside` ends has its loop
    stopped, which fails the test instead of hanging it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    ended: list[float] = []
    errors: list[BaseException] = []
    returned = threading.Event()

    def helper() -> None:
        try:
            while not server.started:
                time.sleep(0.01)
            beside(url)
        except BaseException as e:  # reported by the test, in its thread
            errors.append(e)
            server.should_exit = True
        ended.append(time.monotonic())
        if not returned.wait(20) and server._loop is not None:
            server._loop.call_soon_threadsafe(server._loop.stop)

    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    try:
        server.run(sockets=[sock])
    finally:
        returned.set()
        done = time.monotonic()
        thread.join(5)
        sock.close()
    if errors:
        raise errors[0]
    return done - ended[0]


def _server() -> _Server:
    return _Server(uvicorn.Config(_hello, log_config=None, lifespan="off", access_log=False))


def test_sigterm_stops_the_loop_at_once_however_long_its_tick() -> None:
    server = _server()
    server.tick_seconds = 3600.0  # were the loop to wait for its timer, the test would time out
    previous = signal.getsignal(signal.SIGTERM)

    def answer_then_term(url: str) -> None:
        assert httpx.get(url, timeout=5).text == "hello"
        os.kill(os.getpid(), signal.SIGTERM)

    assert _serve(server, answer_then_term) < 15
    assert signal.getsignal(signal.SIGTERM) == previous  # the server's handler is gone with it


def test_the_date_header_turns_with_the_second() -> None:
    seen: list[tuple[float, float, float]] = []

    def ask_for_three_seconds(url: str) -> None:
        with httpx.Client(timeout=5) as client:
            start = time.time()
            while time.time() - start < 3.0:
                before = time.time()
                date = parsedate_to_datetime(client.get(url).headers["date"]).timestamp()
                seen.append((before, date, time.time()))
                time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    _serve(_server(), ask_for_three_seconds)
    assert len({date for _, date, _ in seen}) >= 3  # it moves: three seconds, three dates
    for before, date, after in seen:
        assert date <= after  # never ahead of the clock
        if before - math.floor(before) > 0.3:  # past the turn by more than a loaded loop's lag
            assert date >= math.floor(before), (before, date)  # not the second that has ended


def test_an_exit_asked_before_the_loop_runs_ends_it_at_its_first_tick() -> None:
    server = _server()
    server.tick_seconds = 3600.0
    server.should_exit = True
    asyncio.run(asyncio.wait_for(server.main_loop(), 5))
