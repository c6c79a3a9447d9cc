"""A real, small disk for tests that need one to fill up: a tmpfs mounted for the test (root only)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str = "4m") -> Iterator[Path]:
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    mounted = subprocess.run(mount, capture_output=True, check=False)
    if mounted.returncode != 0:
        message = f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}"
        if os.environ.get("GPU_TRIAGE_REQUIRE_TOOLS"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill `disk` to the last block with one file; unlink it to free the space."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return filler
