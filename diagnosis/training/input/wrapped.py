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
indented like a traceback or a table. The lines of a drawn table (nvidia-smi's box) share one width
too, and are neither evidence of a wrap nor joined. An input that is not wrapped goes through
line_scan.LineScanner unchanged; a wrapped one is read a line at a time, which is slower, and fine
for the size of what gets pasted, and its logical lines go through a LineScanner too, so a run of
pieces that never ends (a pasted base64 blob) is held no further than any line: up to max_line.

A wrap of a single line is never joined: the width needs two cut lines to be seen. A short paste with
one cut message is read as it is.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator

from gpu_triage.diagnosis.core.line_scan import DEFAULT_MAX_LINE, Candidate, LineScanner, strip_ansi
from gpu_triage.diagnosis.core.literal_search import Finder
from gpu_triage.diagnosis.training.input.log_lines import has_prefix

SAMPLE = 1 << 20  # bytes at the start of an input looked at to decide whether it is wrapped
MIN_WIDTH, MAX_WIDTH = 40, 400
_BOX = b"|+=-"  # what the lines of a drawn table (nvidia-smi, dcgmi, tabulate) start and end with
# UCX pads its level to a column (`UCX  ERROR`, `UCX  WARN `): a cut there leaves two blanks to start a piece.
_LEVEL_GAP = re.compile(rb"UCX  (?:ERROR|WARN|FATAL|INFO|DIAG|DEBUG)")


def _width(line: bytes) -> int:
    return len(line) if line.isascii() else len(line.decode("utf-8", "replace"))


def _clean(line: bytes) -> bytes:
    return strip_ansi(line.rstrip(b"\r"))


def _boxed(line: bytes) -> bool:
    """A line of a drawn table: all its lines share one width, and none of them is cut text."""
    return len(line) > 1 and line[0] in _BOX and line[-1] in _BOX


def wrap_width(sample: bytes) -> int | None:
    """The width the text in `sample` (whole lines) was hard-wrapped at, or None."""
    lines = [_clean(raw) for raw in sample.split(b"\n")]
    widths = [0 if _boxed(line) else _width(line) for line in lines]
    lengths = Counter(w for w in widths if w)
    if not lengths:
        return None
    width = max(lengths)
    if not MIN_WIDTH <= width <= MAX_WIDTH or lengths[width] <= max(lengths[width - 1], lengths[width - 2]):
        return None
    # The same message from many ranks has one length too; but only a wrapped line goes on, unprefixed,
    # on the next line. And most cuts fall inside a word or a number (some at a blank): lines padded
    # with blanks to one width go on to whatever comes next just as well, but all end in a blank.
    full = [i for i, w in enumerate(widths[:-1]) if w == width]
    cut = {lines[i] for i in full if _continues(lines[i], lines[i + 1], width)}
    mid_token = sum(1 for line in cut if line[-1:].isalnum())
    if len(cut) < 2 or 2 * mid_token < len(cut):
        return None
    return width if 2 * len(cut) >= len({lines[i] for i in full}) else None


def _sample(head: list[bytes], more: bool) -> bytes:
    """The first SAMPLE bytes of the input, cut after their last newline when the input goes on, so that
    the decision is the same however the input arrives in chunks (a socket's, a file reader's)."""
    if not more:
        return b"".join(head)
    out: list[bytes] = []
    size = 0
    for chunk in head:
        out.append(chunk[: SAMPLE - size])
        size += len(out[-1])
        if size >= SAMPLE:
            break
    sample = b"".join(out)
    return sample[: sample.rfind(b"\n") + 1]


class InputLines:
    """Feed one input's chunks to `read`; get its candidate lines. `lines` and `skipped` count it.

    `skip_test`: see line_scan.LineScanner."""

    def __init__(self, finder: Finder, *, max_line: int = DEFAULT_MAX_LINE, skip_test: Finder | None = None) -> None:
        self._finder = finder
        self._skip_test = skip_test
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
                if size > SAMPLE:  # one byte past the sample: the input goes on
                    break
        self.width = wrap_width(_sample(head, size > SAMPLE))
        scanner = LineScanner(
            self._finder, max_line=self._max_line, strip_ansi=self.width is None, skip_test=self._skip_test
        )
        if self.width is None:
            for chunk in _chain(head, stream):
                yield from scanner.feed(chunk)
            yield from scanner.finish()
            self.lines = scanner.lines
        else:
            yield from self._wrapped(scanner, _chain(head, stream), self.width)
        self.skipped = scanner.skipped

    def _physical(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        pending = b""
        for chunk in chunks:
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            if len(pending) > self._max_line:  # an endless line: keep enough of it to skip it later
                pending = pending[: self._max_line + 1]
            yield from lines
        if pending:
            yield pending

    def _wrapped(self, scanner: LineScanner, chunks: Iterator[bytes], width: int) -> Iterator[Candidate]:
        """Join the pieces of each logical line in the scanner itself: a piece goes on the line before
        unless it starts one of its own (then a newline goes first). The scanner then holds no more of
        a logical line than of a physical one (max_line), and numbers logical lines; `joins` maps its
        numbers back to the input's, those of each logical line's first piece."""
        joins: deque[tuple[int, int]] = deque()  # (logical line, pieces joined on the lines before it)
        joined = 0
        logical = 0
        previous: bytes | None = None
        for raw in self._physical(chunks):
            self.lines += 1
            line = _clean(raw)
            if previous is not None and _continues(previous, line, width):
                joined += 1
                found = scanner.feed(line)
            else:
                logical += 1
                if joined and (not joins or joins[-1][1] != joined):
                    joins.append((logical, joined))
                found = scanner.feed(line if previous is None else b"\n" + line)
            previous = line
            for cand in found:
                yield Candidate(cand.line + _joined_before(joins, cand.line), cand.data, cand.hits)
            _joined_before(joins, scanner.lines + 1)  # forget what no later candidate can need
        for cand in scanner.finish():
            yield Candidate(cand.line + _joined_before(joins, cand.line), cand.data, cand.hits)


def _joined_before(joins: deque[tuple[int, int]], logical: int) -> int:
    """Pieces joined on the lines before logical line `logical`; entries before it are dropped, since
    the scanner hands lines out in order."""
    while len(joins) > 1 and joins[1][0] <= logical:
        joins.popleft()
    return joins[0][1] if joins and joins[0][0] <= logical else 0


def _continues(previous: bytes, line: bytes, width: int) -> bool:
    """Whether `line` is the rest of `previous`, a piece cut at `width`. An indented line starts one of its
    own (a traceback's frame, a table's field), unless the cut fell inside a run of blanks: `previous`
    then ends in a blank itself, or in a word whose message goes on with two (UCX's `UCX  ERROR`)."""
    if not line or _width(previous) != width or _boxed(previous) or _boxed(line):
        return False
    if line.startswith(b"  ") and not (previous.endswith(b" ") or _LEVEL_GAP.search(previous + line[:8])):
        return False
    return not has_prefix(line.decode("utf-8", "replace"))


def _chain(head: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    yield from head
    for chunk in rest:
        yield bytes(chunk)
