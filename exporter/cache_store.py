"""Where one-shot commands keep what they would otherwise rebuild on every start: a directory of blobs.

diagnosis/knowledge/cache.py puts the checked knowledge here and diagnosis/training/scan/block_scan.py the compiled
Hyperscan database, each under a key naming the version it is of. This module only keeps bytes: each
file holds a magic tag, the SHA-256 of its payload and the payload, written to a temporary file and
renamed into place, so a reader sees a whole file or none. A file that is truncated, altered, not owned
by this user or writable by others is not trusted: `get` answers None and the caller rebuilds, then
`put` replaces it. Any failure to read or write (a read-only home, a full disk) only costs the speed.

The directory: GPU_TRIAGE_CACHE_DIR, else $XDG_CACHE_HOME/gpu-triage, else ~/.cache/gpu-triage;
GPU_TRIAGE_CACHE_DIR=off keeps nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

CACHE_ENV = "GPU_TRIAGE_CACHE_DIR"
_MAGIC = b"gpu-triage cache 1\n"
_KEY = re.compile(r"[a-z][a-z0-9-]{0,40}-[0-9a-f]{8,64}")  # `<kind>-<version digest>`
MAX_BYTES = 64 << 20  # a blob bigger than this is not ours


def default_dir() -> Path | None:
    """The cache directory the environment names (None: GPU_TRIAGE_CACHE_DIR=off, or no home)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "none", "0") else Path(chosen)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "gpu-triage"
    home = os.environ.get("HOME")
    return Path(home) / ".cache" / "gpu-triage" if home and Path(home).is_absolute() else None


class FileStore:
    """diagnosis/knowledge/cache.py's BlobStore, one file per key in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        return self.directory / f"{key}.bin"

    def get(self, key: str) -> bytes | None:
        try:
            # Non-blocking and not through a link: a FIFO or a device planted under the key's name must not
            # hold start-up in open(); _trusted then refuses anything but the owner's plain file.
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                if not _trusted(os.fstat(f.fileno())):
                    return None
                data = f.read(MAX_BYTES + len(_MAGIC) + 33)
        except OSError:
            return None
        head, digest, payload = data[: len(_MAGIC)], data[len(_MAGIC) : len(_MAGIC) + 32], data[len(_MAGIC) + 32 :]
        if head != _MAGIC or len(payload) > MAX_BYTES or hashlib.sha256(payload).digest() != digest:
            return None
        return payload

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        kind = key.rsplit("-", 1)[0]
        import tempfile  # only the run that fills the cache needs it

        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + hashlib.sha256(data).digest() + data)
                Path(tmp).replace(path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            for old in self.directory.glob(f"{kind}-*.bin"):  # other versions of the same thing
                if old != path and _KEY.fullmatch(old.stem) and old.stem.rsplit("-", 1)[0] == kind:
                    old.unlink(missing_ok=True)
        except OSError:
            pass  # no cache: the next start rebuilds, nothing else is lost


def _trusted(st: os.stat_result) -> bool:
    """A plain file of this user that nobody else can write."""
    owner_ok = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    return stat.S_ISREG(st.st_mode) and owner_ok and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def store_from_env() -> FileStore | None:
    """The store the environment names, or None."""
    directory = default_dir()
    return FileStore(directory) if directory is not None else None
