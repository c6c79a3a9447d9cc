"""What one `diagnose` call learns about the whole job while its inputs stream by: who is who, which
ranks reported progress and work, the NCCL versions seen, the connect retries held. Lines of context
(diagnosis/training/context.py) and findings (diagnosis/training/record.py) both feed it; the report reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_triage.diagnosis.training.findings.collapse import Seen
from gpu_triage.diagnosis.training.findings.collectives import Progress, ProgressTracker, WorkTracker
from gpu_triage.diagnosis.training.findings.kernel import EVIDENCE_CHARS
from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.place.identity import IdentityBook
from gpu_triage.diagnosis.training.place.retries import Retries
from gpu_triage.diagnosis.training.place.source_state import SourceState

MAX_VERSIONS = 32  # distinct NCCL versions kept; a real job has one or two


def seen_at(src: SourceState, number: int, line: LogLine, kind: int = 0) -> Seen:
    """Line `number` of input `src` as a finding's evidence."""
    return Seen(src.index, number, line.raw[:EVIDENCE_CHARS], line.stamp, kind)


@dataclass(slots=True)
class Job:
    identity: IdentityBook = field(default_factory=IdentityBook)
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    works: WorkTracker = field(default_factory=WorkTracker)
    retries: Retries = field(default_factory=Retries)
    versions: dict[str, Seen] = field(default_factory=dict)

    def version(self, src: SourceState, number: int, line: LogLine, version: str) -> None:
        if len(self.versions) < MAX_VERSIONS:
            self.versions.setdefault(version, seen_at(src, number, line))

    def report_progress(self, src: SourceState, number: int, line: LogLine, fields: dict[str, str | int]) -> None:
        """A rank's last completed and enqueued NCCL work, from a progress line or a timeout's report."""
        rank = line.rank if line.rank is not None else fields.get("rank")
        if not isinstance(rank, int):
            return
        completed, enqueued = fields.get("last_completed"), fields.get("last_enqueued")
        seq = fields.get("seq")
        if not isinstance(completed, int) and isinstance(seq, int):
            # The work that timed out had not completed; the one before it had.
            completed, enqueued = seq - 1, seq
        if isinstance(completed, int):
            enq = enqueued if isinstance(enqueued, int) else completed
            seen = seen_at(src, number, line)
            self.progress.report(line.pg, rank, Progress(completed, enq, src.index, number, seen.text, line.stamp))
