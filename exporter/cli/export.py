"""`gpu-triage export KIND DIR`: lay down the files the package ships for Prometheus, Grafana and systemd.

The files are read through importlib.resources, so an installed wheel gives the same bytes as a checkout.
Each kind names its files explicitly rather than listing a folder: a checkout's folder also holds READMEs,
pictures and tests that are not for a node, and a file missing from the wheel must fail loudly here (and in
tests/test_wheel.py) instead of being skipped without a word.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

FILE_MODE = 0o644  # configuration and dashboards hold no secrets; every service reads them
DIR_MODE = 0o755

KINDS: dict[str, tuple[str, ...]] = {
    "alerts": ("gpu-triage.rules.yml", "alertmanager.yml"),
    "dashboards": (
        "gpu-triage-fleet.json",
        "gpu-triage-node.json",
        "provisioning/dashboards/gpu-triage.yaml",
        "provisioning/datasources/prometheus.yaml",
    ),
    "systemd": ("gpu-triage.service", "gpu-triage.sysusers.conf", "config.yaml"),
}
WHAT = {
    "alerts": "the Prometheus alert rules and an example Alertmanager routing tree",
    "dashboards": "the two Grafana dashboards and the provisioning examples",
    "systemd": "the unit, the sysusers file for its user and the commented config file",
}


class ExportError(Exception):
    """Nothing was written; the message says why."""


def shipped(kind: str, name: str) -> bytes:
    """A file the package ships, by kind and its path within that kind ('provisioning/...')."""
    return resources.files("gpu_triage").joinpath(kind, *name.split("/")).read_bytes()


@dataclass(frozen=True)
class _Plan:
    target: Path
    data: bytes
    state: str  # "wrote", "unchanged" or "replaced"


def _plan(kind: str, dest: Path, force: bool) -> list[_Plan]:
    plans, clashes = [], []
    for name in KINDS[kind]:
        target = dest.joinpath(*name.split("/"))
        data = shipped(kind, name)
        if target.is_dir():
            raise ExportError(f"{target} is a directory")
        if not target.exists():
            plans.append(_Plan(target, data, "wrote"))
        elif target.read_bytes() == data:
            plans.append(_Plan(target, data, "unchanged"))
        else:
            clashes.append(target)
            plans.append(_Plan(target, data, "replaced"))
    if clashes and not force:
        names = ", ".join(str(c) for c in clashes)
        raise ExportError(f"{names}: differs from the shipped file; nothing written (--force replaces it)")
    return plans


def _write(target: Path, data: bytes) -> None:
    """Write through a temporary file and a rename: a reader never sees half a unit file, and a symlink
    at `target` is replaced rather than followed."""
    for parent in reversed([target.parent, *target.parent.parents]):
        if not parent.exists():
            parent.mkdir(mode=DIR_MODE)
    import tempfile  # `export` alone writes files: the other one-shot commands do without

    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(tmp).chmod(FILE_MODE)
        Path(tmp).replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise


def export(kind: str, dest: Path, *, force: bool = False, out: TextIO) -> None:
    """Write `kind`'s files under `dest`, one line each on `out`. Raises ExportError or OSError."""
    for plan in _plan(kind, dest, force):
        if plan.state != "unchanged":
            _write(plan.target, plan.data)
        out.write(f"{plan.state:9}  {plan.target}\n")
