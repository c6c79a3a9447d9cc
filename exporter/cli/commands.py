"""The one-shot commands: `gpu-triage xid` (explain a code), `diagnose` (logs), `alerts`, `export`."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import zlib
from pathlib import Path
from typing import BinaryIO, TextIO

import yaml

from gpu_triage.exporter.http.diagnosis import xid_json


def explain_xid(code: int, as_json: bool, out: TextIO = sys.stdout) -> int:
    from fastapi import HTTPException

    try:
        entry = xid_json(code)
    except HTTPException as e:
        print(f"gpu-triage: {e.detail}", file=sys.stderr)
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


def diagnose_files(
    paths: list[str], as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr, stdin: BinaryIO | None = None
) -> int:
    """Offline diagnosis of kernel and training logs. Exit 0: nothing found, 1: findings, 2: cannot read or empty."""
    from gpu_triage.diagnosis.training import diagnose
    from gpu_triage.exporter.cli.report_text import render
    from gpu_triage.exporter.log_input import decoded, read_chunks, scan_engine

    files: list[BinaryIO] = []
    sources = []
    try:
        for path in paths or ["-"]:
            if path == "-":
                f = stdin or sys.stdin.buffer
                name = "stdin"
                if f.isatty():
                    err.write("gpu-triage: reading the log from stdin (end it with Ctrl-D), or name log files\n")
            else:
                try:
                    f = Path(path).open("rb")  # noqa: SIM115 - closed below, after the lazy read
                except OSError as e:
                    err.write(f"gpu-triage: cannot read {path}: {e.strerror or e}\n")
                    return 2
                files.append(f)
                name = path
            progress = None
            if err.isatty() and path != "-" and (size := os.fstat(f.fileno()).st_size) >= PROGRESS_MIN_BYTES:
                progress = _Progress(name, size, err)
            sources.append((name, decoded(read_chunks(f, progress))))
        try:
            report = diagnose(sources, engine=scan_engine()).to_json()
        except (zlib.error, EOFError) as e:
            err.write(f"gpu-triage: an input looks gzip-compressed but does not decompress: {e}\n")
            return 2
    finally:
        for f in files:
            f.close()
    if report["summary"]["lines_read"] == 0:
        # An empty input is a pipeline that failed upstream (`kubectl logs … |`), never a healthy job.
        err.write("gpu-triage: no log lines read\n")
        return 2
    if as_json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        out.write(render(report, colour=out.isatty() and not os.environ.get("NO_COLOR")))
    return 1 if report["findings"] else 0


def render_alerts(
    path: str | None, runbook_base: str | None, dashboard_base: str | None, out: TextIO = sys.stdout
) -> int:
    """`gpu-triage alerts render`: the rules (the shipped ones unless `path` names others), links pointed elsewhere."""
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
