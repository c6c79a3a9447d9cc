"""Slow, silent and greedy clients, on real sockets against a real daemon: they are cut off, and
Prometheus still gets /metrics."""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpu_triage.exporter.http.connections import OutOfFilesFilter
from tests.daemon_proc import GPU_TRIAGE, Server, free_port, running, state_args, wait_for

# Runs the daemon with a small limit on open files, soft and hard, as a unit's LimitNOFILE= would.
_LIMITED = "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"


@contextlib.contextmanager
def daemon(home: Path, *args: str, nofile: int | None = None) -> Iterator[Server]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    prefix = [sys.executable, "-c", _LIMITED, str(nofile)] if nofile else []
    cmd = [*prefix, GPU_TRIAGE, "serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{port}"]
    with running([*cmd, *state_args(home), *args], url=url, ready=f"{url}/readyz", log=home / "daemon.log") as s:
        yield s


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("strict")
    with daemon(home, "--web.read-header-timeout=1s", "--web.read-timeout=2s") as s:
        yield s


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_by_server(server: Server, sock: socket.socket) -> bool:
    """The daemon has read all that `sock` sent: the kernel holds nothing more for it (its receive queue on the
    daemon's side of the connection, in /proc/net/tcp, is empty)."""
    port = int(server.url.rsplit(":", 1)[1])
    client = sock.getsockname()[1]
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state, queues = row.split()[1:5]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == client and state == "01":
            return int(queues.split(":")[1], 16) == 0
    return False


def closed_by_server(sock: socket.socket, trickle: bytes = b"", within: float = 15.0) -> bool:
    """Keep sending `trickle` (nothing: stay silent) until the server closes the connection, or `within` s."""
    deadline = time.monotonic() + within
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe: closed
            return True
    return False


def answer(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(4096):
            data += chunk
    return data


def test_a_trickled_head_is_cut_off(strict: Server) -> None:
    with connect(strict.url) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert closed_by_server(sock, trickle=b"X-a: b\r\n"), "a head trickled for 15 s kept its connection"


def test_a_silent_connection_is_cut_off(strict: Server) -> None:
    with connect(strict.url) as sock:
        assert closed_by_server(sock), "a connection that never spoke stayed open for 15 s"


def test_a_kept_alive_connection_must_send_its_next_head_in_time(strict: Server) -> None:
    with connect(strict.url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert closed_by_server(sock, trickle=b"X-a: b\r\n")


def test_a_body_declared_too_large_is_refused_before_it_is_sent(strict: Server) -> None:
    with connect(strict.url) as sock:
        sock.sendall(
            b"POST /api/v1/gpus/0/acknowledge HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 800000000\r\n\r\n"
        )
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/api/v1/gpus/0/acknowledge", b"application/json"), ("/api/v1/diagnose", b"text/plain")],
)
def test_a_body_that_does_not_arrive_in_time_is_refused(strict: Server, path: str, kind: bytes) -> None:
    with connect(strict.url) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n".encode()
        sock.sendall(head + b"Content-Type: " + kind + b"\r\n\r\n" + b"{")
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]


def test_slow_uploads_do_not_hold_the_diagnose_slots(strict: Server) -> None:
    slow = [connect(strict.url) for _ in range(2)]
    try:
        for sock in slow:
            sock.sendall(b"POST /api/v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nNCCL")
        wait_for(
            lambda: all(read_by_server(strict, sock) for sock in slow), timeout=10, interval=0.01, what="the heads read"
        )
        fast = httpx.post(f"{strict.url}/api/v1/diagnose", content=b"NCCL WARN Call to ibv_poll_cq failed\n")
        assert fast.status_code == 200, fast.text
    finally:
        for sock in slow:
            sock.close()  # hung up half-way: the client's doing, not an error of the daemon's
    # Real time under test: the daemon, another process, may see the hang-up only at its 2 s read timeout, and what
    # its handlers do then leaves no trace to wait on but the log this checks.
    time.sleep(2.5)
    assert "Traceback" not in strict.output() and "request failed" not in strict.output(), strict.output()[-3000:]


def test_trickling_connections_do_not_keep_scrapers_out(tmp_path: Path) -> None:
    """More trickling connections than the daemon has file descriptors: /metrics still answers."""
    nofile, attackers = 256, 600
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < attackers + 100:
        pytest.skip(f"this test process may open only {soft} files")
    with daemon(tmp_path, "--web.read-header-timeout=60s", nofile=nofile) as d:
        held: list[socket.socket] = []
        try:
            for _ in range(attackers):
                with contextlib.suppress(OSError):
                    sock = connect(d.url)
                    held.append(sock)
                    with contextlib.suppress(OSError):
                        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            for _ in range(20):
                scrape = httpx.get(f"{d.url}/metrics", timeout=10)
                assert scrape.status_code == 200 and "nvidia_gpu_up" in scrape.text
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: httpx.get(f"{d.url}/healthz").status_code == 200, what="the daemon to answer afterwards")
        out = d.output()
    assert out.count("Too many open files") <= 2, out[-2000:]


def test_running_out_of_files_is_logged_once_a_minute() -> None:
    now = [0.0]
    flt = OutOfFilesFilter(interval=60, clock=lambda: now[0])
    error = OSError(24, "Too many open files")

    def record() -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "accept failed", None, (OSError, error, None))

    passed = [flt.filter(record()) for _ in range(1000)]
    assert passed.count(True) == 1
    now[0] = 61.0
    later = record()
    assert flt.filter(later) and "999 more like it" in later.getMessage()
    assert flt.filter(logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "other", None, None))
