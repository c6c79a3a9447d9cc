"""NCCL's connect retries: a fault only when the init they belong to never completes.

NCCL retries a connect that gets no answer (`connect to 10.0.0.12<43321> returned Connection timed
out, retrying (1/34)`), at INFO; a peer that starts a little late is answered a few retries later, and
the process's communicator init completes (`… Init COMPLETE` from the same host:pid). Only retries
that no completed init of their process follows are reported, as socket_connect_error; when the retries
run out NCCL prints a WARN that is one anyway.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.place.facts import short_host
from gpu_triage.diagnosis.training.place.source_state import SourceState

MAX_HELD = 64  # retry lines kept per process: evidence and a count, not every retry
MAX_PROCESSES = 4096

_Key = tuple[int, str | None, int | None]


class Retries:
    """The retry lines of each process (input, host, pid) since its last completed init."""

    def __init__(self) -> None:
        self._held: dict[_Key, list[tuple[SourceState, int, LogLine, dict[str, str]]]] = {}

    def hold(self, src: SourceState, number: int, line: LogLine, fields: dict[str, str]) -> None:
        key = (src.index, short_host(line.host), line.pid)
        held = self._held.get(key)
        if held is None:
            if len(self._held) >= MAX_PROCESSES:
                return
            held = self._held[key] = []
        if len(held) < MAX_HELD:
            held.append((src, number, line, fields))

    def completed(self, source: int, host: str, pid: int) -> None:
        """host:pid's communicator init completed: its retries so far were a slow peer."""
        self._held.pop((source, short_host(host), pid), None)

    def unanswered(self) -> Iterator[tuple[SourceState, int, LogLine, dict[str, str]]]:
        """The retries no completed init of their process followed, in input order."""
        for held in self._held.values():
            yield from held
