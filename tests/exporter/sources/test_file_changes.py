"""A follower sleeps until its file changes (inotify), and still sees appends, rotations and a stop."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_triage.exporter.sources import file_changes
from gpu_triage.exporter.sources.file_changes import FileChanges

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


def _woken_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None], within: float = 10.0
) -> bool:
    monkeypatch.setattr(file_changes, "RECHECK_SECONDS", 60.0)  # only a change can end the wait in time
    path = tmp_path / "kern.log"
    path.write_text("first\n")
    stop = threading.Event()
    changes = FileChanges(path, stop)
    assert changes.watching
    waiter = threading.Thread(target=changes.wait)
    waiter.start()
    change(path)
    waiter.join(timeout=within)
    woken = not waiter.is_alive()
    stop.set()
    waiter.join()
    changes.close()
    return woken


def _append(path: Path) -> None:
    with path.open("a") as f:
        f.write("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")


def _rotate(path: Path) -> None:
    path.rename(path.with_name("kern.log.1"))
    path.write_text("")


def _truncate(path: Path) -> None:
    path.write_text("")


@pytest.mark.parametrize("change", [_append, _rotate, _truncate], ids=["append", "rotate", "truncate"])
def test_a_change_to_the_file_ends_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None]
) -> None:
    assert _woken_by(tmp_path, monkeypatch, change)


def test_a_file_elsewhere_in_the_directory_changing_is_not_a_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.log"
    other.write_text("")

    def write_other(_: Path) -> None:
        with other.open("a") as f:
            f.write("written\n")

    assert not _woken_by(tmp_path, monkeypatch, write_other, within=1.0), "another file's appends are not watched"


def test_stop_ends_a_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_changes, "RECHECK_SECONDS", 60.0)
    path = tmp_path / "kern.log"
    path.write_text("")
    stop = threading.Event()
    changes = FileChanges(path, stop)
    waiter = threading.Thread(target=changes.wait)
    waiter.start()
    stop.set()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    changes.close()


def test_without_inotify_the_wait_is_a_short_sleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_changes, "_libc", lambda: None)
    path = tmp_path / "kern.log"
    path.write_text("")
    changes = FileChanges(path, threading.Event())
    assert not changes.watching
    changes.wait()  # returns after POLL_SECONDS
    changes.close()
