"""`gpu-triage export KIND DIR`: lay down the files the package ships for Prometheus, Grafana, systemd, Slurm
and Kubernetes, and the playbooks as Markdown for a wiki.

The files are read through importlib.resources, so an installed wheel gives the same bytes as a checkout.
Each kind names its files explicitly rather than listing a folder: a checkout's folder also holds READMEs,
pictures and tests that are not for a node, and a file missing from the wheel must fail loudly here (and in
tests/test_wheel.py) instead of being skipped without a word. Two files are not written as shipped: the
systemd unit starts the gpu-triage this export ran from, and the runbooks are made from the playbooks.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TextIO

FILE_MODE = 0o644  # configuration and dashboards hold no secrets; every service reads them
SCRIPT_MODE = 0o755
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
    "slurm": ("gpu-triage-healthcheck", "prolog.sh", "epilog.sh", "epilog-hang.sh"),
    "kubernetes": (
        "kustomization.yaml",
        "base/kustomization.yaml",
        "base/namespace.yaml",
        "base/serviceaccount.yaml",
        "base/resourcequota.yaml",
        "base/daemonset.yaml",
        "base/service.yaml",
        "base/servicemonitor.yaml",
        "base/prometheusrule.yaml",
        "base/grafana-dashboards.yaml",
        "overlays/gpu-operator/kustomization.yaml",
        "overlays/gpu-operator/daemonset.yaml",
        "overlays/node-condition/kustomization.yaml",
        "overlays/node-condition/daemonset.yaml",
        "overlays/node-condition/rbac.yaml",
        "overlays/unprivileged/kustomization.yaml",
        "overlays/unprivileged/daemonset.yaml",
        "examples/flight-recorder-job.yaml",
    ),
}
SCRIPTS = {("slurm", name) for name in KINDS["slurm"]}
RUNBOOKS = "runbooks"  # made from the playbooks, not shipped as files
ALL = "all"
CHOICES = (*sorted([*KINDS, RUNBOOKS]), ALL)
WHAT = {
    "alerts": "the Prometheus alert rules and an example Alertmanager routing tree",
    "dashboards": "the two Grafana dashboards and the provisioning examples",
    "systemd": "the unit (starting this gpu-triage), the sysusers file for its user and the commented config file",
    "slurm": "the HealthCheckProgram wrapper, the prolog, the epilog and the hang-collecting epilog",
    "kubernetes": "the kustomize tree (kustomization.yaml, base/, overlays/) and examples/",
    RUNBOOKS: "every playbook as Markdown, <id>.md, and an index.md, for a wiki (alerts render --runbook-base)",
    ALL: "every kind above, each in DIR/<kind>",
}
UNIT = "gpu-triage.service"
SHIPPED_COMMAND = "/usr/local/bin/gpu-triage"
_EXEC_START = re.compile(rf"^ExecStart={re.escape(SHIPPED_COMMAND)} ", re.M)
_HIDDEN = ("/home/", "/root/", "/run/user/")  # what the unit's ProtectHome=yes makes unreachable


class ExportError(Exception):
    """Nothing was written; the message says why."""


def shipped(kind: str, name: str) -> bytes:
    """A file the package ships, by kind and its path within that kind ('provisioning/...')."""
    return resources.files("gpu_triage").joinpath(kind, *name.split("/")).read_bytes()


def running_command() -> Path | None:
    """The gpu-triage command this process runs as (the console script), else the one on PATH."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "gpu-triage" and argv0.is_file():
        return argv0.absolute()  # not resolved: pipx's link in ~/.local/bin outlives an upgrade, its target not
    import shutil  # here: main.py imports this module for every command, and shutil brings bz2 and lzma

    found = shutil.which("gpu-triage")
    return Path(found).absolute() if found else None


def unit_for(command: Path | None) -> bytes:
    """The shipped unit with ExecStart= starting `command` (None: the shipped /usr/local/bin/gpu-triage)."""
    text = shipped("systemd", UNIT).decode()
    if command is None:
        return text.encode()
    path = str(command).replace("%", "%%")  # systemd expands % specifiers in ExecStart=
    if not re.fullmatch(r"[\w./+%-]+", path):
        path = '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    text, found = _EXEC_START.subn(lambda _: f"ExecStart={path} ", text, count=1)
    if not found:
        raise ExportError(f"the shipped {UNIT} has no ExecStart={SHIPPED_COMMAND} line to point at {command}")
    return text.encode()


