"""The chunk-level scanner: the same candidate lines, numbered right, however the input is cut."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.diagnosis.core.line_scan import Candidate, LineScanner
from gpu_triage.diagnosis.core.literal_search import literal_finder, trigger_lines

TRIGGERS = [b"ERR", b"WARN"]


def _scan(
    data: bytes, cuts: list[int], *, block: int = 64, max_line: int = 1000, strip_ansi: bool = False
) -> tuple[list[Candidate], LineScanner]:
    scanner = LineScanner(TRIGGERS, block=block, max_line=max_line, strip_ansi=strip_ansi)
    out: list[Candidate] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out += scanner.feed(data[start:cut])
        start = cut
    out += scanner.finish()
    return out, scanner


def _reference(data: bytes, max_line: int = 1000) -> tuple[list[tuple[int, bytes]], int, int]:
    """The obvious line-by-line implementation the scanner must agree with: (candidates, lines, skipped)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[tuple[int, bytes]] = []
    skipped = 0
    for number, line in enumerate(lines, start=1):
        take = any(t in line for t in TRIGGERS)
        body = line.lstrip(b"\x00")  # NULs in front are a power loss's padding; NULs inside make it binary
        if take and (len(line) > max_line or b"\x00" in body):
            skipped += 1
        elif take:
            out.append((number, body))
    return out, len(lines), skipped


def test_candidates_and_line_numbers() -> None:
    data = b"ok\nan ERR here\nok\r\nWARN and ERR\n\nlast WARN"
    got, scanner = _scan(data, [5, 6, 17])
    assert [(c.line, c.data) for c in got] == [(2, b"an ERR here"), (4, b"WARN and ERR"), (6, b"last WARN")]
    assert scanner.lines == 6


def test_colour_codes_are_taken_out_before_the_search() -> None:
    data = b"ok\n\x1b[31mE\x1b[0mRR in red\nplain\n\x1b[1mWARN\n"
    for cut in range(len(data) + 1):
        got, _ = _scan(data, [cut], block=8, strip_ansi=True)
        assert [(c.line, c.data) for c in got] == [(2, b"ERR in red"), (4, b"WARN")], cut


def test_a_finder_function_picks_the_lines() -> None:
    def digits(data: bytes, start: int, end: int) -> dict[int, int]:
        spans: dict[int, int] = {}
        pos = start
        while pos < end:
            nl = data.index(b"\n", pos, end)
            if data[pos:nl].isdigit():
                spans[pos] = nl
            pos = nl + 1
        return spans

    scanner = LineScanner(digits, block=4)
    got = [*scanner.feed(b"a\n12\nb\n3"), *scanner.finish()]
    assert [(c.line, c.data) for c in got] == [(2, b"12"), (4, b"3")]


def test_a_line_longer_than_the_limit_is_skipped_and_counted() -> None:
    data = b"ERR short\n" + b"ERR " + b"x" * 5000 + b"\nWARN after\n"
    got, scanner = _scan(data, [100, 2000, 4000], max_line=1000)
    assert [(c.line, c.data) for c in got] == [(1, b"ERR short"), (3, b"WARN after")]
    assert (scanner.lines, scanner.skipped) == (3, 1)


def test_binary_lines_are_skipped_and_counted() -> None:
    got, scanner = _scan(b"ERR \x00\x01\x02\nWARN ok\n", [])
    assert [c.line for c in got] == [2]
    assert scanner.skipped == 1


def test_nul_padding_before_a_line_is_dropped_and_the_line_read() -> None:
    # After a power loss a log file holds NULs where its last blocks were never written, then the first
    # line written after the reboot: often the very error that explains the crash.
    data = b"ok\n" + b"\x00" * 5000 + b"ERR after the crash\nWARN ok\n"
    got, scanner = _scan(data, [4096], block=1 << 20, max_line=64 << 10)
    assert [(c.line, c.data) for c in got] == [(2, b"ERR after the crash"), (3, b"WARN ok")]
    assert scanner.skipped == 0


def test_empty_input_and_empty_chunks() -> None:
    got, scanner = _scan(b"", [0, 0])
    assert got == [] and scanner.lines == 0


def test_bad_triggers_are_refused() -> None:
    with pytest.raises(ValueError, match="triggers"):
        LineScanner([])
    with pytest.raises(ValueError, match="triggers"):
        LineScanner([b"a\nb"])


_PIECES = [b"ok", b"ERR", b"WARN", b"x" * 40, b"\x00", b" ", b"\r", b"\n", b"\n", b"\n"]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), max_size=60).map(b"".join),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    st.sampled_from([1, 7, 64, 1 << 20]),
    st.sampled_from([10, 60, 1000]),
)
def test_agrees_with_the_line_by_line_reference(data: bytes, cuts: list[int], block: int, max_line: int) -> None:
    got, scanner = _scan(data, [c for c in cuts if c <= len(data)], block=block, max_line=max_line)
    expected, lines, skipped = _reference(data, max_line)
    assert [(c.line, c.data) for c in got] == expected
    assert (scanner.lines, scanner.skipped) == (lines, skipped)


