"""`gpu-triage export KIND DIR`: the shipped files, byte for byte (the unit starting the gpu-triage that wrote
it), with sane modes, never clobbering an edit; the playbooks as a wiki's Markdown; everything at once."""

from __future__ import annotations

import io
import stat
import subprocess
from pathlib import Path

import pytest

from gpu_triage.exporter.cli.export import CHOICES, KINDS, SCRIPTS, ExportError, export, unit_for
from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE

PLAYBOOKS = sorted(p.name for p in (REPO / "diagnosis/playbooks").glob("*.md"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPU_TRIAGE, *args], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_export_writes_the_repository_files(kind: str, tmp_path: Path) -> None:
    out = io.StringIO()
    export(kind, tmp_path / "new" / kind, out=out)
    written = sorted(p.relative_to(tmp_path / "new" / kind).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(KINDS[kind])
    for name in KINDS[kind]:
        target = tmp_path / "new" / kind / name
        assert target.read_bytes() == (REPO / kind / name).read_bytes()
        assert stat.S_IMODE(target.stat().st_mode) == (0o755 if (kind, name) in SCRIPTS else 0o644)
        assert f"wrote      {target}\n" in out.getvalue()
    for d in (tmp_path / "new", *(p for p in tmp_path.rglob("*") if p.is_dir())):
        assert stat.S_IMODE(d.stat().st_mode) & 0o755 == 0o755


def test_the_kinds_hold_every_deployable_file_of_their_folder() -> None:
    """A new manifest or script in the repository must be shipped too (or this test says which)."""
    for kind, pattern in (("kubernetes", "**/*.yaml"), ("slurm", "*")):
        found = {p.relative_to(REPO / kind).as_posix() for p in (REPO / kind).glob(pattern) if p.is_file()}
        found -= {"README.md"} | {f for f in found if f.startswith("schemas/")}  # docs, and the tests' CRD schemas
        assert found == set(KINDS[kind]), kind


def test_every_shipped_kind_is_declared_package_data() -> None:
    """What export lists must be in the wheel: each name matches a package-data glob of pyproject.toml."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gpu_triage"]
    for kind, names in KINDS.items():
        for name in names:
            assert any(fnmatch.fnmatchcase(f"{kind}/{name}", g) for g in globs), f"{kind}/{name}"


def test_an_edited_file_is_kept_unless_forced(tmp_path: Path) -> None:
    assert run("export", "systemd", str(tmp_path)).returncode == 0
    config = tmp_path / "config.yaml"
    config.write_text("backend: sim\n")
    (tmp_path / "gpu-triage.service").unlink()

    refused = run("export", "systemd", str(tmp_path))
    assert refused.returncode == 1
    assert refused.stderr == (
        f"gpu-triage export: {config}: differs from the shipped file; nothing written (--force replaces it)\n"
    )
    assert config.read_text() == "backend: sim\n"
    assert not (tmp_path / "gpu-triage.service").exists(), "a refused export writes nothing at all"

    forced = run("export", "systemd", str(tmp_path), "--force")
    assert forced.returncode == 0
    assert forced.stdout.splitlines() == [
        f"wrote      {tmp_path / 'gpu-triage.service'}",
        f"unchanged  {tmp_path / 'gpu-triage.sysusers.conf'}",
        f"replaced   {config}",
    ]
    assert config.read_bytes() == (REPO / "systemd" / "config.yaml").read_bytes()


def test_a_symlink_in_the_way_is_replaced_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.yml"
    elsewhere.write_text("mine\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "alertmanager.yml").symlink_to(elsewhere)
    with pytest.raises(ExportError):
        export("alerts", tmp_path / "out", out=io.StringIO())
    export("alerts", tmp_path / "out", force=True, out=io.StringIO())
    assert elsewhere.read_text() == "mine\n"
    assert not (tmp_path / "out" / "alertmanager.yml").is_symlink()


def test_unwritable_or_odd_targets_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "gpu-triage.service").mkdir()
    result = run("export", "systemd", str(tmp_path))
    assert (result.returncode, result.stderr) == (
        1,
        f"gpu-triage export: {tmp_path / 'gpu-triage.service'} is a directory\n",
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run("export", "dashboards", str(blocker / "sub"))
    assert result.returncode == 1 and result.stderr.startswith("gpu-triage export: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_unknown_kind_shows_the_kinds() -> None:
    result = run("export", "grafana", "/tmp")
    assert result.returncode == 2
    assert "usage: gpu-triage export" in result.stderr
    assert "'alerts', 'dashboards', 'kubernetes', 'runbooks', 'slurm', 'systemd', 'all'" in result.stderr


def test_the_unit_starts_the_gpu_triage_that_exported_it(tmp_path: Path) -> None:
    result = run("export", "systemd", str(tmp_path))
    assert result.returncode == 0
    unit = (tmp_path / "gpu-triage.service").read_text()
    shipped = (REPO / "systemd/gpu-triage.service").read_text()
    assert unit == shipped.replace("ExecStart=/usr/local/bin/gpu-triage ", f"ExecStart={GPU_TRIAGE} ")
    assert result.stderr.startswith(f"gpu-triage.service: ExecStart={GPU_TRIAGE}, the gpu-triage this export ran from")


def test_a_command_the_unit_cannot_reach_is_said_so(tmp_path: Path) -> None:
    """ProtectHome=yes hides /home and /root from the service: a pipx install there cannot be started."""
    home = tmp_path / "export"
    err = io.StringIO()
    export("systemd", home, command=Path("/home/ann/.local/bin/gpu-triage"), out=io.StringIO(), err=err)
    assert "ExecStart=/home/ann/.local/bin/gpu-triage " in (home / "gpu-triage.service").read_text()
    assert "ProtectHome=yes hides /home/ann/.local/bin/gpu-triage" in err.getvalue()
    err = io.StringIO()
    export("systemd", tmp_path / "assumed", out=io.StringIO(), err=err)
    assert "ExecStart=/usr/local/bin/gpu-triage is assumed" in err.getvalue()


def test_odd_command_paths_are_quoted_for_systemd() -> None:
    unit = unit_for(Path("/opt/gpu triage/100%/gpu-triage")).decode()
    assert 'ExecStart="/opt/gpu triage/100%%/gpu-triage" serve --config /etc/gpu-triage/config.yaml\n' in unit


def test_runbooks_are_the_playbooks_with_an_index(tmp_path: Path) -> None:
    export("runbooks", tmp_path, out=io.StringIO())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*PLAYBOOKS, "index.md"])
    for name in PLAYBOOKS:
        assert (tmp_path / name).read_bytes() == (REPO / "diagnosis/playbooks" / name).read_bytes()
    index = (tmp_path / "index.md").read_text()
    assert "| [xid-79](xid-79.md) | Xid 79: GPU has fallen off the bus | critical | `REBOOT_NODE` |" in index
    assert all(f"]({name})" in index for name in PLAYBOOKS)


def test_the_runbook_ids_are_the_ones_the_alerts_link_to(tmp_path: Path) -> None:
    """`alerts render --runbook-base URL` links URL/<id>: each id has its <id>.md here."""
    from gpu_triage.exporter.cli.alert_rules import runbook_ids

    export("runbooks", tmp_path, out=io.StringIO())
    ids = set(runbook_ids((REPO / "alerts/gpu-triage.rules.yml").read_text()))
    assert ids and all((tmp_path / f"{rid}.md").is_file() for rid in ids)


def test_all_writes_every_kind_in_a_folder_of_its_own(tmp_path: Path) -> None:
    result = run("export", "all", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(k for k in CHOICES if k != "all")
    for kind, names in KINDS.items():
        for name in names:
            assert (tmp_path / kind / name).is_file(), f"{kind}/{name}"
    assert len(list((tmp_path / "runbooks").glob("*.md"))) == len(PLAYBOOKS) + 1
    again = run("export", "all", str(tmp_path))
    assert again.returncode == 0 and all(line.startswith("unchanged") for line in again.stdout.splitlines())
    (tmp_path / "slurm/prolog.sh").write_text("# mine\n")
    refused = run("export", "all", str(tmp_path / ""))
    assert refused.returncode == 1 and "prolog.sh: differs" in refused.stderr


def test_the_exported_kustomize_tree_renders_as_the_repository_s(tmp_path: Path) -> None:
    from tests.kubernetes.manifests import kubectls

    kubectl = kubectls()[0]
    export("kubernetes", tmp_path / "k", out=io.StringIO())
    for where in ("", "base", "overlays/unprivileged"):
        ours, theirs = (
            subprocess.run([kubectl, "kustomize", str(root / where)], capture_output=True, text=True, check=True).stdout
            for root in (tmp_path / "k", REPO / "kubernetes")
        )
        assert ours == theirs, where
