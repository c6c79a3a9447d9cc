"""The one-shot commands: `gpu-triage xid` (explain a code), `diagnose` (logs), `alerts`, `export`."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from gpu_triage.diagnosis.actions import Action
from gpu_triage.exporter.xid_explain import unknown_xid, xid_json


def explain_xid(code: int, as_json: bool, out: TextIO = sys.stdout) -> int:
    entry = xid_json(code)
    if entry is None:
        print(f"gpu-triage: {unknown_xid(code)}", file=sys.stderr)
        return 1
    if as_json:
        json.dump(entry, out, indent=2)
        out.write("\n")
        return 0
    wrap = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="    ")
    lines = [
        f"Xid {entry['xid']}  {entry['mnemonic']}",
        *wrap.wrap(entry["title"]),
        f"  severity: {entry['severity']}    action: {entry['action']}",
        *wrap.wrap(entry["action_description"]),
        "  likely causes:",
        *(wrap.fill(f"- {cause}") for cause in entry["causes"]),
        f"  NVIDIA's buckets: immediate {entry['nvidia_immediate_bucket'] or '-'}, "
        f"investigatory {entry['nvidia_investigatory_bucket'] or '-'}",
    ]
    if entry["deviation"]:
        lines += wrap.wrap(f"why we differ: {entry['deviation']}")
    if entry["context"]:
        lines.append(f"  the verdict also weighs: {', '.join(entry['context'])}")
    lines.append(f"  playbook: {entry['runbook']}  (curl -s localhost:9481{entry['runbook']}.md)")
    out.write("\n".join(lines) + "\n")
    return 0


class _Progress:
    """A one-line progress bar on stderr for big inputs, redrawn at most four times a second."""

    def __init__(self, name: str, size: int, err: TextIO) -> None:
        self.name, self.size, self.err = name, size, err
        self._last = 0.0

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last < 0.25 and done < self.size:
            return
        self._last = now
        width = 30
        filled = int(width * done / self.size) if self.size else width
        self.err.write(
            f"\r{self.name}: [{'#' * filled}{'.' * (width - filled)}] {done * 100 // max(self.size, 1):3d}% "
            f"of {self.size / 2**20:.0f} MiB"
        )
        if done >= self.size:
            self.err.write("\n")
        self.err.flush()


PROGRESS_MIN_BYTES = 64 << 20
ARCHIVE_MAX_BYTES = 1 << 30  # a tar or zip of a dump folder is unpacked in memory


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _bounded(chunks: Iterator[bytes], limit: int, path: str) -> Iterator[bytes]:
    for chunk in chunks:
        limit -= len(chunk)
        if limit < 0:
            raise _UnreadableError(
                f"{path}: an archive over {ARCHIVE_MAX_BYTES >> 20} MiB; unpack it and name the folder"
            )
        yield chunk


class _UnreadableError(Exception):
    """An input that cannot be opened; the message is for the user."""


class _Inputs:
    """The inputs as `diagnose` reads them: each file is opened when the diagnosis reaches it and closed
    after its last chunk, so a job's thousand per-rank files never hold a thousand descriptors at once
    (the default soft limit is 1024)."""

    def __init__(self, paths: list[str], err: TextIO, stdin: BinaryIO | None) -> None:
        self.paths, self.err, self.stdin = paths, err, stdin
        self.open: BinaryIO | None = None  # the file being read, closed by `close` if the diagnosis stops early

    def check(self) -> None:
        """Fail before the work, not after it, on a path that is not there: stat holds no descriptor."""
        for path in self.paths:
            if path != "-":
                try:
                    Path(path).stat()
                except OSError as e:
                    raise _UnreadableError(f"cannot read {path}: {e.strerror or e}") from None

    def __iter__(self) -> Iterator[tuple[str, Iterator[bytes]]]:
        from gpu_triage.exporter.dump_inputs import ArchiveError, folder_files
        from gpu_triage.exporter.log_input import decoded

        for path in self.paths:
            if path != "-" and Path(path).is_dir():  # a job's collected folder: logs, dumps, RAS output
                try:
                    files = folder_files(Path(path))
                except (ArchiveError, OSError) as e:
                    raise _UnreadableError(str(e)) from None
                for f in files:
                    yield from self._file(str(f), decoded)
            else:
                yield from self._file(path, decoded)

    def _file(self, path: str, decoded: Any) -> Iterator[tuple[str, Iterator[bytes]]]:
        """One input, or each member of a tar or zip archive of a dump folder."""
        from gpu_triage.exporter.dump_inputs import ArchiveError, archive_members, is_archive

        chunks = decoded(self._chunks(path))
        first = next(chunks, b"")
        kind = is_archive(first[:1024])
        if kind is None:
            yield ("stdin" if path == "-" else path), _prepend(first, chunks)
            return
        data = first + b"".join(_bounded(chunks, ARCHIVE_MAX_BYTES - len(first), path))
        try:
            for name, member in archive_members(data, kind, ARCHIVE_MAX_BYTES):
                yield f"{path}:{name}", decoded(iter([member]))
        except ArchiveError as e:
            raise _UnreadableError(f"{path}: {e}") from None

    def _chunks(self, path: str) -> Iterator[bytes]:
        from gpu_triage.exporter.log_input import read_chunks

        if path == "-":
            f = self.stdin or sys.stdin.buffer
            if f.isatty():
                self.err.write("gpu-triage: reading the log from stdin (end it with Ctrl-D), or name log files\n")
            yield from read_chunks(f)
            return
        self.close()  # the previous input's, should its reader have stopped before its end
        try:
            f = self.open = Path(path).open("rb")  # noqa: SIM115 - closed below, after the last chunk
        except OSError as e:
            raise _UnreadableError(f"cannot read {path}: {e.strerror or e}") from None
        try:
            progress = None
            if self.err.isatty() and (size := os.fstat(f.fileno()).st_size) >= PROGRESS_MIN_BYTES:
                progress = _Progress(path, size, self.err)
            yield from read_chunks(f, progress)
        finally:
            self.close()

    def close(self) -> None:
        if self.open is not None:
            self.open.close()
            self.open = None


def diagnose_files(
    paths: list[str], as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr, stdin: BinaryIO | None = None
) -> int:
    """Offline diagnosis of kernel and training logs, Flight Recorder dumps and NCCL RAS output (files,
    folders of them, tar or zip archives). Exit 0: nothing found (or only events the verdicts ignore),
    1: findings, 2: cannot read or empty."""
    from gpu_triage.diagnosis.training import diagnose
    from gpu_triage.exporter.cache_store import store_from_env
    from gpu_triage.exporter.cli.report_text import render
    from gpu_triage.exporter.fr_decode import SandboxDecoder
    from gpu_triage.exporter.log_input import scan_engine, scan_in_parallel

    inputs = _Inputs(paths or ["-"], err, stdin)
    try:
        inputs.check()
        with SandboxDecoder() as decode:
            store, parallel = store_from_env(), scan_in_parallel()
            report = diagnose(inputs, engine=scan_engine(), store=store, parallel=parallel, decode=decode).to_json()
    except _UnreadableError as e:
        err.write(f"gpu-triage: {e}\n")
        return 2
    except (zlib.error, EOFError) as e:
        err.write(f"gpu-triage: an input looks gzip-compressed but does not decompress: {e}\n")
        return 2
    finally:
        inputs.close()
    hang = report.get("hang") or {}
    for skipped in hang.get("skipped", []):
        err.write(f"gpu-triage: skipped {skipped}\n")
    if report["summary"]["lines_read"] == 0 and not hang.get("dumps") and not hang.get("ras"):
        # An empty input is a pipeline that failed upstream (`kubectl logs … |`), never a healthy job.
        err.write("gpu-triage: no log lines read\n")
        return 2
    if as_json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        out.write(render(report, colour=out.isatty() and not os.environ.get("NO_COLOR")))
    return 1 if problems(report) else 0


def problems(report: dict[str, Any]) -> bool:
    """Whether the report calls for anything: an event whose verdict is IGNORE (a lone Xid 43, a user
    program's own fault the driver recovered from) is listed, but a job with only those is healthy."""
    return any(f["action"] != Action.IGNORE for f in report["findings"])


def render_alerts(
    path: str | None, runbook_base: str | None, dashboard_base: str | None, out: TextIO = sys.stdout
) -> int:
    """`gpu-triage alerts render`: the rules (the shipped ones unless `path` names others), links pointed elsewhere."""
    import yaml

    from gpu_triage.exporter.cli.alert_rules import render
    from gpu_triage.exporter.cli.export import shipped

    try:
        if path is None:
            text = shipped("alerts", "gpu-triage.rules.yml").decode()
        else:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        out.write(render(text, runbook_base, dashboard_base=dashboard_base))
    except (OSError, ValueError, yaml.YAMLError) as e:
        sys.stderr.write(f"gpu-triage alerts render: {_one_line(e)}\n")
        return 2
    return 0


def export_files(kind: str, dest: Path, force: bool, out: TextIO = sys.stdout) -> int:
    """`gpu-triage export KIND DIR`."""
    from gpu_triage.exporter.cli.export import ExportError, export, running_command

    try:
        export(kind, dest, force=force, command=running_command(), out=out, err=sys.stderr)
    except (ExportError, OSError) as e:
        sys.stderr.write(f"gpu-triage export: {e}\n")
        return 1
    return 0


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
