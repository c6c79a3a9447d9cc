"""The cache directory (exporter/cache_store.py): a file is trusted whole and as written, or not at all."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from gpu_triage.exporter.cache_store import FileStore, default_dir

KEY = "knowledge-0123456789abcdef0123456789abcdef"


def test_what_is_put_is_what_is_got_and_older_versions_go(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache")
    store.put(KEY.replace("0123", "aaaa"), b"old")
    store.put(KEY, b"payload")
    assert store.get(KEY) == b"payload"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{KEY}.bin"]
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],  # cut short
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # one bit of the payload flipped
        lambda data: b"X" + data[1:],  # not our magic
        lambda data: b"",
    ],
    ids=["truncated", "bit-flip", "magic", "empty"],
)
def test_a_damaged_file_is_not_trusted(tmp_path: Path, damage: object) -> None:
    store = FileStore(tmp_path)
    store.put(KEY, b"payload" * 100)
    path = tmp_path / f"{KEY}.bin"
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    assert store.get(KEY) is None


def test_a_file_others_can_write_is_not_trusted(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put(KEY, b"payload")
    path = tmp_path / f"{KEY}.bin"
    path.chmod(0o664)
    assert store.get(KEY) is None
    path.chmod(0o644)
    assert store.get(KEY) == b"payload"


def test_a_fifo_under_the_keys_name_does_not_hold_the_reader(tmp_path: Path) -> None:
    """Nobody writes to it: a blocking open() would wait for a writer for ever, and start-up with it."""
    os.mkfifo(tmp_path / f"{KEY}.bin")
    worker = threading.Thread(target=FileStore(tmp_path).get, args=(KEY,), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert FileStore(tmp_path).get(KEY) is None


def test_a_file_in_the_right_format_but_not_sealed_by_its_digest_is_refused(tmp_path: Path) -> None:
    magic = b"gpu-triage cache 1\n"
    (tmp_path / f"{KEY}.bin").write_bytes(magic + hashlib.sha256(b"other").digest() + b"payload")
    assert FileStore(tmp_path).get(KEY) is None


def test_a_directory_that_cannot_be_made_costs_nothing_but_speed(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    store = FileStore(tmp_path / "a-file" / "cache")  # fails even for root, unlike a read-only mode
    store.put(KEY, b"payload")  # no exception
    assert store.get(KEY) is None


def test_keys_are_names_not_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cache key"):
        FileStore(tmp_path).get("../../etc/passwd")


def test_the_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPU_TRIAGE_CACHE_DIR", "off")
    assert default_dir() is None
    monkeypatch.setenv("GPU_TRIAGE_CACHE_DIR", str(tmp_path))
    assert default_dir() == tmp_path
    monkeypatch.delenv("GPU_TRIAGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "gpu-triage"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_dir() == tmp_path / ".cache" / "gpu-triage"
