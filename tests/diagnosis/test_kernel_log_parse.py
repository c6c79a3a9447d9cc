"""parse_line and KernelLogParser on real-format kernel-log lines, one case per shape seen in the field."""

from __future__ import annotations

import importlib
import re
from typing import Any, NamedTuple

import pytest

from gpu_triage.diagnosis.training.rules import regex_cost
from gpu_triage.diagnosis.xid import kernel_log
from gpu_triage.diagnosis.xid.kernel_log import MAX_LINE_CHARS, EventKind, parse_recovery_change
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser
from tests.diagnosis.kernel_lines import parse_line

UUID = "GPU-0b11d014-a2a8-aa5e-ab77-7a1e0e2b0a79"


class Expect(NamedTuple):
    kind: EventKind
    code: int | None
    bus: str | None  # canonical
    pid: int | None = None
    process: str | None = None
    timestamp: str | None = None


def xid(
    code: int, bus: str | None, pid: int | None = None, process: str | None = None, ts: str | None = None
) -> Expect:
    return Expect(EventKind.XID, code, bus, pid, process, ts)


POSITIVE = {
    "bare-xid-79": (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=2301, name=python3, GPU has fallen off the bus.",
        xid(79, "0000:3b:00.0", 2301, "python3"),
    ),
    "old-format-without-PCI-tag": (
        "NVRM: Xid (0000:03:00): 14, Channel 00000001",
        xid(14, "0000:03:00.0"),
    ),
    "dmesg": (
        "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=init, An uncorrectable double bit error",
        xid(48, "0000:3b:00.0", 1, "init", "1234.567890"),
    ),
    "dmesg-T": (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:86:00): 13, pid=4242, name=pt_main_thread, "
        "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
        xid(13, "0000:86:00.0", 4242, "pt_main_thread", "Fri Aug 30 11:43:09 2024"),
    ),
    "dmesg-T-padded-day": (
        "[Fri Aug  2 01:03:09 2024] NVRM: Xid (PCI:0000:86:00): 43, pid=1, name=x, Ch 00000010",
        xid(43, "0000:86:00.0", 1, "x", "Fri Aug  2 01:03:09 2024"),
    ),
    "syslog": (
        "Aug 30 11:43:09 gpu-node-07 kernel: NVRM: Xid (PCI:0000:b1:00): 31, pid=9001, name=python, Ch 00000008",
        xid(31, "0000:b1:00.0", 9001, "python", "Aug 30 11:43:09"),
    ),
    "syslog-with-dmesg-seconds": (
        "Aug 30 11:43:09 node kernel: [ 1500.111] NVRM: Xid (PCI:0000:b1:00): 31, pid=9, name=x, Ch 00000008",
        xid(31, "0000:b1:00.0", 9, "x", "Aug 30 11:43:09"),
    ),
    "syslog-polish-locale": (
        "kwi 15 10:22:01 węzeł-3 kernel: NVRM: Xid (PCI:0000:b1:00): 119, pid=1337, name=python, Timeout",
        xid(119, "0000:b1:00.0", 1337, "python", "kwi 15 10:22:01"),
    ),
    "journal-short-iso": (
        "2024-08-30T11:43:09+0200 dgx-b200-12 kernel: NVRM: Xid (PCI:0000:1b:00): 62, pid=1, name=x, halt",
        xid(62, "0000:1b:00.0", 1, "x", "2024-08-30T11:43:09+0200"),
    ),
    "journal-short-precise": (
        "Aug 30 11:43:09.123456 dgx-h100-01 kernel: NVRM: Xid (PCI:0000:1b:00): 63, pid=1, name=x, Row Remap",
        xid(63, "0000:1b:00.0", 1, "x", "Aug 30 11:43:09.123456"),
    ),
    "rfc3339-syslog": (
        "2024-08-30T11:43:09.123456+02:00 h1 kernel: NVRM: Xid (PCI:0000:1b:00): 64, pid=2, name=y, failure",
        xid(64, "0000:1b:00.0", 2, "y", "2024-08-30T11:43:09.123456+02:00"),
    ),
    "syslog-priority": (
        "<4>Aug 30 11:43:09 h1 kernel: NVRM: Xid (PCI:0000:1b:00): 64, pid=2, name=y, failure",
        xid(64, "0000:1b:00.0", 2, "y", "Aug 30 11:43:09"),
    ),
    "journal-short-unix": (
        "1725018189.123456 h1 kernel: NVRM: Xid (PCI:0000:1b:00): 64, pid=2, name=y, failure",
        xid(64, "0000:1b:00.0", 2, "y", "1725018189.123456"),
    ),
    "talos-digits-in-host": (
        "172.20.0.119: kern: warning: [2024-08-30T11:43:09.123456789Z]: NVRM: Xid (PCI:0000:0b:00): 119, "
        "pid=77, name=pt_main_thread, Timeout after 6s",
        xid(119, "0000:0b:00.0", 77, "pt_main_thread", "2024-08-30T11:43:09.123456789Z"),
    ),
    "dev-kmsg-record": (
        "4,4821,2500000000,-;NVRM: Xid (PCI:0000:db:00): 120, pid=1337, name=python, GSP Error",
        xid(120, "0000:db:00.0", 1337, "python", "2500000000"),
    ),
    "dmesg-x-facility-prefix": (
        "kern  :warn  : [ 99.000001] NVRM: Xid (PCI:0000:db:00): 109, pid=1, name=x, Ctx switch timeout",
        xid(109, "0000:db:00.0", 1, "x", "99.000001"),
    ),
    "gb200-domain-0018": (
        "NVRM: Xid (PCI:0018:01:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        xid(79, "0018:01:00.0", 1, "x"),
    ),
    "pid-and-name-unknown": (
        "NVRM: Xid (PCI:0000:3b:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008",
        xid(31, "0000:3b:00.0"),
    ),
    "process-name-with-colon-and-brackets": (
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=10, name=nvc:[driver], Graphics Exception",
        xid(13, "0000:3b:00.0", 10, "nvc:[driver]"),
    ),
    "process-name-with-comma": (
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=10, name=a,b:c[0], Graphics Exception",
        xid(13, "0000:3b:00.0", 10, "a,b:c[0]"),
    ),
    "redacted-bus-dots": (
        "NVRM: Xid (PCI:...): 45, pid=7071, name=torchrun, Ch 00000010",
        xid(45, None, 7071, "torchrun"),
    ),
    "redacted-bus-x": (
        "NVRM: Xid (PCI:xxxx:xx:xx): 79, pid=1, name=x, GPU has fallen off the bus.",
        xid(79, None, 1, "x"),
    ),
    "code-not-in-catalog": (
        "NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, something new",
        xid(999, "0000:3b:00.0", 1, "x"),
    ),
    "nvswitch-sxid": (
        "[ 2100.0] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 egress non-posted "
        "PRIV error (First)",
        Expect(EventKind.SXID, 12028, "0000:85:00.0", timestamp="2100.0"),
    ),
    "gpu-binding": (
        f"[   12.000001] NVRM: GPU at PCI:0000:2b:00: {UUID}",
        Expect(EventKind.GPU_BINDING, None, "0000:2b:00.0", timestamp="12.000001"),
    ),
    "gpu-binding-old-format": (
        f"NVRM: GPU at 0000:03:00: {UUID.upper()}",
        Expect(EventKind.GPU_BINDING, None, "0000:03:00.0"),
    ),
    "fallen-off-bus-single-line": (
        "[ 1843.3] NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.",
        xid(79, "0000:06:00.0", ts="1843.3"),
    ),
    "fallen-off-bus-old-single-line": (
        "NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
        xid(79, "0000:01:00.0"),
    ),
    "fallen-off-bus-joined-by-the-log-shipper": (
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the "
        "bus and is not responding to commands.",
        xid(79, "0000:b3:00.0"),
    ),
    "crlf-line-end": (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\r\n",
        xid(79, "0000:3b:00.0", 1, "x"),
    ),
}