def _unit_note(command: Path | None) -> str:
    if command is None:
        return (
            f"{UNIT}: ExecStart={SHIPPED_COMMAND} is assumed (no gpu-triage command found): install it there, "
            "or give ExecStart= in a drop-in (systemctl edit gpu-triage)"
        )
    note = f"{UNIT}: ExecStart={command}, the gpu-triage this export ran from (systemctl edit gpu-triage changes it)"
    if str(command).startswith(_HIDDEN):
        note += (
            f"; but the unit's ProtectHome=yes hides {command} from the service, which then fails to start: "
            "install gpu-triage outside /home and /root (systemd/README.md, Install)"
        )
    return note


def _runbooks() -> list[tuple[str, bytes]]:
    from gpu_triage.diagnosis.core.playbooks import load_playbooks

    books = sorted(load_playbooks().values(), key=lambda p: p.id)
    rows = "".join(f"| [{p.id}]({p.id}.md) | {p.title} | {p.severity.value} | `{p.action.value}` |\n" for p in books)
    index = (
        "# gpu-triage runbooks\n\nWhat each finding and alert of gpu-triage means and what to do about it. The "
        "alerts link here when rendered with `gpu-triage alerts render --runbook-base <this page's URL>`.\n\n"
        "| runbook | title | severity | action |\n|---|---|---|---|\n" + rows
    )
    return [("index.md", index.encode()), *((f"{p.id}.md", p.source.encode()) for p in books)]


def files(kind: str, command: Path | None) -> list[tuple[str, bytes, int]]:
    """(path within the kind, bytes, mode) of every file `kind` writes."""
    if kind == RUNBOOKS:
        return [(name, data, FILE_MODE) for name, data in _runbooks()]
    out = []
    for name in KINDS[kind]:
        data = unit_for(command) if (kind, name) == ("systemd", UNIT) else shipped(kind, name)
        out.append((name, data, SCRIPT_MODE if (kind, name) in SCRIPTS else FILE_MODE))
    return out


@dataclass(frozen=True)
class _Plan:
    target: Path
    data: bytes
    mode: int
    state: str  # "wrote", "unchanged" or "replaced"


def _kinds(kind: str, dest: Path) -> Iterator[tuple[str, Path]]:
    if kind == ALL:
        yield from ((k, dest / k) for k in CHOICES if k != ALL)
    else:
        yield kind, dest


def _plan(kind: str, dest: Path, force: bool, command: Path | None) -> list[_Plan]:
    plans, clashes = [], []
    for each, where in _kinds(kind, dest):
        for name, data, mode in files(each, command):
            target = where.joinpath(*name.split("/"))
            if target.is_dir():
                raise ExportError(f"{target} is a directory")
            if not target.exists():
                plans.append(_Plan(target, data, mode, "wrote"))
            elif target.read_bytes() == data:
                plans.append(_Plan(target, data, mode, "unchanged"))
            else:
                clashes.append(target)
                plans.append(_Plan(target, data, mode, "replaced"))
    if clashes and not force:
        names = ", ".join(str(c) for c in clashes)
        raise ExportError(f"{names}: differs from the shipped file; nothing written (--force replaces it)")
    return plans


def _write(target: Path, data: bytes, mode: int) -> None:
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
        Path(tmp).chmod(mode)
        Path(tmp).replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise


def export(
    kind: str,
    dest: Path,
    *,
    force: bool = False,
    command: Path | None = None,
    out: TextIO,
    err: TextIO | None = None,
) -> None:
    """Write `kind`'s files under `dest`, one line each on `out`, and what the unit will start on `err`.
    `command`: the gpu-triage the systemd unit starts (None: the shipped path). Raises ExportError or OSError."""
    for plan in _plan(kind, dest, force, command):
        if plan.state != "unchanged":
            _write(plan.target, plan.data, plan.mode)
        out.write(f"{plan.state:9}  {plan.target}\n")
    if err is not None and kind in ("systemd", ALL):
        err.write(_unit_note(command) + "\n")
