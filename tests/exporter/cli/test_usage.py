"""How the command line answers mistakes: the right command's usage, one line per error, never a traceback."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.daemon_proc import GPU_TRIAGE


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run([GPU_TRIAGE, *args], input=stdin, capture_output=True, timeout=30, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["check", "--foo"], "usage: gpu-triage check "),
        (["xid", "79", "--foo"], "usage: gpu-triage xid "),
        (["diagnose", "--foo"], "usage: gpu-triage diagnose "),
        (["alerts", "render", "--foo"], "usage: gpu-triage alerts render "),
        (["export", "alerts", "/tmp/x", "--foo"], "usage: gpu-triage export "),
    ],
)
def test_an_unknown_flag_shows_that_commands_usage(args: list[str], usage: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(usage)
    assert result.stderr.splitlines()[-1].endswith("error: unrecognised arguments: --foo")


def test_check_help_shows_the_url_default() -> None:
    assert "default http://127.0.0.1:9481" in " ".join(run("check", "--help").stdout.split())


@pytest.mark.parametrize("value", ["-1s", "-5", "0"])
def test_a_negative_interval_must_be_positive(value: str, tmp_path: Path) -> None:
    result = run("serve", "--state.dir", str(tmp_path), "--collector.interval", value)
    assert result.returncode == 2
    assert result.stderr.splitlines()[1:] == [
        f"  - --collector.interval (or GPU_TRIAGE_COLLECTOR_INTERVAL): must be positive (got '{value}')"
    ]


def test_a_relative_runbook_base_is_refused() -> None:
    result = run("alerts", "render", "--runbook-base", "wiki")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "gpu-triage alerts render: the runbook base must be an absolute http:// or https:// URL, got 'wiki'\n"
    )


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["check", "--url", "http://[bad", "--timeout", "1"], b""),
        (["check", "--url", "localhost:1", "--timeout", "1", "--ca-file", "/nonexistent.pem"], b""),
        (["diagnose", "/"], b""),
        (["diagnose", "/nonexistent.log"], b""),
        (["diagnose", "-"], b"\x1f\x8b\x08\x00not gzip at all"),
        (["alerts", "render", "--runbook-base", "https://x", "-"], b"groups: [\n"),
        (["alerts", "render", "/nonexistent.yml"], b""),
        (["xid", "999"], b""),
    ],
)
def test_errors_are_one_line(args: list[str], stdin: bytes) -> None:
    result = run(*args, stdin=stdin)
    assert result.returncode != 0
    output = result.stderr or result.stdout
    assert "Traceback" not in result.stderr
    assert output.count("\n") == 1, output


def test_a_closed_pipe_is_not_an_error() -> None:
    """`gpu-triage alerts render | head -1`: the reader leaves early; no BrokenPipeError is printed."""
    shell = subprocess.run(
        f"{GPU_TRIAGE} alerts render | head -c 10 >/dev/null",
        check=False,
        shell=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.stderr == ""


def test_diagnose_says_it_reads_the_terminal() -> None:
    """With no file and a terminal on stdin, a user would otherwise see nothing happen."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the pty
        try:
            os.execv(GPU_TRIAGE, [GPU_TRIAGE, "diagnose"])
        finally:
            os._exit(127)  # never back into pytest
    seen = b""
    deadline = time.monotonic() + 20
    try:
        while b"Ctrl-D" not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                seen += os.read(fd, 1024)
        assert b"gpu-triage: reading the log from stdin (end it with Ctrl-D)" in seen
        os.write(fd, b"\x04")  # end of input at once: nothing read is not "nothing wrong"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 2
    finally:
        os.close(fd)  # a child still reading gets EOF and ends
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