@pytest.mark.parametrize(("text", "expected"), POSITIVE.values(), ids=POSITIVE.keys())
def test_shapes(text: str, expected: Expect) -> None:
    event = parse_line(text, 7)
    assert event is not None
    got = Expect(event.kind, event.code, event.pci_bus_id, event.pid, event.process, event.timestamp)
    assert got == expected
    assert event.line == 7
    assert event.text == text.rstrip("\r\n")


NEGATIVE = [
    pytest.param("", id="empty"),
    pytest.param("[    5.2] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15", id="nvrm-but-no-event"),
    pytest.param(
        "[ 2300.0] amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault Xid (PCI:0000:03:00): 79,",
        id="another-driver-mentions-xid",
    ),
    pytest.param("python: raise RuntimeError('Xid 79 seen on GPU 0')", id="application-log-mentions-xid"),
    pytest.param("[ 2400.0] NVRM: Xid (PCI:0000:3b:00): ", id="truncated-after-bus"),
    pytest.param("[ 2400.0] NVRM: Xid (PCI:0000:3b:00)", id="truncated-first-number-is-the-domain"),
    pytest.param("[ 2400.0] NVRM: Xid (PCI:0000:3b", id="truncated-inside-bus"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00): 79x, pid=1", id="code-glued-to-letters"),
    pytest.param("NVRM: Xid 79 on 0000:3b:00", id="no-parentheses"),
    pytest.param("NVRM: The NVIDIA GPU 0000:b3:00.0", id="fallen-off-head-alone"),
    pytest.param("NVRM: fallen off the bus and is not responding to commands.", id="fallen-off-tail-alone"),
    pytest.param("NVRM: GPU 0000:06:00.0: RmInitAdapter failed! (0x62:0x40:2168)", id="gpu-line-other-error"),
    pytest.param("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014", id="binding-with-cut-uuid"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x\x00, GPU has fallen off", id="nul-byte-binary"),
    pytest.param("\x00\x01\x02NVRM\xff\xfe SXid (((((", id="binary-garbage"),
    pytest.param("NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * MAX_LINE_CHARS, id="over-long-line"),
]


@pytest.mark.parametrize("text", NEGATIVE)
def test_near_misses(text: str) -> None:
    assert parse_line(text) is None


def test_sxid_is_never_an_xid() -> None:
    event = parse_line("nvidia-nvswitch3: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up")
    assert event is not None
    assert event.kind is EventKind.SXID
    assert event.code == 20034
    assert dict(event.details) == {
        "device": "nvidia-nvswitch3",
        "message": "Fatal, Link 48 LTSSM Fault Up",
        "severity": "Fatal",
        "link": "48",
    }


def test_binding_uuid_is_normalised() -> None:
    event = parse_line("NVRM: GPU at PCI:0000:2b:00: GPU-0B11D014-A2A8-AA5E-AB77-7A1E0E2B0A79")
    assert event is not None
    assert event.uuid == UUID


DETAILS = [
    pytest.param(
        "NVRM: Xid (PCI:0000:3b:00): 45, pid=7071, name=torchrun, Ch 00000010, caused by previous Xid 149",
        {"caused_by_xid": "149", "channel": "00000010"},
        id="caused-by-previous-xid",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0018:01:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from "
        "0x0 (None) to 0x2 (Node Reboot Required)",
        {
            "recovery_action": "2",
            "previous_recovery_action": "0",
            "recovery_action_label": "Node Reboot Required",
        },
        id="xid-154",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        {
            "unit": "RLW_RXPIPE",
            "severity": "Nonfatal",
            "xc": "XC0",
            "injected": "i0",
            "link": "13",
            "intr_info": "0x0409a0c2",
            "error_status": "0x00000008",
        },
        id="nvlink5-145",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0008:01:00): 149, pid=1, name=x, NETIR_LINK_EVT Fatal XC1 i1 Link -1 (0x004505c6 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        {
            "unit": "NETIR_LINK_EVT",
            "severity": "Fatal",
            "xc": "XC1",
            "injected": "i1",
            "link": "-1",
            "intr_info": "0x004505c6",
            "error_status": "0x00000000",
        },
        id="nvlink5-149-after-pid-name",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0000:86:00): 13, pid=4242, name=p, Graphics SM Warp Exception on "
        "(GPC 1, TPC 0, SM 1): Out Of Range Address",
        {"gpc": "1", "tpc": "0", "sm": "1"},
        id="xid-13-gpc-tpc-sm",
    ),
    pytest.param(
        "NVRM: Xid (PCI:0000:86:00): 31, pid=1, name=p, Ch 00000008, intr 00000000. MMU Fault",
        {"channel": "00000008"},
        id="xid-31-channel",
    ),
]


@pytest.mark.parametrize(("text", "expected"), DETAILS)
def test_details(text: str, expected: dict[str, str]) -> None:
    event = parse_line(text)
    assert event is not None
    assert {k: event.details[k] for k in expected if k in event.details} == expected
    assert event.details["message"]  # the rest of the text is always kept


def test_recovery_change() -> None:
    text = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    assert parse_recovery_change(text) == (1, "GPU Reset Required")
    assert parse_recovery_change("GPU recovery action changed from 0x4 to 0x0") == (0, None)
    assert parse_recovery_change("nothing to see") is None


FALLEN = [
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "[ 1843.308146] NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "[ 1843.308147] NVRM: fallen off the bus and is not responding to commands.",
]


def _feed(lines: list[str], first: int = 1) -> tuple[list[tuple[int, int | None, str | None]], KernelLogParser]:
    parser = KernelLogParser()
    events = [e for n, text in enumerate(lines, first) for e in parser.feed(text, n)] + parser.finish()
    return [(e.line, e.code, e.pci_bus_id) for e in events], parser


def test_fallen_off_bus_three_lines() -> None:
    parser = KernelLogParser()
    assert parser.feed(FALLEN[0], 10) == []
    assert parser.feed(FALLEN[1], 11) == []
    assert parser.feed(FALLEN[2], 12) == []  # held: the driver's Xid 79 for it may follow
    [event] = parser.flush()
    assert (event.kind, event.code, event.pci_bus_id, event.line) == (EventKind.XID, 79, "0000:b3:00.0", 10)
    assert event.text == " ".join(FALLEN)
    assert event.timestamp == "1843.308145"
    assert event.details["synthesized"] == "fallen_off_bus"


def test_fallen_off_bus_interleaved_with_other_lines() -> None:
    lines = [
        FALLEN[0],
        "mlx5_core 0000:c1:00.0: link up",
        FALLEN[1],
        "NVRM: Xid (PCI:0000:3b:00): 13, x",
        FALLEN[2],
    ]
    events, _ = _feed(lines)
    assert events == [(4, 13, "0000:3b:00.0"), (1, 79, "0000:b3:00.0")]


def test_fallen_off_bus_continuation_too_late_is_still_reported() -> None:
    events, _ = _feed([FALLEN[0], FALLEN[1], *["chatter"] * 20, FALLEN[2]])
    assert events == [(23, 79, None)]  # the head expired; the fault itself is not dropped


def test_fallen_off_bus_cut_at_end_of_input_is_malformed() -> None:
    events, parser = _feed(FALLEN[:2])
    assert events == []
    assert parser.stats.malformed == 1


def test_unsupported_gpu_message_is_not_a_fault() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1b80)",
        "NVRM: installed in this system is not supported by the NVIDIA 550.54 driver release.",
    ]
    events, parser = _feed(lines)
    assert events == []
    assert parser.stats.malformed == 0


