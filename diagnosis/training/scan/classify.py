"""What a candidate line says: normalised, then matched against the rules (a finding's class, a line of
context, or an error-level line no rule names), with the recent answers remembered."""

from __future__ import annotations

from gpu_triage.diagnosis.training.input.log_lines import LogLine, normalise
from gpu_triage.diagnosis.training.rules.model import JOB_FAILED, ContextKind, ContextMatch, Match, RuleSet

CACHE_ENTRIES = 4096  # recent lines and messages whose classification is remembered

Verdict = tuple[Match | None, ContextMatch | None]


class LineClassifier:
    """The rules' answer for each line of one diagnosis.

    A failing job repeats itself: the same WARN from the same process thousands of times, or the same
    message from every rank behind a different prefix. Both caches (by raw line, by message) are bounded
    and are simply emptied when full.
    """

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self.job_failed = rules.rule(JOB_FAILED)
        self._lines: dict[str, tuple[LogLine, Match | None, ContextMatch | None]] = {}
        self._verdicts: dict[str, Verdict] = {}

    def classify(
        self, text: str, line: LogLine | None = None, hits: frozenset[int] | None = None
    ) -> tuple[LogLine, Match | None, ContextMatch | None]:
        """Normalise (unless `line` is `text` normalised already) and match `text`. `hits`: the signatures
        the block scan saw match the line (it sees every one that can); only those are tried, so a line
        that holds every literal and matches nothing costs no regex."""
        known = self._lines.get(text)
        if known is not None:
            return known
        if line is None:
            line = normalise(text)
        verdict = self._verdicts.get(line.text)
        if verdict is None:
            match = self.rules.match(line.text, hits)
            verdict = (match, None if match is not None else self.rules.match_context(line.text, hits))
            if len(self._verdicts) >= CACHE_ENTRIES:
                self._verdicts.clear()
            self._verdicts[line.text] = verdict
        unnamed = verdict[0] is None and (verdict[1] is None or verdict[1].kind is ContextKind.EXCEPTION)
        if unnamed and (error := self.rules.fallback_match(line.raw, hits)) is not None:
            # An error-level line no rule names (the whole line decides: a glog level is a prefix); an
            # exception's line too (`RuntimeError: CUDA error: …`): a paste may hold no traceback with it.
            which, fields = error
            verdict = (Match(self.job_failed, fields, len(self.job_failed.signatures) + which), None)
        if len(self._lines) >= CACHE_ENTRIES:
            self._lines.clear()
        self._lines[text] = (line, *verdict)
        return line, *verdict
