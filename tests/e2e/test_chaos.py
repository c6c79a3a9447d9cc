"""Chaos on the XID path: kill -9 mid-burst, rotation and truncation while down, copytruncate while down, NUL
padding after a power loss, a full disk (while running and at start), corrupt lines, a journal clobbered while
down.

The real daemon follows a real kernel-log file and keeps its journal on a small tmpfs this test mounts
(so the disk can really fill up). At the end every XID line written has been counted exactly once.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.daemon_proc import GPU_TRIAGE, free_port, stop, wait_for
from tests.small_disk import fill, small_disk

pytestmark = pytest.mark.e2e


class Node:
    """The kernel log of a node whose GPU 0 (PCI 18) keeps reporting XID 13, each line with its own pid."""

    def __init__(self, kmsg: Path, rng: random.Random) -> None:
        self.kmsg = kmsg
        self.rng = rng
        self.written: list[int] = []
        kmsg.touch()

    def burst(self, n: int, *, padded: bool = False) -> list[int]:
        """`n` XID lines; `padded`: after NULs, as a file holds them after a power loss (blocks never written)."""
        first = len(self.written)
        with self.kmsg.open("a") as f:
            if padded:
                f.write("\x00" * self.rng.randint(1000, 20_000))
            for _ in range(n):
                pid = 10_000 + len(self.written)
                self.written.append(pid)
                f.write(
                    f"Nov 30 03:00:00 node kernel: NVRM: Xid (PCI:0000:18:00): 13, pid={pid}, name=python3, "
                    "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n"
                )
                if self.rng.random() < 0.1:  # corrupt records and junk between the good lines
                    f.write(
                        self.rng.choice(
                            [
                                f"6,1,{'9' * 400},-;NVRM: Xid (PCI:0000:18:00): {'9' * 30}, bad\n",
                                "\x00" * 300 + "\n",
                                "6,٣,1,-;x\n",
                            ]
                        )
                    )
                if self.rng.random() < 0.05:
                    f.flush()
        return self.written[first:]


class Daemon:
    def __init__(self, state: Path, kmsg: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            GPU_TRIAGE, "serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{self.port}",
            "--state.dir", str(state), "--kmsg.path", str(kmsg), "--collector.interval", "1s",
        ]  # fmt: skip
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_for(self._alive, 30, 0.1, "the daemon to answer")

    def _alive(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        return False

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)

    def pids(self) -> list[int]:
        events = httpx.get(f"{self.url}/api/v1/events", params={"xid": 13, "limit": 10_000}, timeout=10).json()
        return sorted(e["pid"] for e in events["events"])

    def counted(self) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith('nvidia_gpu_xid_errors_total{gpu="0"') and 'xid="13"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def caught_up(self, node: Node) -> None:
        wait_for(lambda: self.counted() >= len(node.written), 60, 0.2, f"{len(node.written)} XIDs counted")

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} is not on /metrics")


def test_every_xid_line_is_counted_exactly_once_through_chaos(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    with small_disk(tmp_path / "state") as state:
        node = Node(tmp_path / "kmsg.log", rng)
        daemon = Daemon(state, node.kmsg, tmp_path / "daemon.log")
        try:
            kills_and_files(daemon, node, tmp_path, rng)
            full_disks(daemon, node, state)
            # And a last kill mid-burst, and a restart.
            node.burst(300)
            daemon.kill()
            daemon.start()
            daemon.caught_up(node)
            assert daemon.pids() == sorted(node.written), "each XID line counted exactly once"
            assert daemon.counted() == len(node.written)
            # The journal clobbered while down: moved aside, its history gone with it, but its place in the kernel
            # log kept, so the lines written meanwhile are counted in the new one, each once.
            daemon.stop()
            down = node.burst(30)
            with (state / "journal.sqlite3").open("r+b") as journal:
                journal.write(os.urandom(100))
            daemon.start()
            wait_for(lambda: daemon.counted() >= len(down), 60, 0.2, f"the {len(down)} XIDs written while down")
            assert daemon.pids() == sorted(down) and daemon.metric("gpu_triage_journal_moved_aside_total") == 1
        finally:
            daemon.stop()


def kills_and_files(daemon: Daemon, node: Node, tmp_path: Path, rng: random.Random) -> None:
    # Killed in the middle of bursts, three times.
    for _ in range(3):
        daemon.start()
        node.burst(rng.randint(100, 300))
        node.burst(rng.randint(100, 300))
        daemon.kill()
    # Rotated while down, with lines written to the old file before and to the new one after.
    node.burst(50)
    node.kmsg.rename(tmp_path / "kmsg.log.1")
    node.burst(30)
    daemon.start()
    daemon.caught_up(node)
    daemon.stop()
    # Truncated in place while down (copytruncate), then longer than before.
    node.kmsg.write_text("")
    node.burst(rng.randint(400, 600))
    daemon.start()
    daemon.caught_up(node)
    # logrotate's copytruncate while down: the lines written before the copy are only in the copy.
    daemon.stop()
    node.burst(40)
    (tmp_path / "kmsg.log.2").write_bytes(node.kmsg.read_bytes())
    node.kmsg.write_text("")
    node.burst(20)
    daemon.start()
    daemon.caught_up(node)
    # A power loss: NUL padding where the file's last blocks were never written, then the next lines.
    daemon.kill()
    node.burst(25, padded=True)
    daemon.start()
    daemon.caught_up(node)


def full_disks(daemon: Daemon, node: Node, state: Path) -> None:
    # The disk fills up: XIDs written meanwhile wait, the daemon says so, and nothing is lost.
    filler = fill(state)
    node.burst(200)
    wait_for(lambda: daemon.metric("gpu_triage_journal_up") == 0, 30, 0.2, "the journal to be reported down")
    assert httpx.get(f"{daemon.url}/readyz", timeout=5).status_code == 503
    node.burst(100)
    filler.unlink()
    daemon.caught_up(node)
    assert daemon.metric("gpu_triage_journal_up") == 1
    # A restart on a full disk: GPU telemetry at once, the XIDs written meanwhile once the journal opens.
    daemon.stop()
    filler = fill(state)
    node.burst(150)
    daemon.start()
    assert daemon.metric("gpu_triage_journal_up") == 0
    assert 'nvidia_gpu_temperature_celsius{gpu="0"' in httpx.get(f"{daemon.url}/metrics", timeout=10).text
    assert httpx.get(f"{daemon.url}/readyz", timeout=5).status_code == 503
    assert httpx.get(f"{daemon.url}/api/v1/events", timeout=5).status_code == 503
    refused = httpx.post(f"{daemon.url}/api/v1/gpus/0/acknowledge", timeout=5)
    assert refused.status_code == 503 and "not stored" in refused.json()["error"]
    node.burst(50)
    filler.unlink()
    daemon.caught_up(node)
    assert daemon.metric("gpu_triage_journal_up") == 1
