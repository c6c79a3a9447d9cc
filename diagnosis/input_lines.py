"""One input's candidate lines, whether it came as written or hard-wrapped by a terminal or a ticket.

A log pasted from a terminal or a ticket system is often cut at a fixed width: every long message is
split into lines of exactly that width, the last piece shorter, and the pieces after the first carry
no prefix (no `[rank3]:`, no `host:pid:tid`). A message split like that matches nothing. So the start
of each input (`SAMPLE` bytes) is looked at first: when it is wrapped, its lines are joined back
before the block scan sees them, and each joined line keeps the number of its first piece, so
evidence still points at the input as the user has it.

Wrapped means: the longest line length W (40 to 400 columns) is shared by more lines than W-1 or
W-2 are (text of free length rarely stops at the same column), and most lines of length W go
on, without a prefix, on the next line (the same message from many ranks has one length too, but
the next line then starts with a prefix of its own). A line of length W is then joined with the next
one unless the next one starts a line of its own: it has a prefix (log_lines.has_prefix) or is
indented like a traceback or a table. An input that is not wrapped goes through
line_scan.LineScanner unchanged; a wrapped one is read a line at a time, which is slower, and fine
for the size of what gets pasted.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator

from gpu_triage.diagnosis.line_scan import ANSI, DEFAULT_MAX_LINE, Candidate, Finder, LineScanner
from gpu_triage.diagnosis.log_lines import has_prefix

SAMPLE = 1 << 20  # bytes of an input looked at to decide whether it is wrapped
_BATCH = 1 << 20  # bytes of joined lines handed to the finder at once
MIN_WIDTH, MAX_WIDTH = 40, 400


def _width(line: bytes) -> int:
    return len(line) if line.isascii() else len(line.decode("utf-8", "replace"))


def _clean(line: bytes) -> bytes:
    line = line.rstrip(b"\r")
    return ANSI.sub(b"", line) if b"\x1b" in line else line


def wrap_width(sample: bytes) -> int | None:
    """The width the text in `sample` (whole lines) was hard-wrapped at, or None."""
    lines = [_clean(raw) for raw in sample.split(b"\n")]
    widths = [_width(line) for line in lines]
    lengths = Counter(w for w in widths if w)
    if not lengths:
        return None
    width = max(lengths)
    if not MIN_WIDTH <= width <= MAX_WIDTH or lengths[width] <= max(lengths[width - 1], lengths[width - 2]):
        return None
    # The same message from many ranks has one length too; but only a wrapped line goes on, unprefixed,
    # on the next line.
    full = [i for i, w in enumerate(widths[:-1]) if w == width]
    cut = {lines[i] for i in full if _continues(lines[i], lines[i + 1], width)}
    return width if len(cut) >= 2 and 2 * len(cut) >= len({lines[i] for i in full}) else None


class InputLines:
    """Feed one input's chunks to `read`; get its candidate lines. `lines` and `skipped` count it."""

    def __init__(self, finder: Finder, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        self._finder = finder
        self._max_line = max_line
        self.lines = 0
        self.skipped = 0
        self.width: int | None = None  # the wrap width found, when the input is wrapped

    def read(self, chunks: Iterable[bytes]) -> Iterator[Candidate]:
        stream = iter(chunks)
        head: list[bytes] = []
        size = 0
        for chunk in stream:
            if chunk:
                head.append(bytes(chunk))
                size += len(chunk)
                if size >= SAMPLE:
                    break
        sample = b"".join(head)
        self.width = wrap_width(sample[: sample.rfind(b"\n") + 1] if size >= SAMPLE else sample)
        if self.width is None:
            yield from self._plain(head, stream)
        else:
            yield from self._wrapped(head, stream, self.width)

    def _plain(self, head: list[bytes], rest: Iterator[bytes]) -> Iterator[Candidate]:
        scanner = LineScanner(self._finder, max_line=self._max_line, strip_ansi=True)
        for chunk in head:
            yield from scanner.feed(chunk)
        for chunk in rest:
            yield from scanner.feed(bytes(chunk))
        yield from scanner.finish()
        self.lines, self.skipped = scanner.lines, scanner.skipped

    def _physical(self, head: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
        pending = b""
        for chunk in _chain(head, rest):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if len(pending) > self._max_line:  # an endless line: keep enough of it to skip it later
                pending = pending[: self._max_line + 1]
            yield from lines
        if pending:
            yield pending

    def _wrapped(self, head: list[bytes], rest: Iterator[bytes], width: int) -> Iterator[Candidate]:
        batch: list[tuple[int, bytes]] = []
        size = 0
        pieces: list[bytes] = []  # the logical line being joined
        first = 0
        for raw in self._physical(head, rest):
            self.lines += 1
            line = _clean(raw)
            if pieces and _continues(pieces[-1], line, width):
                pieces.append(line)
                continue
            if pieces:
                batch.append((first, b"".join(pieces)))
                size += len(batch[-1][1])
                if size >= _BATCH:
                    yield from self._flush(batch)
                    batch, size = [], 0
            pieces, first = [line], self.lines
        if pieces:
            batch.append((first, b"".join(pieces)))
        yield from self._flush(batch)

    def _flush(self, batch: list[tuple[int, bytes]]) -> Iterator[Candidate]:
        if not batch:
            return
        starts: list[int] = []
        pos = 0
        for _, line in batch:
            starts.append(pos)
            pos += len(line) + 1
        data = b"\n".join(line for _, line in batch) + b"\n"
        for line_start in sorted(self._finder(data, 0, len(data))):
            number, line = batch[bisect.bisect_right(starts, line_start) - 1]
            if len(line) > self._max_line or b"\x00" in line:
                self.skipped += 1
                continue
            yield Candidate(number, line)


def _continues(previous: bytes, line: bytes, width: int) -> bool:
    """Whether `line` is the rest of `previous`, a piece cut at `width`."""
    if not line or _width(previous) != width or line.startswith(b"  "):
        return False
    return not has_prefix(line.decode("utf-8", "replace"))


def _chain(head: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    yield from head
    for chunk in rest:
        yield bytes(chunk)
