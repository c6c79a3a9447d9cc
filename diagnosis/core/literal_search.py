"""The literal finder: the lines of a block holding one of a few literals, at about memchr's speed.

Searching: `bytes.find` for a one-byte needle is memchr and runs several times faster than for a
longer one. So for each trigger the scanner picks the byte of the trigger that is rarest in a sample
of the block; where that byte is rare enough, it hops from one occurrence of it to the next and
compares the whole trigger there (one hop serves every trigger probed by the same byte), and
otherwise it runs a plain `bytes.find` for the trigger. A budget of wasted hops per block falls back
to the plain search when the sample lied. Both were measured against one compiled alternation over
the block (bench/bench_training_log.py), which is the slowest of the three.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# A finder gets a buffer and a range of complete lines in it (`end` just after a newline) and answers
# the lines worth a closer look as {offset of the line's start: offset of its newline}. A finder that can
# tell which of its patterns matched each line keeps that, for its last call, in `hits` (by line start).
Finder = Callable[[bytes, int, int], dict[int, int]]

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


def literal_finder(triggers: Sequence[bytes]) -> Finder:
    if not triggers or any(not t or b"\n" in t for t in triggers):
        raise ValueError("triggers must be non-empty literals without newlines")
    needles = tuple(triggers)
    return lambda data, start, end: trigger_lines(data, start, end, needles)
