"""A broken diagnosis data file stops the daemon and the commands that use the data, naming every problem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.diagnosis.core import data_files
from gpu_triage.diagnosis.core.data_files import DataError
from gpu_triage.diagnosis.core.playbooks import load_playbook_dir
from gpu_triage.diagnosis.knowledge import check as data_check
from gpu_triage.diagnosis.knowledge.check import check_data
from gpu_triage.exporter.backends.sim import SimBackend
from gpu_triage.exporter.cli.main import main
from gpu_triage.exporter.daemon import Daemon
from tests.conftest import settings


@pytest.fixture
def broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The playbooks: one page without front-matter, one with an unknown action."""
    pages = tmp_path / "playbooks"
    pages.mkdir()
    (pages / "reset-gpu.md").write_text("no front-matter\n", encoding="utf-8")
    (pages / "xid-79.md").write_text("---\nid: xid-79\naction: PANIC\n---\n", encoding="utf-8")
    monkeypatch.setattr(data_check, "load_playbooks", lambda: load_playbook_dir(pages))
    # Nothing from the knowledge cache either: neither its snapshot nor what this process adopted from it.
    monkeypatch.setenv("GPU_TRIAGE_CACHE_DIR", "off")
    monkeypatch.setattr(data_files, "_ADOPTED", {})
    check_data.cache_clear()
    yield
    check_data.cache_clear()


@pytest.mark.parametrize("args", [["xid", "79"], ["diagnose", "-"]])
def test_a_command_that_uses_the_data_refuses_to_run(
    broken: None, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "reset-gpu.md: must start with a '---' line" in err
    assert "xid-79.md: action 'PANIC' is not one of" in err


def test_the_daemon_does_not_start(broken: None, sim: SimBackend, tmp_path: Path) -> None:
    daemon = Daemon(sim, settings(tmp_path), boot_id="boot-1")
    try:
        with pytest.raises(DataError, match=r"reset-gpu\.md: must start"):
            daemon.start()
    finally:
        daemon.stop()
