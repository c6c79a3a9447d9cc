"""Who wrote a kernel-log line, from the prefixes each log writer puts before the driver's `NVRM:` / `nvidia-nvswitchN:`.

Each case is a shape a real writer prints: the kernel's /dev/kmsg records (`PRI,SEQ,USEC,FLAGS;`, PRI = facility
* 8 + level, facility 0 = LOG_KERN), util-linux dmesg (`[ seconds]`, `-T`, `-x` decode with facility names, the
caller id `[T123]` of CONFIG_PRINTK_CALLER), RFC 3164 syslog (`Mmm dd hh:mm:ss host tag[pid]: `), RFC 5424
(`<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD `), journalctl's short formats, Talos' `talosctl dmesg`.
"""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.xid.kernel_origin import Origin, origin
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."

CASES = {
    "bare (dmesg -r stripped, a paste, the simulator's file)": ("", Origin.KERNEL),
    "dmesg": ("[ 1234.567890] ", Origin.KERNEL),
    "dmesg -T": ("[Tue Dec  1 14:00:00 2026] ", Origin.KERNEL),
    "dmesg with the caller id": ("[    2.063262] [    T1] ", Origin.KERNEL),
    "dmesg -x, the kernel": ("kern  :warn  : [ 99.000001] ", Origin.KERNEL),
    "dmesg -x, written by userspace": ("user  :warn  : [ 99.000001] ", Origin.OTHER),
    "dmesg -r, the kernel": ("<4>[ 99.000001] ", Origin.KERNEL),
    "dmesg -r, written by userspace": ("<12>[ 99.000001] ", Origin.OTHER),
    "syslog, the kernel": ("Dec  1 14:00:00 node1 kernel: ", Origin.KERNEL),
    "syslog with the kernel's own seconds": ("Dec  1 14:00:00 node1 kernel: [ 1500.111] ", Origin.KERNEL),
    "syslog, logger as alice": ("Dec  1 14:00:00 node1 alice: ", Origin.OTHER),
    "syslog, a daemon with a pid": ("Dec  1 14:00:00 node1 python3[4242]: ", Origin.OTHER),
    "syslog with a priority, kern": ("<4>Dec  1 14:00:00 node1 kernel: ", Origin.KERNEL),
    "syslog with a priority, user facility tagged kernel": ("<12>Dec  1 14:00:00 node1 kernel: ", Origin.OTHER),
    "RSYSLOG_FileFormat": ("2026-12-01T14:00:00.123456+00:00 node1 kernel: ", Origin.KERNEL),
    "RFC 5424, the kernel": ("<4>1 2026-12-01T14:00:00.123Z node1 kernel - - - ", Origin.KERNEL),
    "RFC 5424, another app": ("<14>1 2026-12-01T14:00:00.123Z node1 myapp 77 - - ", Origin.OTHER),
    "journalctl -o short-monotonic": ("[ 1234.567890] node1 kernel: ", Origin.KERNEL),
    "journalctl -o short-unix": ("1764597600.123456 node1 kernel: ", Origin.KERNEL),
    "talosctl dmesg": ("172.20.0.119: kern: warning: [2024-08-30T11:43:09.123456789Z]: ", Origin.KERNEL),
    "talosctl dmesg, userspace": ("172.20.0.119: user: warning: [2024-08-30T11:43:09.123456789Z]: ", Origin.OTHER),
    "an audit record quoting a file name": ('audit: type=1400 apparmor="DENIED" name="/home/alice/', Origin.QUOTED),
    "a USB product string": ("[ 12.0] usb 1-1: Product: ", Origin.OTHER),
    "a kernel line quoting text": ("[ 12.0] some driver said: ", Origin.QUOTED),
    "a launcher's prefix on a paste": ("node07: [ 12.3] ", Origin.QUOTED),
    "a launcher's prefix before a user's syslog line": ("[1,3]<stdout>: Dec  1 14:00:00 h1 alice: ", Origin.OTHER),
}


@pytest.mark.parametrize(("prefix", "expected"), CASES.values(), ids=CASES.keys())
def test_origin(prefix: str, expected: Origin) -> None:
    assert origin(prefix) is expected


@pytest.mark.parametrize(("prefix", "expected"), CASES.values(), ids=CASES.keys())
def test_the_daemons_parser_takes_only_the_kernels_lines(prefix: str, expected: Origin) -> None:
    parser = KernelLogParser()
    events = parser.feed(prefix + XID, 1) + parser.finish()
    assert len(events) == (expected is Origin.KERNEL)
    assert parser.stats.not_kernel == (expected is not Origin.KERNEL)


@pytest.mark.parametrize(("prefix", "expected"), CASES.values(), ids=CASES.keys())
def test_diagnose_reads_a_pasted_line_unless_it_names_another_writer(prefix: str, expected: Origin) -> None:
    parser = KernelLogParser(strict=False)
    events = parser.feed(prefix + XID, 1) + parser.finish()
    assert len(events) == (expected is not Origin.OTHER)


def test_a_transport_that_says_userspace_wins_over_the_text() -> None:
    parser = KernelLogParser()
    assert parser.feed(XID, 1, kernel=False) == [] and parser.stats.not_kernel == 1
    assert len(parser.feed(XID, 30, kernel=True) + parser.finish()) == 1


def test_nvswitch_lines_need_the_kernel_too() -> None:
    sxid = "nvidia-nvswitch3: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    parser = KernelLogParser()
    assert len(parser.feed("[ 2100.0] " + sxid, 1)) == 1
    assert parser.feed("Dec  1 14:00:00 node1 bob: " + sxid, 2) == []
    assert parser.feed('audit: name="/tmp/' + sxid, 3) == []
    assert parser.stats.not_kernel == 2


def test_every_line_of_the_three_line_fallen_off_message_must_be_the_kernels() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    forged = KernelLogParser()
    got = [e for n, text in enumerate(lines, 1) for e in forged.feed(f"Dec  1 14:00:0{n} h1 eve: {text}", n)]
    assert got + forged.finish() == [] and forged.stats.not_kernel == 3
    real = KernelLogParser()
    got = [e for n, text in enumerate(lines, 1) for e in real.feed(f"Dec  1 14:00:0{n} h1 kernel: {text}", n)]
    assert [(e.code, e.pci_bus_id) for e in got + real.finish()] == [(79, "0000:b3:00.0")]