@pytest.mark.parametrize("block", [1, 7, 64, 1000, 1 << 20])
def test_long_lines_are_counted_only_when_they_would_have_been_candidates(block: int) -> None:
    """However the input is cut: a long line of chatter is no skipped candidate, a long one with a
    trigger is (also when the trigger straddles a chunk boundary)."""
    lines_in = [
        b"x" * 3000,  # chatter
        b"y" * 1500 + b"WARN" + b"y" * 1500,  # a trigger in the middle
        b"z" * 2999 + b"ERR",  # a trigger at the very end
        b"ERR short",
        b"after",
        b"w" * 3000,  # chatter, cut off at the end
    ]
    data = b"\n".join(lines_in)
    expected, lines, skipped = _reference(data, 1000)
    assert skipped == 2
    for cuts in ([], [1501], [4502, 4503], list(range(0, len(data), 999)), list(range(0, len(data), 1024))):
        got, scanner = _scan(data, cuts, block=block, max_line=1000)
        assert [(c.line, c.data) for c in got] == expected, cuts
        assert (scanner.lines, scanner.skipped) == (lines, skipped), cuts


def _lines_with(data: bytes, needles: list[bytes]) -> dict[int, int]:
    spans: dict[int, int] = {}
    pos = 0
    for line in data.split(b"\n")[:-1]:
        if any(n in line for n in needles):
            spans[pos] = pos + len(line)
        pos += len(line) + 1
    return spans


@settings(max_examples=300, deadline=None)
@given(
    # Few distinct bytes, so that probe bytes are sometimes rare and sometimes everywhere.
    st.lists(st.sampled_from([b"W", b"A", b"q", b"x", b"WARN", b"xq", b" ", b"\n"]), max_size=400).map(b"".join),
    st.lists(st.sampled_from([b"WARN", b"qx", b"AW", b"xxx", b"q"]), min_size=1, max_size=4, unique=True),
)
def test_trigger_lines_agree_with_a_plain_search(data: bytes, needles: list[bytes]) -> None:
    data += b"\n"
    assert trigger_lines(data, 0, len(data), needles) == _lines_with(data, needles)


def test_trigger_lines_fall_back_when_the_probe_byte_is_everywhere_after_the_sample() -> None:
    # The sample (the first 16 KiB) holds no 'q', the rest is full of it: the hop budget runs out.
    rare_then_dense = b"plain text line\n" * 2000 + b"qqqqqqqqqq qqqq\n" * 50_000 + b"the enqueued line\n"
    spans = trigger_lines(rare_then_dense, 0, len(rare_then_dense), [b"enqueued"])
    assert list(spans) == [len(rare_then_dense) - len(b"the enqueued line\n")]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), max_size=60).map(b"".join),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    st.sampled_from([1, 7, 64, 1 << 20]),
    st.sampled_from([10, 60, 1000]),
)
def test_unreadable_lines_count_by_the_skip_test_not_by_the_finder(
    data: bytes, cuts: list[int], block: int, max_line: int
) -> None:
    """A narrower finder (as Hyperscan is, next to the literal search) picks the candidates; whether an
    over-long or binary line is a skipped one is the skip test's call, however the input is cut."""
    strict = literal_finder([b"ERRWARN"])
    scanner = LineScanner(strict, block=block, max_line=max_line, skip_test=literal_finder(TRIGGERS))
    start = 0
    got: list[Candidate] = []
    for cut in [*sorted({c for c in cuts if c <= len(data)}), len(data)]:
        got += scanner.feed(data[start:cut])
        start = cut
    got += scanner.finish()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    unreadable = [line for line in lines if len(line) > max_line or b"\x00" in line.lstrip(b"\x00")]
    readable = [line.lstrip(b"\x00") for line in lines if b"ERRWARN" in line and line not in unreadable]
    assert [c.data for c in got] == readable
    assert scanner.skipped == sum(1 for line in unreadable if any(t in line for t in TRIGGERS))


class _Submitting:
    """A finder that says it can search while the scanner counts (as Hyperscan's does with `parallel`)."""

    def __init__(self, needles: list[bytes]) -> None:
        self.needles = needles
        self.calls = 0

    def __call__(self, data: bytes, start: int, end: int) -> dict[int, int]:
        return trigger_lines(data, start, end, self.needles)

    def submit(
        self, data: bytes, start: int, end: int
    ) -> Callable[[], tuple[dict[int, int], dict[int, frozenset[int]]]]:
        self.calls += 1
        found = self(data, start, end)
        return lambda: (found, {})


def test_a_finder_that_searches_while_the_scanner_counts_gives_the_same_lines() -> None:
    """The counted pieces (line_scan._PIECE) and the short count to each candidate number it exactly."""
    rng = random.Random(7)
    lines = [
        "NCCL WARN boom" if rng.random() < 0.002 else "x" * rng.randrange(0, 300) for _ in range(40_000)
    ]  # about 6 MB: several blocks of several pieces each
    data = ("\n".join(lines) + "\n").encode()
    chunks = [data[i : i + 300_001] for i in range(0, len(data), 300_001)]
    plain = LineScanner([b"NCCL WARN"], block=1 << 20)
    finder = _Submitting([b"NCCL WARN"])
    overlapped = LineScanner(finder, block=1 << 20)
    want = [c for chunk in chunks for c in plain.feed(chunk)] + list(plain.finish())
    got = [c for chunk in chunks for c in overlapped.feed(chunk)] + list(overlapped.finish())
    assert finder.calls > 3 and got == want and overlapped.lines == plain.lines == len(lines)
    assert [c.line for c in want] == [i + 1 for i, text in enumerate(lines) if text == "NCCL WARN boom"]
