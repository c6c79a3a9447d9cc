"""The Python writer on its own: the file it makes, who may write it, and what it refuses to write."""

from __future__ import annotations

import stat
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.vgpu.conftest import vs


def test_the_file_appears_whole_and_readable_by_other_users(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with vs.StateWriter(path, vs.h100_node()):
        raw = path.read_bytes()
        assert len(raw) == vs.FILE_SIZE
        assert raw[:8] == vs.MAGIC
        assert struct.unpack_from("<I", raw, 56)[0] == 8  # gpu_count, before the first write()
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        assert [p.name for p in tmp_path.iterdir()] == ["state"]  # no temporary left behind


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with vs.StateWriter(path), pytest.raises(RuntimeError, match="another StateWriter"):
        vs.StateWriter(path)


def test_reopening_updates_the_same_file_in_place_and_continues_the_events(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with vs.StateWriter(path, vs.h100_node()) as w:
        assert w.push_xid(0, 79) == 1
    inode = path.stat().st_ino
    with vs.StateWriter(path, vs.h100_node()[:2]) as w:  # readers that mapped the file keep it
        assert w.push_xid(1, 48) == 2
    assert path.stat().st_ino == inode
    assert struct.unpack_from("<QI", path.read_bytes(), 48) == (2, 2)  # event_total, gpu_count


def test_a_file_that_is_not_a_state_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_bytes(b"something else")
    with vs.StateWriter(path, vs.h100_node()):
        assert path.read_bytes()[:8] == vs.MAGIC


def test_each_write_moves_the_seqlock_by_two(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with vs.StateWriter(path, vs.h100_node()) as w:
        before = struct.unpack_from("<Q", path.read_bytes(), 32)[0]
        w.write(vs.h100_node())
        w.push_xid(0, 31)
        assert struct.unpack_from("<Q", path.read_bytes(), 32)[0] == before + 4  # even: no write in progress


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda g: setattr(g, "name", "x" * 96), "name is longer"),
        (lambda g: setattr(g, "nvlinks", [vs.NvLink()] * 37), "at most 36 NVLinks"),
        (lambda g: setattr(g, "processes", [vs.Process(1, 0)] * 33), "at most 32 processes"),
        (lambda g: setattr(g, "unsupported_fields", {512}), "field id: 512"),
        (lambda g: setattr(g, "gpm", {128: 1.0}), "GPM metric id: 128"),
        (lambda g: setattr(g, "ecc", {(2, 0, 0): 1}), "ECC key"),
        (lambda g: setattr(g, "clocks_mhz", [1, 2, 3]), "clocks_mhz needs one value"),
        (lambda g: setattr(g, "max_mig_devices", 8), "max_mig_devices"),
    ],
)
def test_what_the_layout_cannot_hold_is_refused(
    tmp_path: Path, change: Callable[[vs.Gpu], object], message: str
) -> None:
    g = vs.h100(0)
    change(g)
    with vs.StateWriter(tmp_path / "state") as w, pytest.raises(ValueError, match=message):
        w.write([g])


def test_too_many_gpus_and_a_wrong_record_are_refused(tmp_path: Path) -> None:
    with vs.StateWriter(tmp_path / "state") as w:
        with pytest.raises(ValueError, match="at most 64 GPUs"):
            w.write([vs.h100(i % 8) for i in range(65)])
        with pytest.raises(ValueError, match="a GPU record is"):
            w.write([b"short"])
