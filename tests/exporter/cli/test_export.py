"""`gpu-triage export KIND DIR`: the shipped files, byte for byte, with sane modes, never clobbering an edit."""

from __future__ import annotations

import io
import stat
import subprocess
from pathlib import Path

import pytest

from gpu_triage.exporter.cli.export import KINDS, ExportError, export
from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE


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
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert f"wrote      {target}\n" in out.getvalue()
    for d in (tmp_path / "new", *(p for p in tmp_path.rglob("*") if p.is_dir())):
        assert stat.S_IMODE(d.stat().st_mode) & 0o755 == 0o755


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
    assert "usage: gpu-triage export" in result.stderr and "'alerts', 'dashboards', 'systemd'" in result.stderr
