"""Find the few interesting lines in a byte stream without looking at every line.

A multi-gigabyte training log is almost all healthy INFO output. Splitting it into lines and running
regexes on each would cost microseconds per line; instead each block of input is searched for the
prefilter's trigger literals, the lines holding a hit are cut out, and only those are decoded and
classified. Line numbers come from counting newlines between hits (one `bytes.count` pass), so every
line still gets its true number.

Searching: `bytes.find` for a one-byte needle is memchr and runs several times faster than for a
longer one. So for each trigger the scanner picks the byte of the trigger that is rarest in a sample
of the block; where that byte is rare enough, it hops from one occurrence of it to the next and
compares the whole trigger there (one hop serves every trigger probed by the same byte), and
otherwise it runs a plain `bytes.find` for the trigger. A budget of wasted hops per block falls back
to the plain search when the sample lied. Both were measured against one compiled alternation over
the block (bench/bench_training_log.py), which is the slowest of the three.

Memory stays flat whatever the input: the scanner holds at most one block plus the unfinished last
line of the previous one. A line longer than `max_line` is not kept. Like a binary line, it is counted
as skipped when it would have been a candidate (it holds a trigger, or a follow trigger owed it), and
only then, wherever the input happened to be cut.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

DEFAULT_BLOCK = 4 << 20  # bytes searched per step; small blocks from a socket are gathered first
DEFAULT_MAX_LINE = 64 << 10
_SAMPLE = 16 << 10  # bytes of a block whose byte counts choose the probes
# Bytes per probe hit at which hopping and a plain find cost the same: a hop that finds nothing costs
# a Python loop turn, about what `bytes.find` of a short needle spends on a few hundred bytes.
_BREAK_EVEN = 400


def _line_span(data: bytes, start: int, end: int, hit: int) -> tuple[int, int]:
    line_start = data.rfind(b"\n", start, hit) + 1 or start
    return line_start, data.find(b"\n", hit, end)


def _plain(data: bytes, start: int, end: int, needle: bytes, spans: dict[int, int]) -> None:
    hit = data.find(needle, start, end)
    while hit >= 0:
        line_start, line_end = _line_span(data, start, end, hit)
        spans[line_start] = line_end
        hit = data.find(needle, line_end + 1, end)


def _probed(
    data: bytes, start: int, end: int, probe: int, needles: list[tuple[bytes, int]], spans: dict[int, int]
) -> None:
    """Hop between occurrences of byte `probe`; each needle holds it at the given offset."""
    byte = bytes((probe,))
    budget = (end - start) // _BREAK_EVEN + 16
    hit = data.find(byte, start, end)
    while hit >= 0:
        for needle, offset in needles:
            at = hit - offset
            if at >= start and data.startswith(needle, at, end):
                line_start, line_end = _line_span(data, start, end, at)
                spans[line_start] = line_end
                hit = line_end  # the line is taken; the rest of it needs no look
                break
        else:
            budget -= 1
            if budget < 0:
                # More hops than planned: finish this block with plain searches from this line on.
                resume = data.rfind(b"\n", start, hit) + 1 or start
                for needle, _ in needles:
                    _plain(data, resume, end, needle, spans)
                return
        hit = data.find(byte, hit + 1, end)


def trigger_lines(data: bytes, start: int, end: int, triggers: Sequence[bytes]) -> dict[int, int]:
    """Lines of data[start:end] holding a trigger, as {line start: offset of its newline}.

    `end` must be just after a newline.
    """
    spans: dict[int, int] = {}
    sample_end = min(end, start + _SAMPLE)
    sample = sample_end - start
    counts: dict[int, int] = {}
    groups: dict[int, list[tuple[bytes, int]]] = {}
    for needle in triggers:
        for b in set(needle):
            if b not in counts:
                counts[b] = data.count(bytes((b,)), start, sample_end)
        probe = min(needle, key=counts.__getitem__)
        if counts[probe] * _BREAK_EVEN <= sample:
            groups.setdefault(probe, []).append((needle, needle.index(probe)))
        else:
            _plain(data, start, end, needle, spans)
    for probe, needles in groups.items():
        _probed(data, start, end, probe, needles, spans)
    return spans


@dataclass(frozen=True, slots=True)
class Candidate:
    line: int  # 1-based line number within the input
    data: bytes  # the line, without its newline


class LineScanner:
    """Feed byte chunks of one input; get back the candidate lines in order.

    `follow` maps a trigger (found on a candidate line) to the number of lines after it that are
    candidates too, whatever they contain.
    """

    def __init__(
        self,
        triggers: Sequence[bytes],
        follow: Sequence[tuple[bytes, int]] = (),
        *,
        block: int = DEFAULT_BLOCK,
        max_line: int = DEFAULT_MAX_LINE,
        keep_binary: bool = False,
    ) -> None:
        if not triggers or any(not t or b"\n" in t for t in triggers):
            raise ValueError("triggers must be non-empty literals without newlines")
        self._triggers = tuple(triggers)
        self._longest = max(len(t) for t in self._triggers)
        self._follow = tuple(follow)
        self._block = block
        self._max_line = max_line
        self._keep_binary = keep_binary  # the caller wants lines with NUL bytes too (and counts them itself)
        self._parts: list[bytes] = []
        self._parts_len = 0
        self._pending = b""  # the unfinished last line
        self._overlong = False  # the unfinished line already exceeded max_line and was dropped
        self._overlong_hit = False  # ... and what was dropped of it held a trigger
        self._overlong_tail = b""  # its last bytes, for a trigger cut in two by a chunk boundary
        self._forced = 0  # lines still to be taken because of a follow trigger
        self.lines = 0  # complete lines seen so far (a final unterminated line counts at finish)
        self.skipped = 0  # lines not examined: over max_line or binary

    def feed(self, chunk: bytes) -> Iterator[Candidate]:
        if not chunk:
            return
        self._parts.append(chunk)
        self._parts_len += len(chunk)
        if self._parts_len >= self._block:
            yield from self._drain()

    def finish(self) -> Iterator[Candidate]:
        """Flush the buffered input; an unterminated last line (a cut log) is still a line."""
        yield from self._drain()
        if self._overlong:
            self._end_overlong()
        elif self._pending:
            line = self._pending
            self.lines += 1
            if (self._forced > 0 or self._has_trigger(line)) and self._examinable(line):
                yield Candidate(self.lines, line)
        self._pending, self._forced = b"", 0

    def _has_trigger(self, line: bytes) -> bool:
        return any(t in line for t in self._triggers)

    def _drain(self) -> Iterator[Candidate]:
        if not self._parts:
            return
        data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts, self._parts_len = [], 0
        start = 0
        if self._pending or self._overlong:
            nl = data.find(b"\n")
            if nl < 0:
                self._extend_pending(data)
                return
            # The line that straddles the previous block: finish it on its own.
            if self._overlong:
                self._extend_pending(data[:nl])
                self._end_overlong()
            else:
                line = self._pending + data[:nl]
                yield from self._scan(line + b"\n", 0, len(line) + 1)
            self._pending = b""
            start = nl + 1
        last = data.rfind(b"\n", start)
        if last < 0:
            self._extend_pending(data[start:])
            return
        # Search in windows so that the per-window candidate table stays small on huge blocks.
        pos = start
        while pos <= last:
            end = data.rfind(b"\n", pos, min(last + 1, pos + self._block)) + 1
            if end <= pos:  # one line longer than a whole window: certainly over max_line
                end = data.find(b"\n", pos) + 1
            yield from self._scan(data, pos, end)
            pos = end
        self._extend_pending(data[last + 1 :])

    def _extend_pending(self, tail: bytes) -> None:
        if self._overlong:
            seen = self._overlong_tail + tail
        elif len(self._pending) + len(tail) > self._max_line:
            seen = self._pending + tail
            self._pending, self._overlong, self._overlong_hit = b"", True, False
        else:
            self._pending += tail
            return
        self._overlong_hit = self._overlong_hit or self._has_trigger(seen)
        self._overlong_tail = seen[max(0, len(seen) - self._longest + 1) :]

    def _end_overlong(self) -> None:
        """The dropped line ended: count it as `_scan` counts a long line that lay within one block."""
        self.lines += 1
        if self._overlong_hit or self._forced > 0:
            self.skipped += 1
        self._forced = max(0, self._forced - 1)
        self._overlong, self._overlong_hit, self._overlong_tail = False, False, b""

    def _scan(self, data: bytes, start: int, end: int) -> Iterator[Candidate]:
        """Candidates among the complete lines data[start:end] (end is just after a newline)."""
        spans = trigger_lines(data, start, end, self._triggers)
        find = data.find
        pos = start
        while self._forced and pos < end:  # lines owed to a follow trigger in the previous block
            spans.setdefault(pos, find(b"\n", pos, end))
            pos = spans[pos] + 1
            self._forced -= 1
        starts = sorted(spans)
        number, counted_to, i = self.lines, start, 0
        while i < len(starts):
            line_start = starts[i]
            line_end = spans[line_start]
            number += data.count(b"\n", counted_to, line_start) + 1
            counted_to = line_end + 1
            line = data[line_start:line_end]
            i += 1
            if not self._examinable(line):
                continue
            yield Candidate(number, line)
            for trigger, count in self._follow:
                if trigger in line:
                    self._take_following(data, (line_end + 1, end), count, spans, starts)
                    break
        self.lines = number + data.count(b"\n", counted_to, end)

    def _take_following(
        self, data: bytes, window: tuple[int, int], count: int, spans: dict[int, int], starts: list[int]
    ) -> None:
        pos, end = window
        for taken in range(count):
            if pos >= end:
                self._forced = max(self._forced, count - taken)
                return
            line_end = data.find(b"\n", pos, end)
            if pos not in spans:
                spans[pos] = line_end
                bisect.insort(starts, pos)
            pos = line_end + 1

    def _examinable(self, line: bytes) -> bool:
        if len(line) > self._max_line or (not self._keep_binary and b"\x00" in line):
            self.skipped += 1
            return False
        return True
