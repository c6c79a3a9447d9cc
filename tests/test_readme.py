"""The README is the front door: its quickstart, flag table and metric table must stay true."""

from __future__ import annotations

import re

from exporter.backends.base import Collector
from exporter.metrics import FAMILIES, daemon_families
from exporter.settings import OPTIONS
from exporter.snapshot import CollectorStatus, Snapshot
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def test_quickstart_is_two_commands_that_exist() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quickstart.strip().splitlines()]
    assert commands == ["make run", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_every_flag_is_documented() -> None:
    for option in OPTIONS:
        assert f"`--{option.flag}`" in README, option.flag


def test_every_metric_is_documented() -> None:
    names = ["nvidia_gpu_info"] + [f.name + ("_total" if f.counter else "") for f in FAMILIES]
    status = {Collector.POWER: CollectorStatus(True, 0.1, 1.0)}
    names += [m.name + ("_info" if m.type == "info" else "") for m in daemon_families(Snapshot(1.0, "sim", (), status))]
    for name in names:
        assert f"`{name}`" in README, name
