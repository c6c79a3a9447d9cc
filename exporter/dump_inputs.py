"""A job's collected files as `diagnose` inputs: a folder, a tar or zip of one, a multipart upload.

The Slurm epilog and the Kubernetes collector gather a failed job's logs, Flight Recorder dumps and
RAS output into one folder; `gpu-triage diagnose DIR` reads every file in it (sorted, so the report
does not depend on the order the file system lists them) and POST /api/v1/diagnose takes the same
folder as a tar or zip, or as multipart/form-data with one part per file. What each file is, is told
by its content (diagnosis/training/hang/report.py), never by its name. Every count and size is bounded: an
archive's members are read within the body's own limit, so a zip bomb stays small.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from gpu_triage.exporter.log_input import decoded

__all__ = [
    "MAX_FILES",
    "ArchiveError",
    "archive_members",
    "body_inputs",
    "folder_files",
    "is_archive",
    "multipart_parts",
]

MAX_FILES = 20_000  # files read from one folder or archive


class ArchiveError(ValueError):
    """An archive or upload that cannot be read; the message is for the user."""


def folder_files(root: Path) -> list[Path]:
    """The regular files under `root`, sorted, hidden ones (.nfs*, editor swap files) left out."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not name.startswith(".") and path.is_file():
                found.append(path)
                if len(found) > MAX_FILES:
                    raise ArchiveError(f"{root}: more than {MAX_FILES} files; point at the job's own folder")
    return found


def is_archive(head: bytes) -> str | None:
    """ "zip" or "tar" when `head` (the first 512 bytes or more, gunzipped) starts one."""
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def archive_members(data: bytes, kind: str, limit: int) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular member, in the archive's order; together at most `limit` bytes."""
    import tarfile  # here, not above: a plain log does without them (start-up of `gpu-triage diagnose`)
    import zipfile

    total = 0

    def take(f: IO[bytes]) -> bytes:
        nonlocal total
        parts = []
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > limit:
                raise ArchiveError(f"the archive unpacks to more than {limit >> 20} MiB; send less")
            parts.append(chunk)
        return b"".join(parts)

    try:
        if kind == "zip":
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                infos = [i for i in z.infolist() if not i.is_dir()]
                if len(infos) > MAX_FILES:
                    raise ArchiveError(f"more than {MAX_FILES} files in the archive")
                for info in infos:
                    with z.open(info) as f:
                        yield info.filename, take(f)
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as t:
                count = 0
                for member in t:
                    if not member.isfile():
                        continue
                    count += 1
                    if count > MAX_FILES:
                        raise ArchiveError(f"more than {MAX_FILES} files in the archive")
                    extracted = t.extractfile(member)
                    if extracted is not None:
                        yield member.name, take(extracted)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, RuntimeError, NotImplementedError) as e:
        raise ArchiveError(f"the {kind} archive cannot be read: {e}") from None


def multipart_parts(content_type: str, body: bytes) -> list[tuple[str, bytes]]:
    """(file name or field name, content) of each part of a multipart/form-data body."""
    import email.parser
    import email.policy

    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ArchiveError("a multipart/form-data body without parts (is the boundary right?)")
    parts: list[tuple[str, bytes]] = []
    for i, part in enumerate(message.iter_parts(), 1):
        if len(parts) >= MAX_FILES:
            raise ArchiveError(f"more than {MAX_FILES} parts")
        payload = part.get_payload(decode=True)
        if not isinstance(payload, bytes):
            continue
        name = part.get_filename() or part.get_param("name", header="content-disposition") or f"part-{i}"
        parts.append((str(name), payload))
    return parts


def body_inputs(chunks: list[bytes], content_type: str, limit: int) -> list[tuple[str | None, Iterable[bytes]]]:
    """The inputs an HTTP body holds: its parts, an archive's members, or itself (`limit`: bytes, unpacked)."""
    if content_type.lower().startswith("multipart/form-data"):
        return [(name, decoded([data], limit)) for name, data in multipart_parts(content_type, b"".join(chunks))]
    stream = decoded(chunks, limit)
    first = next(stream, b"")
    kind = is_archive(first[:1024])
    if kind is None:
        return [(None, _prepend(first, stream))]
    data = first + b"".join(stream)
    return [(name, decoded([member], limit)) for name, member in archive_members(data, kind, limit)]


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest
