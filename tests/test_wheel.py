"""The wheel as a user gets it: built from this tree, installed into a clean venv, run with no checkout.

Offline and quick: the wheel is built without build isolation (the dev venv has setuptools), installed
with --no-index --no-deps, and the clean venv finds its dependencies through a .pth file holding the dev
venv's site-packages as a plain path line. Python appends such a line to sys.path without reading the .pth
files in that folder, so the dev venv's editable install (a .pth pointing at this checkout) stays out of
sight, and every command below runs from a temporary directory: only the installed copy can answer.
"""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gpu_triage import __version__
from gpu_triage.exporter.cli.export import KINDS
from tests.conftest import REPO
from tests.daemon_proc import free_port, running, state_args

# What the build reads: pyproject's package-dir and package data, and the readme it names.
_SOURCES = (
    "pyproject.toml", "README.md", "src", "exporter", "diagnosis", "alerts", "dashboards", "systemd", "slurm", "kubernetes",
)  # fmt: skip


@dataclass(frozen=True)
class Installed:
    venv: Path
    site: Path
    added: set[str]  # what installing the wheel added to site-packages
    cwd: Path  # an empty directory, far from any checkout
    build_log: str  # setuptools' verbose output

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "gpu-triage"), *args],
            cwd=self.cwd,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and "GPU_TRIAGE" not in k}


def _check(cmd: list[str], cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    tree = root / "tree"
    tree.mkdir()
    for name in _SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, tree / name)
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build_log = _check(
        [*pip, "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(tree)], root
    )
    wheel = next(dist.glob("gpu_triage-*.whl"))

    venv = root / "venv"
    _check([sys.executable, "-m", "venv", str(venv)], root)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            env=_clean_env(),
        ).stdout.strip()
    )
    before = {p.name for p in site.iterdir()}
    _check([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], root)
    added = {p.name for p in site.iterdir()} - before
    (site / "zz_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cwd = root / "elsewhere"
    cwd.mkdir()
    yield Installed(venv, site, added, cwd, build_log)


def test_site_packages_gains_gpu_triage_and_nothing_else(installed: Installed) -> None:
    assert installed.added == {"gpu_triage", f"gpu_triage-{__version__}.dist-info"}
    assert not (installed.site / "exporter").exists() and not (installed.site / "diagnosis").exists()
    for kind in KINDS:
        assert (installed.site / "gpu_triage" / kind).is_dir(), kind


# Imported by the product but not declared: it comes with a declared one that pins the versions it works with.
_COMES_WITH = {"starlette": "fastapi"}


def test_every_third_party_import_is_a_declared_dependency(installed: Installed) -> None:
    """The clean venv borrows the dev venv's packages, so a missing runtime dependency would not show
    above; the wheel's metadata must name the distribution of every module the installed code imports."""
    imported: set[str] = set()
    for source in (installed.site / "gpu_triage").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"gpu_triage", "__future__"}
    distributions = importlib.metadata.packages_distributions()
    [dist_info] = installed.site.glob("gpu_triage-*.dist-info")
    metadata = email.parser.Parser().parsestr((dist_info / "METADATA").read_text())
    required = {
        re.split(r"[ <>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-")
        for r in metadata.get_all("Requires-Dist") or []
        if "extra ==" not in r
    }
    for module in sorted(third_party):
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        assert names, f"{module}: no installed distribution provides it"
        assert names & required or _COMES_WITH.get(module) in required, f"{module} ({names}) is not in Requires-Dist"


def test_the_build_raises_no_setuptools_warning(installed: Installed) -> None:
    """Such as a folder named like a package but left out of it (the layout once had them)."""
    assert not re.findall(r".*\w+Warning\b.*", installed.build_log)


def test_the_installed_copy_is_the_one_that_runs(installed: Installed) -> None:
    probe = "import sys, gpu_triage; print(gpu_triage.__file__); print(*sys.path, sep='\\n')"
    lines = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", probe],
        cwd=installed.cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert lines[0] == str(installed.site / "gpu_triage" / "__init__.py")
    checkout = {str(REPO), str(REPO / "src")}
    assert not checkout & set(lines[1:]), "the checkout is on sys.path (the editable install's .pth was read)"


def test_alerts_render_renders_the_shipped_rules(installed: Installed) -> None:
    result = installed.run("alerts", "render", "--runbook-base", "https://wiki.example.com/gpu")
    assert result.returncode == 0, result.stderr
    assert '"https://wiki.example.com/gpu/reboot-node"' in result.stdout
    plain = installed.run("alerts", "render")
    assert plain.stdout == (REPO / "alerts" / "gpu-triage.rules.yml").read_text()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_export_lays_down_the_shipped_files(installed: Installed, kind: str) -> None:
    dest = installed.cwd / f"out-{kind}"
    result = installed.run("export", kind, str(dest))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(KINDS[kind])
    command = installed.venv / "bin" / "gpu-triage"
    for name in KINDS[kind]:
        expected = (REPO / kind / name).read_bytes()
        if name == "gpu-triage.service":  # the unit starts the installed command
            expected = expected.replace(b"ExecStart=/usr/local/bin/gpu-triage ", f"ExecStart={command} ".encode())
        assert (dest / name).read_bytes() == expected, name


def test_export_all_writes_the_runbooks_too(installed: Installed) -> None:
    dest = installed.cwd / "out-all"
    assert installed.run("export", "all", str(dest)).returncode == 0
    assert (dest / "runbooks/xid-79.md").read_bytes() == (REPO / "diagnosis/playbooks/xid-79.md").read_bytes()
    assert (dest / "kubernetes/kustomization.yaml").is_file() and (dest / "slurm/gpu-triage-healthcheck").is_file()


def test_explain_and_diagnose_read_their_data(installed: Installed) -> None:
    assert "action: REBOOT_NODE" in installed.run("xid", "79").stdout
    log = installed.cwd / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n")
    result = installed.run("diagnose", str(log))
    assert result.returncode == 1 and "runbook: /runbooks/xid-79" in result.stdout


def test_serve_on_the_simulator_answers_metrics(installed: Installed) -> None:
    home = installed.cwd / "state"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(installed.venv / "bin" / "gpu-triage"), "serve", "--backend", "sim"]
    cmd += [f"--web.listen-address=127.0.0.1:{port}", *state_args(home)]
    with running(cmd, url=url, ready=f"{url}/readyz", log=home / "daemon.log", cwd=installed.cwd) as server:
        metrics = httpx.get(f"{url}/metrics").text
        assert sum(line.startswith("nvidia_gpu_up{") for line in metrics.splitlines()) == 8
        assert httpx.get(f"{url}/runbooks/xid-79").status_code == 200
    assert server.process.returncode == 0, server.output()