def test_feeding_only_candidate_lines_gives_the_same_events() -> None:
    lines = [FALLEN[0], "a", "b", FALLEN[1], "c", FALLEN[2], "NVRM: Xid (PCI:0000:3b:00): 31, x"]
    every, _ = _feed(lines)
    parser = KernelLogParser()
    some = [e for n, t in enumerate(lines, 1) if "NVRM" in t for e in parser.feed(t, n)] + parser.finish()
    assert [(e.line, e.code, e.pci_bus_id) for e in some] == every


XID79_B3 = "NVRM: Xid (PCI:0000:b3:00): 79, pid=7, name=python3, GPU has fallen off the bus."
FALLEN_B3 = "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus."


def _events(lines: dict[int, str]) -> tuple[list[tuple[int, int | None, str | None, int | None]], KernelLogParser]:
    """Feed {line number: text}; every event out, with its pid (set on real Xid lines only)."""
    parser = KernelLogParser()
    events = [e for n, text in sorted(lines.items()) for e in parser.feed(text, n)] + parser.finish()
    return [(e.line, e.code, e.pci_bus_id, e.pid) for e in events], parser


@pytest.mark.parametrize(
    "lines",
    [
        {1: XID79_B3, 2: FALLEN_B3},
        {1: FALLEN_B3, 2: XID79_B3},
        {1: FALLEN[0], 2: FALLEN[1], 3: XID79_B3, 4: FALLEN[2]},
        {1: FALLEN[0], 2: FALLEN[1], 3: FALLEN[2], 13: XID79_B3},
        {1: XID79_B3, 11: FALLEN[0], 12: FALLEN[1], 13: FALLEN[2]},
    ],
    ids=["xid-first", "message-first", "xid-inside-three-lines", "xid-at-window-end", "message-at-window-end"],
)
def test_fallen_off_bus_and_its_xid_79_are_one_event(lines: dict[int, str]) -> None:
    events, parser = _events(lines)
    xid_line = next(n for n, text in lines.items() if text == XID79_B3)
    assert events == [(xid_line, 79, "0000:b3:00.0", 7)]  # the driver's line: it names the process
    assert parser.stats.events == 1


def test_fallen_off_bus_and_xid_79_of_another_gpu_are_two_events() -> None:
    events, _ = _events({1: "NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=x, GPU has fallen off the bus.", 2: FALLEN_B3})
    assert events == [(1, 79, "0000:3b:00.0", 7), (2, 79, "0000:b3:00.0", None)]


@pytest.mark.parametrize(
    "lines",
    [{1: XID79_B3, 12: FALLEN_B3}, {1: FALLEN_B3, 12: XID79_B3}],
    ids=["xid-first", "message-first"],
)
def test_fallen_off_bus_and_xid_79_beyond_the_window_are_two_events(lines: dict[int, str]) -> None:
    events, parser = _events(lines)
    pids = {n: 7 if text == XID79_B3 else None for n, text in lines.items()}
    assert sorted(events) == [(n, 79, "0000:b3:00.0", pids[n]) for n in (1, 12)]
    assert parser.stats.events == 2


def test_held_event_is_released_by_a_later_line_beyond_the_window_before_that_lines_own() -> None:
    parser = KernelLogParser()
    assert parser.feed(FALLEN_B3, 1) == []
    assert parser.feed("NVRM: Xid (PCI:0000:3b:00): 13, x", 11) != []  # still within the window
    [held, own] = parser.feed("NVRM: Xid (PCI:0000:3b:00): 31, x", 12)
    assert (held.line, held.code, own.line, own.code) == (1, 79, 12, 31)
    assert parser.stats.events == 3
    assert parser.flush() == [] and parser.finish() == []


def test_flush_releases_held_events_in_line_order_and_counts_them() -> None:
    parser = KernelLogParser()
    for n, text in ((1, FALLEN[0]), (2, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."), (3, FALLEN[1])):
        assert parser.feed(text, n) == []
    assert parser.feed(FALLEN[2], 4) == []
    assert parser.stats.events == 0
    assert [(e.line, e.pci_bus_id) for e in parser.flush()] == [(1, "0000:b3:00.0"), (2, "0000:3b:00.0")]
    assert parser.stats.events == 2
    assert parser.flush() == []
    # Released is released: the Xid 79 that comes after a flush is an event of its own.
    assert [e.pid for e in parser.feed(XID79_B3, 5)] == [7]


def test_flushed_message_after_an_xid_79_is_still_dropped() -> None:
    parser = KernelLogParser()
    assert len(parser.feed(XID79_B3, 1)) == 1
    assert parser.flush() == []
    assert parser.feed(FALLEN_B3, 2) == [] and parser.finish() == []


def test_fallen_off_bus_without_a_bus_is_not_held() -> None:
    parser = KernelLogParser()
    [event] = parser.feed(FALLEN[2], 5)  # the head is gone: the GPU is unknown, nothing to match
    assert (event.line, event.code, event.pci_bus_id) == (5, 79, None)


def test_memory_of_xid_79_lines_stays_bounded() -> None:
    parser = KernelLogParser()
    for n in range(1, 5000):
        parser.feed(f"NVRM: Xid (PCI:0000:{n % 256:02x}:00): 79, pid=1, name=x, GPU has fallen off the bus.", n * 3)
    assert len(parser._recent79) <= 21  # the bound is the point of this test


def test_parser_counts() -> None:
    lines = [
        "NVRM: Xid (PCI:0000:3b:00): 13, x",
        "NVRM: Xid (PCI:0000:3b",
        "NVRM: Xid (PCI:0000:3b:00): 79, \x00",
        "NVRM: Xid (PCI:0000:3b:00): 79, " + "y" * MAX_LINE_CHARS,
        "unrelated",
    ]
    events, parser = _feed(lines)
    stats = parser.stats
    # The NUL ends the third line's text: what comes before it is a whole Xid line, and is read.
    assert events == [(1, 13, "0000:3b:00.0"), (3, 79, "0000:3b:00.0")]
    assert (stats.candidates, stats.events, stats.malformed, stats.binary, stats.overlong) == (4, 2, 1, 1, 1)
    assert stats.skipped == 2


# The driver prints an Xid as (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c)
#     "NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s\n"
# Each line below breaks one part of that format (or of the NVSwitch driver's "SXid (...): %d, ..."), and
# repeats something a regex could backtrack over, up to the line cap: none of them is an event. How long
# they take is bench/bench_regex_worst.py's business; here, what comes out.
ADVERSARIAL_NO_EVENT = {
    "parenthesis-never-closed": "NVRM: Xid (" + "(" * 8000,
    "bus-field-longer-than-any-bus-id": "NVRM: Xid (PCI:" + "0000:3b:00 " * 700 + "): 79, pid=1, name=x, y",
    "header-cut-inside-the-bus-again-and-again": "NVRM: Xid (PCI:0000:3b" * 350,
    "no-%d-after-the-bus": "NVRM: Xid (PCI:0000:3b:00): " + ", pid=1" * 1100,
    "%d-longer-than-any-code": "NVRM: Xid (PCI:0000:3b:00): " + "7" * 8000,
    "%d-glued-to-letters": "NVRM: Xid (PCI:0000:3b:00): 79" + "x" * 8000,
    "gpu-words-without-a-bus-id": "NVRM: " + "GPU " * 1900 + "fallen off the bus",
    "fallen-off-head-repeated-never-continued": "NVRM: " + "The NVIDIA GPU 0000:b3:00.0 " * 250,
    "sxid-parenthesis-repeated": "SXid (" * 1300,
    "sxid-without-its-%d": "nvidia-nvswitch0: SXid (PCI:0000:85:00.0): " + "Fatal, " * 1100,
}


@pytest.mark.parametrize("text", ADVERSARIAL_NO_EVENT.values(), ids=ADVERSARIAL_NO_EVENT.keys())
def test_adversarial_lines_off_the_drivers_format_give_no_event(text: str) -> None:
    assert len(text) <= MAX_LINE_CHARS  # under the cap: the regexes do run over all of it
    assert parse_line(text) is None
    parser = KernelLogParser()
    assert parser.feed(text, 1) + parser.finish() == []
    assert parser.stats.events == 0


# The driver's whole line behind a prefix no kernel log prints: someone else wrote it, so no event.
NOT_THE_KERNELS = {
    "brackets-before": "[" * 8000 + "NVRM: Xid (PCI:0000:3b:00): 79",
    "digits-before": "9" * 8000 + "NVRM: Xid (PCI:0000:3b:00): 79",
}


@pytest.mark.parametrize("text", NOT_THE_KERNELS.values(), ids=NOT_THE_KERNELS.keys())
def test_adversarial_prefix_makes_the_line_not_the_kernels(text: str) -> None:
    parser = KernelLogParser()
    assert parser.feed(text, 1) + parser.finish() == []
    assert (parser.stats.events, parser.stats.not_kernel) == (0, 1)


# The driver's format kept, its free-text message (the last %s) made of what the detail regexes look for:
# still exactly the one event the header names.
ADVERSARIAL_ONE_EVENT = {
    "sm-words": (13, "NVRM: Xid (PCI:0000:3b:00): 13, " + "GPC 1, TPC " * 700),
    "caused-by-repeated": (45, "NVRM: Xid (PCI:0000:3b:00): 45, " + "caused by previous Xid " * 300),
    "recovery-change-never-closed": (
        154,
        "NVRM: Xid (PCI:0000:3b:00): 154, " + "recovery action changed from 0x0 (" * 200,
    ),
    "nvlink5-never-closed": (145, "NVRM: Xid (PCI:0000:3b:00): 145, " + "RLW_A Fatal XC0 i0 Link 1 (" * 250),
    "channel-words": (13, "NVRM: Xid (PCI:0000:3b:00): 13, " + "Ch " * 2500),
}


@pytest.mark.parametrize(("code", "text"), ADVERSARIAL_ONE_EVENT.values(), ids=ADVERSARIAL_ONE_EVENT.keys())
def test_adversarial_message_after_a_whole_header_is_one_event(code: int, text: str) -> None:
    assert len(text) <= MAX_LINE_CHARS
    event = parse_line(text)
    assert event is not None
    assert (event.kind, event.code, event.pci_bus_id) == (EventKind.XID, code, "0000:3b:00.0")
    parser = KernelLogParser()
    assert [(e.code, e.pci_bus_id) for e in parser.feed(text, 1) + parser.finish()] == [(code, "0000:3b:00.0")]


def test_every_kernel_log_regex_is_bounded() -> None:
    """Bounded repetition everywhere: a search is linear in the (capped) line length, whatever the line."""
    patterns = [v for v in vars(kernel_log).values() if isinstance(v, re.Pattern)]
    assert len(patterns) >= 8
    for p in patterns:
        tree = _sre.parse(p.pattern, p.flags)
        assert _MAXREPEAT not in _bounds(tree), p.pattern
        assert regex_cost.problems(tree) == [], p.pattern


_sre: Any = importlib.import_module("re._parser")
_MAXREPEAT: Any = importlib.import_module("re._constants").MAXREPEAT


def _bounds(tree: Any) -> list[Any]:
    """The upper bound of every repeat in a parsed pattern."""
    out = []
    for _op, av in tree:
        for part in av if isinstance(av, (list, tuple)) else ():
            if isinstance(part, _sre.SubPattern):
                out += _bounds(part)
            elif isinstance(part, list):
                out += [b for alt in part if isinstance(alt, _sre.SubPattern) for b in _bounds(alt)]
        if str(_op) in ("MAX_REPEAT", "MIN_REPEAT"):
            out.append(av[1])
    return out


def test_ten_megabyte_line_is_skipped_and_counted() -> None:
    text = "NVRM: Xid (PCI:0000:3b:00): 79, " + "z" * (10 << 20)
    assert parse_line(text) is None
    parser = KernelLogParser()
    assert parser.feed(text, 1) == []
    assert parser.stats.overlong == 1
