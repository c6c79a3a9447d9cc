"""The README is the front door: its quickstart, flag table and metric table must stay true."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpu_triage.exporter.settings import OPTIONS
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def test_quickstart_is_two_commands_that_exist() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quickstart.strip().splitlines()]
    assert commands == ["make run", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def _make_run(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "-n", "--no-print-directory", "run", *args], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    (serve,) = [line for line in done.stdout.splitlines() if " serve " in line]
    return serve


def test_make_run_serves_this_machine_only_unless_told() -> None:
    """On the simulator, whoever reaches the port can inject faults: `make run` keeps to 127.0.0.1."""
    assert "--web.listen-address 127.0.0.1:9481 " in _make_run()
    assert "--web.listen-address :9481 " in _make_run("LISTEN=:9481")


def test_every_flag_is_documented() -> None:
    for option in OPTIONS:
        assert f"`--{option.flag}`" in README, option.flag


def test_every_metric_is_documented() -> None:
    """Every family on the golden /metrics page (the daemon's own process_/python_ ones aside)."""
    golden = (REPO / "tests" / "golden" / "metrics-sim.prom").read_text()
    names = re.findall(r"^# HELP (\S+) ", golden, re.M)
    assert len(names) > 40
    for name in names:
        if not name.startswith(("process_", "python_")):
            assert f"`{name}`" in README, name
