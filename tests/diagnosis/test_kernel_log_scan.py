"""scan: the line parser's events however the input is cut; garbage skipped and counted; never raises."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_triage.diagnosis.xid.kernel_log import EventKind, KernelEvent
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser, ScanStats, scan
from tests.diagnosis.kernel_lines import parse_line

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kmsg"
MIXED = (FIXTURES / "mixed.log").read_bytes()
GARBAGE = (FIXTURES / "garbage.log").read_bytes()

# No example database: it would be written into the working tree.
FAST = settings(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(data: bytes) -> tuple[list[KernelEvent], ScanStats]:
    """Every line, decoded with bad bytes replaced, through the line parser: what scan must match."""
    parser = KernelLogParser()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    events = [e for n, raw in enumerate(lines, 1) for e in parser.feed(raw.decode("utf-8", "replace"), n)]
    return events + parser.finish(), parser.stats


def scanned(chunks: list[bytes]) -> tuple[list[KernelEvent], ScanStats]:
    stats = ScanStats()
    return list(scan(chunks, stats)), stats


def summary(events: list[KernelEvent]) -> list[tuple[int, EventKind, int | None, str | None]]:
    return [(e.line, e.kind, e.code, e.pci_bus_id) for e in events]


def test_mixed_fixture_events() -> None:
    events, stats = scanned([MIXED])
    assert summary(events) == [
        (4, EventKind.GPU_BINDING, None, "0000:3b:00.0"),
        (5, EventKind.XID, 79, "0000:3b:00.0"),  # line 6 is the Xid-less message for it: one fault
        (7, EventKind.XID, 14, "0000:03:00.0"),
        (8, EventKind.XID, 13, "0000:86:00.0"),
        (9, EventKind.XID, 13, "0000:86:00.0"),
        (10, EventKind.XID, 31, "0000:b1:00.0"),
        (11, EventKind.XID, 154, "0018:01:00.0"),
        (12, EventKind.XID, 145, "0018:01:00.0"),
        (13, EventKind.XID, 48, "0000:1b:00.0"),
        (14, EventKind.XID, 45, None),
        (15, EventKind.XID, 149, "0019:01:00.0"),
        (16, EventKind.SXID, 12028, "0000:85:00.0"),
        (17, EventKind.SXID, 12028, "0000:85:00.0"),
        (24, EventKind.XID, 119, "0000:db:00.0"),
        (26, EventKind.XID, 94, "0000:3b:00.0"),  # last line, no newline after it
        # Xid-less messages, held for an Xid 79 that never came until the input ended:
        (18, EventKind.XID, 79, "0000:b3:00.0"),  # the three-line message, lines 18, 20, 21
        (25, EventKind.XID, 79, "0000:01:00.0"),
    ]
    assert "synthesized" not in events[1].details
    assert [e.details["synthesized"] for e in events[-2:]] == ["fallen_off_bus"] * 2
    assert (stats.lines, stats.events, stats.malformed, stats.skipped) == (26, 17, 1, 1)


def test_every_line_event_of_parse_line_is_found_by_scan() -> None:
    events, _ = scanned([MIXED])
    for n, raw in enumerate(MIXED.split(b"\n"), 1):
        single = parse_line(raw.decode(), n)
        if single is not None and n != 6:  # line 6 repeats line 5's Xid 79, and is dropped for it
            assert single in events


@pytest.mark.parametrize("name", ["mixed.log", "garbage.log"])
def test_scan_matches_line_parser_at_every_split(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    expected, expected_stats = reference(data)
    step = 1 if len(data) < 8192 else 97
    for cut in range(0, len(data) + 1, step):
        events, stats = scanned([data[:cut], data[cut:]])
        assert events == expected, f"split at byte {cut}"
        assert stats.events == expected_stats.events


def test_scan_matches_line_parser_byte_by_byte() -> None:
    expected, _ = reference(MIXED)
    assert scanned([MIXED[i : i + 1] for i in range(len(MIXED))])[0] == expected


def test_garbage_fixture_is_skipped_and_counted() -> None:
    events, stats = scanned([GARBAGE])
    assert [(e.line, e.code, e.process) for e in events] == [
        (2, 13, "py\ufffd\ufffdth"),
        (3, 79, "x"),  # NULs end its text: the Xid before them is whole
        (10, 62, "survivor"),
    ]
    assert (stats.invalid_utf8, stats.binary, stats.overlong, stats.malformed) == (1, 1, 2, 1)
    assert stats.skipped == 3


@pytest.mark.parametrize("chunk", [1 << 20, 4096, 100_003])
def test_ten_megabyte_line(chunk: int) -> None:
    data = (
        b"first\n" + b"NVRM: Xid (PCI:0000:3b:00): 79, " + b"q" * (10 << 20) + b"\nNVRM: Xid (PCI:0000:3b:00): 31, x\n"
    )
    events, stats = scanned([data[i : i + chunk] for i in range(0, len(data), chunk)])
    assert summary(events) == [(3, EventKind.XID, 31, "0000:3b:00.0")]
    assert (stats.lines, stats.overlong) == (3, 1)


def test_empty_and_newline_only_inputs() -> None:
    assert scanned([]) == ([], ScanStats())
    assert scanned([b"", b""])[0] == []
    assert scanned([b"\n\n\n"])[1].lines == 3


def test_dense_probe_bytes_fall_back_without_losing_lines() -> None:
    # 'V' and 'X' everywhere: the hopping search gives up and the plain search must still find everything.
    chatter = b"VVVV XXXX VXVX NVR SXi NV SX\n" * 5000
    line = b"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"
    data = chatter + line + chatter + b"nvidia-nvswitch0: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 1\n"
    events, _ = scanned([data[:70_000], data[70_000:]])
    assert summary(events) == [
        (5001, EventKind.XID, 48, "0000:3b:00.0"),
        (10002, EventKind.SXID, 12028, "0000:85:00.0"),
    ]


def test_rare_probe_bytes_hop_and_survive_a_change_of_text() -> None:
    # Starts without any 'V' or 'X' (the searches hop from probe byte to probe byte), then turns dense
    # with them (the hop budget runs out mid-chunk and the plain search takes over).
    line = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    quiet = b"eth0: link up, 100 gbps full duplex\n" * 3000
    noisy = b"VVVV XXXX Xid VRM NVRM NVR\n" * 3000
    data = line + quiet + line + noisy + line + b"nvidia-nvswitch0: SXid (PCI:0000:85:00.0): 1, Fatal\n"
    for chunk in (len(data), 65536):
        events, _ = scanned([data[i : i + chunk] for i in range(0, len(data), chunk)])
        assert [(e.line, e.kind) for e in events] == [
            (1, EventKind.XID),
            (3002, EventKind.XID),
            (6003, EventKind.XID),
            (6004, EventKind.SXID),
        ]


FRAGMENTS = [
    "NVRM:", "NVRM: ", "Xid ", "SXid ", "(", ")", "PCI:", "0000:3b:00", "0018:01:00.0", "...", ": ", "79",
    "13", "154", "145", ",", " pid=", "'<unknown>'", " name=", "<unknown>", "GPU at ",
    "GPU-0b11d014-a2a8-aa5e-ab77-7a1e0e2b0a79", "The NVIDIA GPU ",
    "(PCI ID: 10de:26b5) installed in this system has", "fallen off the bus", "\x00", "\r", "[", "]",
    " 123.456", "Aug 30 11:43:09 ", "0x", "recovery action changed from 0x0 (None) to ",
    "0x2 (Node Reboot Required)", "GPC 1, TPC 2, SM 3", "RLW_RXPIPE Nonfatal XC0 i0 Link 13 ",
    "caused by previous Xid ", "nvidia-nvswitch2: ", "\u0142", "\ufffd", " ",
]  # fmt: skip
line_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=5), max_size=25).map("".join)


@FAST
@given(st.text(max_size=300) | line_text)
def test_parse_line_never_raises(text: str) -> None:
    event = parse_line(text)
    assert event is None or isinstance(event, KernelEvent)
    if event is not None and event.code is not None:
        assert event.code >= 0


@FAST
@given(st.lists(st.binary(max_size=200) | line_text.map(str.encode), max_size=12), st.data())
def test_scan_never_raises_and_matches_line_parser(pieces: list[bytes], data: st.DataObject) -> None:
    blob = b"\n".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=6)))
    chunks = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)], strict=True)]
    expected, expected_stats = reference(blob)
    events, stats = scanned(chunks)
    assert events == expected
    assert (stats.events, stats.malformed, stats.binary) == (
        expected_stats.events,
        expected_stats.malformed,
        expected_stats.binary,
    )


@FAST
@given(st.lists(line_text, max_size=30))
def test_parser_never_raises_on_any_sequence(lines: list[str]) -> None:
    parser = KernelLogParser()
    for n, text in enumerate(lines, 1):
        parser.feed(text, n)
    parser.finish()
    assert parser.stats.events <= parser.stats.candidates
