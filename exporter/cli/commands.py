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
        from gpu_triage.exporter.log_input import decoded

        for path in self.paths:
            yield ("stdin" if path == "-" else path), decoded(self._chunks(path))

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
    """Offline diagnosis of kernel and training logs. Exit 0: nothing found (or only events the verdicts
    ignore), 1: findings, 2: cannot read or empty."""
    from gpu_triage.diagnosis.training import diagnose
    from gpu_triage.exporter.cache_store import store_from_env
    from gpu_triage.exporter.cli.report_text import render
    from gpu_triage.exporter.log_input import scan_engine, scan_in_parallel

    inputs = _Inputs(paths or ["-"], err, stdin)
    try:
        inputs.check()
        report = diagnose(inputs, engine=scan_engine(), store=store_from_env(), parallel=scan_in_parallel()).to_json()
    except _UnreadableError as e:
        err.write(f"gpu-triage: {e}\n")
        return 2
    except (zlib.error, EOFError) as e:
        err.write(f"gpu-triage: an input looks gzip-compressed but does not decompress: {e}\n")
        return 2
    finally:
        inputs.close()
    if report["summary"]["lines_read"] == 0:
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
    from gpu_triage.exporter.cli.export import ExportError, export

    try:
        export(kind, dest, force=force, out=out)
    except (ExportError, OSError) as e:
        sys.stderr.write(f"gpu-triage export: {e}\n")
        return 1
    return 0


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
