"""Find the few interesting lines in a byte stream without looking at every line.

A multi-gigabyte training log is almost all healthy INFO output. Splitting it into lines and running
regexes on each would cost microseconds per line; instead each block of input is searched whole by a
*finder* (diagnosis/training/scan/block_scan.py: Hyperscan with every signature, or literal search), the lines
holding a hit are cut out, and only those are decoded and classified. Line numbers come from counting
newlines between hits (one `bytes.count` pass), so every line still gets its true number.

The literal finder (`trigger_lines`, `literal_finder`) is in diagnosis/core/literal_search.py.

Memory stays flat whatever the input: the scanner holds at most one block plus the unfinished last
line of the previous one. A line longer than `max_line` is not kept. Like a binary line (a NUL byte in
it; NULs only in front of it are the padding a power loss leaves in a file, dropped), it is counted
as skipped when it would have been a candidate, and only then, wherever the input happened to be cut.
"Would have been a candidate" is the `skip_test` finder's call (by default the finder itself): the
literal search, for diagnosis, whichever finder picks the candidates, so that the count does not depend
on the engine (Hyperscan flags a long line only when a whole signature matches, the literal search when
a literal does).

Colour codes (ANSI escapes) can be removed from every complete line before the finder sees it
(`strip_ansi`), so that a signature matches a coloured line as it matches the plain one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpu_triage.diagnosis.core.literal_search import Finder, literal_finder

# Bytes searched per step; small blocks from a socket are gathered first. A reader's chunk of this
# size is searched as it is, without a copy into a bigger block.
DEFAULT_BLOCK = 1 << 20
DEFAULT_MAX_LINE = 64 << 10
# CSI sequences (colours, cursor moves) and the two-byte escapes; bounded so a lone ESC is cheap. The one
# spelling: log_lines.clean compiles the same pattern for text.
ANSI = re.compile(rb"\x1b\[[0-9;?]{0,32}[ -/]{0,4}[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(data: bytes) -> bytes:
    return ANSI.sub(b"", data) if b"\x1b" in data else data


def _unpadded(line: bytes) -> bytes:
    """`line` without the NULs in front of it: what a file holds after a power loss (the blocks it had
    allocated, never written) and before the first line written after it. NULs inside a line make it binary."""
    return line.lstrip(b"\x00") if line[:1] == b"\x00" else line


@dataclass(frozen=True, slots=True)
class Candidate:
    line: int  # 1-based line number within the input
    data: bytes  # the line, without its newline
    hits: frozenset[int] | None = None  # which patterns the finder saw match it (None: it cannot tell)


_PIECE = 64 << 10  # bytes per newline count while a finder searches in its own thread (LineScanner._scan)


def _marks(data: bytes, start: int, end: int) -> list[int]:
    """Newlines in data[start:end] before each `_PIECE`-byte piece, and in all of it (the last entry)."""
    marks = [0]
    for at in range(start, end, _PIECE):
        marks.append(marks[-1] + data.count(b"\n", at, min(at + _PIECE, end)))
    return marks


def _hits(finder: Finder) -> dict[int, frozenset[int]] | None:
    found: dict[int, frozenset[int]] | None = getattr(finder, "hits", None)
    return found


class LineScanner:
    """Feed byte chunks of one input; get back the candidate lines (those `finder` flags) in order.

    `finder` is a `Finder` or a list of trigger literals. `skip_test` decides whether a line too long
    or binary to hand out was worth one, and so counts as skipped (by default `finder`). `carry` is how
    many bytes of an over-long line's end are kept to see a hit cut in two by a chunk boundary (the
    longest trigger for literals).
    """

    def __init__(
        self,
        finder: Finder | Sequence[bytes],
        *,
        block: int = DEFAULT_BLOCK,
        max_line: int = DEFAULT_MAX_LINE,
        keep_binary: bool = False,
        strip_ansi: bool = False,
        carry: int | None = None,
        skip_test: Finder | None = None,
    ) -> None:
        if callable(finder):
            self._find: Finder = finder
            self._carry = carry if carry is not None else 4096
        else:
            self._find = literal_finder(finder)
            self._carry = carry if carry is not None else max(len(t) for t in finder)
        self._skip_test = skip_test if skip_test is not None else self._find
        self._block = block
        self._max_line = max_line
        self._keep_binary = keep_binary  # the caller wants lines with NUL bytes too (and counts them itself)
        self._strip_ansi = strip_ansi
        self._parts: list[bytes] = []
        self._parts_len = 0
        self._pending = b""  # the unfinished last line
        self._overlong = False  # the unfinished line already exceeded max_line and was dropped
        self._overlong_hit = False  # ... and what was dropped of it held a hit
        self._overlong_tail = b""  # its last bytes, for a hit cut in two by a chunk boundary
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
            line = self._clean(self._pending)
            self.lines += 1
            if not self._readable(line):
                self.skipped += self._has_hit(self._skip_test, line)
            elif self._has_hit(self._find, line):
                found = _hits(self._find)
                kept = line if self._keep_binary else _unpadded(line)
                yield Candidate(self.lines, kept, found.get(0) if found is not None else None)
        self._pending = b""

    def _clean(self, data: bytes) -> bytes:
        return strip_ansi(data) if self._strip_ansi else data

    @staticmethod
    def _has_hit(finder: Finder, line: bytes) -> bool:
        return bool(finder(line + b"\n", 0, len(line) + 1))

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
                line = self._clean(self._pending + data[:nl])
                yield from self._scan(line + b"\n", 0, len(line) + 1)
            self._pending = b""
            start = nl + 1
        last = data.rfind(b"\n", start)
        if last < 0:
            self._extend_pending(data[start:])
            return
        tail = data[last + 1 :]
        if self._strip_ansi and b"\x1b" in data:
            data = strip_ansi(data[start : last + 1])
            start, last = 0, len(data) - 1
        # Search in windows so that the per-window candidate table stays small on huge blocks.
        pos = start
        while pos <= last:
            end = data.rfind(b"\n", pos, min(last + 1, pos + self._block)) + 1
            if end <= pos:  # one line longer than a whole window: certainly over max_line
                end = data.find(b"\n", pos) + 1
            yield from self._scan(data, pos, end)
            pos = end
        self._extend_pending(tail)

    def _extend_pending(self, tail: bytes) -> None:
        if self._overlong:
            seen = self._overlong_tail + tail
        elif len(self._pending) + len(tail) > self._max_line:
            seen = self._pending + tail
            self._pending, self._overlong, self._overlong_hit = b"", True, False
        else:
            self._pending += tail
            return
        self._overlong_hit = self._overlong_hit or self._has_hit(self._skip_test, self._clean(seen))
        self._overlong_tail = seen[max(0, len(seen) - self._carry + 1) :]

    def _end_overlong(self) -> None:
        """The dropped line ended: count it as `_scan` counts a long line that lay within one block."""
        self.lines += 1
        if self._overlong_hit:
            self.skipped += 1
        self._overlong, self._overlong_hit, self._overlong_tail = False, False, b""

    def _scan(self, data: bytes, start: int, end: int) -> Iterator[Candidate]:
        """Candidates among the complete lines data[start:end] (end is just after a newline).

        Line numbers need every newline counted, which costs about what the search does. A finder that
        searches without Python's lock (Hyperscan's, `submit`) searches the block in its own thread while
        this one counts, in pieces (`marks`: newlines before each), from which each candidate's number is
        a short count away."""
        submit = getattr(self._find, "submit", None)
        if submit is None:
            spans, hits, marks = self._find(data, start, end), _hits(self._find), None
        else:
            result = submit(data, start, end)
            marks = _marks(data, start, end)
            spans, hits = result()
        own_test = self._skip_test is self._find
        if not own_test:  # the finder may pass over an unreadable line the skip test would flag
            self.skipped += sum(
                self._has_hit(self._skip_test, data[a:b]) for a, b in self._unreadable(data, start, end)
            )
        if marks is not None:
            for line_start in sorted(spans):
                line = data[line_start : spans[line_start]]
                piece = (line_start - start) // _PIECE
                number = self.lines + marks[piece] + data.count(b"\n", start + piece * _PIECE, line_start) + 1
                if self._readable(line):
                    yield Candidate(number, line, hits.get(line_start) if hits is not None else None)
                elif own_test:
                    self.skipped += 1
            self.lines += marks[-1]
            return
        number, counted_to = self.lines, start
        for line_start in sorted(spans):
            line_end = spans[line_start]
            number += data.count(b"\n", counted_to, line_start) + 1
            counted_to = line_end + 1
            line = data[line_start:line_end]
            if self._readable(line):
                kept = line if self._keep_binary else _unpadded(line)
                yield Candidate(number, kept, hits.get(line_start) if hits is not None else None)
            elif own_test:
                self.skipped += 1
        self.lines = number + data.count(b"\n", counted_to, end)

    def _readable(self, line: bytes) -> bool:
        return len(line) <= self._max_line and (self._keep_binary or b"\x00" not in _unpadded(line))

    def _unreadable(self, data: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The lines of data[start:end] over `max_line` or binary, as (start, end without newline).

        Hops rather than walks: a window of `max_line` bytes holding a newline ends no long line before
        it, and a NUL byte is looked for with one search, so a block of short text costs a few calls."""
        pos = start
        while pos < end:
            nl = data.rfind(b"\n", pos, min(end, pos + self._max_line + 1))
            if nl >= 0:
                pos = nl + 1
                continue
            nl = data.find(b"\n", pos, end)
            yield pos, nl
            pos = nl + 1
        if self._keep_binary:
            return
        nul = data.find(b"\x00", start, end)
        while nul >= 0:
            line_start = data.rfind(b"\n", start, nul) + 1 or start
            line_end = data.find(b"\n", nul, end)
            # A long one was told above; one that only starts with NULs is padding before a line, read.
            if line_end - line_start <= self._max_line and not self._readable(data[line_start:line_end]):
                yield line_start, line_end
            nul = data.find(b"\x00", line_end, end)
