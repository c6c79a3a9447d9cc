"""Real server processes for tests and benches: started on 127.0.0.1, waited for, always stopped.

`serve` runs `gpu-triage serve` on the simulator with its own state directory and an empty kernel-log
file (never /var/lib/gpu-triage or the host's /dev/kmsg), on a free loopback port. `running` does the
same for any command (Prometheus, Alertmanager, a bench server). Both wait for readiness with a
deadline, fail at once if the process exits, and on the way out send SIGTERM, wait, and kill.

Standard library and httpx only: bench/ scripts import this too, after putting the repository root on
sys.path.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")

GPU_TRIAGE = str(Path(sys.executable).with_name("gpu-triage"))
STOP_SECONDS = 10.0  # after SIGTERM, before SIGKILL
# Inherited variables that would change how a started daemon behaves: settings from the environment, and
# systemd's notify socket, watchdog and state directory when the test run itself is a systemd service.
_NOT_INHERITED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "STATE_DIRECTORY", "GPU_TRIAGE_")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.25, what: str = "condition"
) -> T:
    """Poll `predicate` until it returns something truthy, and return that; AssertionError after `timeout` s.

    An exception from `predicate` ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)  # the poll's cadence: this is the helper the tests wait with


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path | None  # stdout and stderr together; None: inherited from this process

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log is not None else ""


@dataclass
class Daemon(Server):
    state: Path
    kmsg: Path  # the kernel log it follows: append lines to inject them


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_SECONDS) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds; reaped either way."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    return env | dict(extra or {})


@contextlib.contextmanager
def running(
    cmd: Sequence[str],
    *,
    url: str,
    ready: str | None,
    log: Path | None,
    env: Mapping[str, str] | None = None,
    verify: ssl.SSLContext | bool = True,
    auth: tuple[str, str] | None = None,
    timeout: float = 30.0,
    cwd: Path | None = None,
) -> Iterator[Server]:
    """`cmd` as a process, once GET `ready` answers 200 (None: at once); stopped when the block exits."""
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("wb")) if log is not None else None
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT if out else None, env=_environment(env), cwd=cwd
        )
        server = Server(url, process, log)
        try:
            if ready is not None:
                _wait_ready(server, ready, verify, auth, timeout)
            yield server
        finally:
            stop(process)


def _wait_ready(
    server: Server, ready: str, verify: ssl.SSLContext | bool, auth: tuple[str, str] | None, timeout: float
) -> None:
    def up() -> bool:
        if server.process.poll() is not None:
            raise AssertionError(f"{server.process.args!r} exited with {server.process.returncode}:\n{_tail(server)}")
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(ready, timeout=1, verify=verify, auth=auth).status_code == 200
        return False

    try:
        wait_for(up, timeout, interval=0.1, what=f"{ready} to answer 200")
    except AssertionError as e:
        if server.process.poll() is not None:
            raise
        raise AssertionError(f"{e}:\n{_tail(server)}") from None


def _tail(server: Server) -> str:
    return server.output()[-3000:] if server.log is not None else "(its output is above)"


def state_args(home: Path) -> list[str]:
    """--state.dir `home` and --kmsg.path an empty file in it, no kubelet socket and an empty /proc: a daemon
    that touches nothing of the host's. (A flag given again later on the command line wins.)"""
    home.mkdir(parents=True, exist_ok=True)
    kmsg = home / "kmsg.log"
    kmsg.touch()
    return [
        "--state.dir", str(home), "--kmsg.path", str(kmsg),
        "--kubernetes.pod-resources-socket", "off", "--path.procfs", str(home / "no-proc"),
    ]  # fmt: skip


@contextlib.contextmanager
def serve(
    home: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    ca_file: Path | None = None,
    auth: tuple[str, str] | None = None,
    wait_ready: bool = True,
    capture: bool = True,
    timeout: float = 30.0,
) -> Iterator[Daemon]:
    """`gpu-triage serve --backend sim` on 127.0.0.1:<free port> with `home` as its state directory, the
    empty `home`/kmsg.log as its kernel log and, with `capture`, its output in `home`/daemon.log.

    `ca_file` means the daemon serves HTTPS (a --web.config.file among `args`) with a certificate signed by
    it; `auth` is the basic-auth user and password readiness is asked with. `wait_ready` False yields as
    soon as the process is started (for a test that waits on something else, such as sd_notify).
    """
    port = free_port()
    url = f"{'https' if ca_file else 'http'}://127.0.0.1:{port}"
    cmd = [GPU_TRIAGE, "serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{port}", *state_args(home)]
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    log = home / "daemon.log" if capture else None
    ready = f"{url}/readyz" if wait_ready else None
    with running(
        [*cmd, *args], url=url, ready=ready, log=log, env=env, verify=verify, auth=auth, timeout=timeout
    ) as server:
        yield Daemon(server.url, server.process, server.log, home, home / "kmsg.log")
