"""Only the kernel speaks for a GPU: what userspace writes into the kernel log, or quotes into a kernel record, is
counted and never an XID.

The oracles are the kernel's and syslog's own rules, not our parser: the kernel gives every record written to
/dev/kmsg from userspace a non-zero facility (kernel/printk/printk.c, devkmsg_write: "If no prefix or no userspace
facility is specified, we enforce LOG_USER"), syslog files carry the writer's tag (`logger` writes the user's
name), and journald sets `_TRANSPORT` itself (`kernel` only for what it read from the kernel). The forged lines
are the ones an adversarial run used to page a node with XID 79 and 48 on healthy GPUs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.sources.journal import Cursor
from gpu_triage.exporter.sources.kmsg import KmsgFollower
from tests.daemon_proc import wait_for
from tests.exporter.sources.test_kmsg import Collect
from tests.exporter.sources.test_pipeline import start_daemon

FORGED = [
    # userspace writing to /dev/kmsg (root, a privileged pod, journald's ForwardToKMsg=yes): facility 1
    "14,1,1000,-;NVRM: Xid (PCI:0000:2a:00): 79, pid=1, name=p, GPU has fallen off the bus.",
    # a kernel record quoting a name a user chose (an AppArmor denial of a file named like an Xid)
    '5,2,2000,-;audit: type=1400 apparmor="DENIED" operation="open" name="/home/alice/NVRM: Xid (PCI:0000:3a:00): '
    '79, pid=1, GPU has fallen off the bus" comm="cat"',
    # `logger` in a syslog file: the tag is the user's name
    "Dec  1 14:00:00 node1 alice: NVRM: Xid (PCI:0000:5d:00): 48, pid=9, name=x, DBE",
    # ... or whatever tag it was given, in RFC 5424 as rsyslog writes it
    "<13>1 2026-12-01T14:00:00.000000+00:00 node1 nvidia - - - NVRM: Xid (PCI:0000:5d:00): 48, pid=9, name=x, DBE",
    # a journal entry exported as JSON that came in through syslog(3), not from the kernel
    json.dumps(
        {
            "__REALTIME_TIMESTAMP": "1764597600000000",
            "_TRANSPORT": "syslog",
            "SYSLOG_IDENTIFIER": "kernel",
            "MESSAGE": "NVRM: Xid (PCI:0000:9a:00): 79, pid=1, name=p, GPU has fallen off the bus.",
        }
    ),
    # `dmesg -x` shows the facility of a record userspace wrote
    "user  :warn  : [ 99.000001] NVRM: Xid (PCI:0000:ab:00): 79, pid=1, name=x, GPU has fallen off the bus.",
]
KERNEL = [
    "4,3,3000,-;NVRM: Xid (PCI:0000:2a:00): 13, pid=4242, name=python3, Graphics Exception",
    "Dec  1 14:00:01 node1 kernel: [ 1500.111] NVRM: Xid (PCI:0000:3a:00): 31, pid=9, name=x, Ch 00000008",
    json.dumps(
        {
            "__REALTIME_TIMESTAMP": "1764597602000000",
            "_TRANSPORT": "kernel",
            "SYSLOG_IDENTIFIER": "kernel",
            "MESSAGE": "NVRM: Xid (PCI:0000:5d:00): 43, pid=9, name=x, Ch 00000010",
        }
    ),
]


def _settled(d: Daemon, events: int) -> None:
    wait_for(
        lambda: len(d.journal.events()) >= events and d.pipeline.idle.is_set(),
        timeout=10,
        interval=0.02,
        what=f"{events} events journaled",
    )


def _skipped(d: Daemon, reason: str) -> float:
    prefix = f'gpu_triage_kmsg_skipped_lines_total{{reason="{reason}"}} '
    rows = [r for r in d.metrics.text.decode().splitlines() if r.startswith(prefix)]
    return float(rows[0].removeprefix(prefix)) if rows else 0.0


def test_forged_records_make_no_event_and_are_counted(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    d = start_daemon(tmp_path, "boot-1", kmsg)
    try:
        with kmsg.open("a") as f:
            f.write("".join(line + "\n" for line in FORGED + KERNEL))
        _settled(d, len(KERNEL))
        d.refresh()
        events = d.journal.events()
        assert sorted((e.gpu_index, e.code) for e in events) == [(1, 13), (2, 31), (3, 43)]
        assert _skipped(d, "not_kernel") == len(FORGED)
        assert d.verdicts.node.action.value not in ("REBOOT_NODE", "DRAIN_AND_RESET", "RESET_GPU")
        assert not any(f.class_id in ("xid_79", "xid_48") for f in d.verdicts.open_findings())
    finally:
        d.stop()


def test_a_char_device_record_from_userspace_is_refused_too(tmp_path: Path) -> None:
    """Read as /dev/kmsg is read (a character device, one record per read): a pty stands in for it."""
    master, slave = os.openpty()
    got = Collect()
    follower = KmsgFollower(
        Path(os.ttyname(slave)), got, cursor=got.cursor, boot_id="b1", boot_time=1000.0, clock=lambda: 5.0
    )
    follower.start()
    try:
        os.write(master, b"14,1,1000,-;NVRM: Xid (PCI:0000:2a:00): 79, pid=1, name=p, GPU has fallen off the bus.\n")
        os.write(master, b"4,2,2000,-;NVRM: Xid (PCI:0000:2a:00): 13, pid=1, name=p, Graphics Exception\n")
        records = got.wait_for(2)
        assert [(r.seq, r.kernel) for r in records] == [(1, False), (2, True)]
        assert got.cursor("kmsg:b1") == Cursor("kmsg:b1", 2, "")
    finally:
        follower.stop()
        os.close(master)
        os.close(slave)
