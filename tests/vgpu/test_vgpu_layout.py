"""tools/gen_vgpu_layout.py: the record's scalar members, generated for both sides, never drift, and the
layout version follows every change of the table or of vgpu/state.h."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from gpu_triage.exporter.vgpu import records as vgpu_records
from gpu_triage.exporter.vgpu import scalars as vgpu_scalars
from tests.conftest import REPO

TOOL = REPO / "tools/gen_vgpu_layout.py"
TABLE = "exporter/vgpu/layout.py"
GENERATED = ["vgpu/scalars.h", "exporter/vgpu/scalars.py"]


def gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], check=False, capture_output=True, text=True)


def _copy(tmp_path: Path) -> Path:
    for path in (TABLE, "vgpu/state.h", *GENERATED):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    return tmp_path


def _version(header: str) -> int:
    match = re.search(r"#define VGPU_LAYOUT_VERSION (0x[0-9a-f]+)u", header)
    assert match, header[:400]
    return int(match.group(1), 16)


def test_checked_in_files_are_current() -> None:
    result = gen("--check")
    assert result.returncode == 0, result.stderr


def test_both_sides_carry_the_same_version() -> None:
    assert _version((REPO / "vgpu/scalars.h").read_text()) == vgpu_scalars.LAYOUT_VERSION


def test_a_new_slot_makes_both_files_stale_and_a_new_version(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    table = repo / TABLE
    text = table.read_text()
    pad = re.search(r'    Slot\("reserved0".*\n', text)
    assert pad
    table.write_text(text.replace(pad.group(0), '    Slot("extra_mw", _U32, "gpu.x"),\n'))  # the pad put to use
    result = gen("--check", "--repo", str(repo))
    assert result.returncode == 1
    for path in GENERATED:
        assert f"{path} is out of date" in result.stderr
    assert (repo / GENERATED[0]).read_text() == (REPO / GENERATED[0]).read_text()  # --check writes nothing

    assert gen("--repo", str(repo)).returncode == 0
    header = (repo / GENERATED[0]).read_text()
    assert "uint32_t extra_mw;" in header
    assert _version(header) != vgpu_scalars.LAYOUT_VERSION
    assert "gpu.x,  # extra_mw" in (repo / GENERATED[1]).read_text()
    assert gen("--check", "--repo", str(repo)).returncode == 0


def test_an_edit_of_state_h_is_a_new_version(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    state = repo / "vgpu/state.h"
    state.write_text(state.read_text().replace("#define VGPU_MAX_PROCS 32", "#define VGPU_MAX_PROCS 33"))
    assert gen("--repo", str(repo)).returncode == 0
    assert _version((repo / GENERATED[0]).read_text()) != vgpu_scalars.LAYOUT_VERSION


def test_a_misaligned_slot_is_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    table = repo / TABLE
    table.write_text(
        table.read_text().replace('    Slot("reserved0"', '    Slot("wide", "uint64_t", "0"),\n    Slot("reserved0"')
    )
    result = gen("--check", "--repo", str(repo))
    assert result.returncode != 0
    assert "not 8-byte aligned" in result.stderr


def test_the_scalars_sit_where_the_hand_written_record_parts_leave_room() -> None:
    # Between the head (ECC and retired pages) and the strings, as state.h's static asserts pin in C.
    assert vgpu_scalars.SCALARS_OFFSET == 912
    assert vgpu_scalars.SCALARS_OFFSET + vgpu_scalars.SCALARS.size == 1232
    assert vgpu_records.GPU_SIZE == 21648
