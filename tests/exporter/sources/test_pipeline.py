"""The XID path end to end: sources -> merge -> journal -> /metrics, across restarts and bursts."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.exporter.backends.base import DriverXid, GpuIdentity
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.sources import pipeline as pipeline_module
from gpu_triage.exporter.sources.journal import Cursor, Event, Journal
from gpu_triage.exporter.sources.pipeline import MERGE_WINDOW_SECONDS, DriverBatch, EventPipeline, KernelBatch
from gpu_triage.exporter.sources.records import Record
from tests.conftest import FakeClock, settings
from tests.daemon_proc import wait_for

GPUS = [GpuIdentity(0, "GPU-aaaa", "0000:18:00.0"), GpuIdentity(1, "GPU-bbbb", "0000:2a:00.0")]


def pipeline(tmp_path: Path) -> tuple[EventPipeline, list[Event]]:
    seen: list[Event] = []
    p = EventPipeline(Journal(tmp_path / "j.sqlite3"), boot_id="b1", gpus=lambda: GPUS, on_events=seen.extend)
    return p, seen


def line(seq: int, ts: float, text: str) -> KernelBatch:
    return KernelBatch("kmsg:b1", [Record(seq, ts, text)])


def driver(gpu: int, code: int, ts: float) -> DriverBatch:
    return DriverBatch("nvml", [DriverXid(gpu, code, ts)])


XID79_GPU1 = "NVRM: Xid (PCI:0000:2a:00): 79, pid=77, name=python3, GPU has fallen off the bus."


def test_kernel_events_land_on_the_right_gpu(tmp_path: Path) -> None:
    p, seen = pipeline(tmp_path)
    p.process([line(1, 10.0, XID79_GPU1)])
    (event,) = seen
    assert (event.gpu_index, event.uuid, event.pci_bus_id, event.code) == (1, "GPU-bbbb", "0000:2a:00.0", 79)
    assert (event.pid, event.process, event.kmsg_seq, event.sources) == (77, "python3", 1, "kmsg")
    assert p.journal.cursor("kmsg:b1") == Cursor("kmsg:b1", 1)


def test_the_same_fault_from_both_sources_is_one_event(tmp_path: Path) -> None:
    p, seen = pipeline(tmp_path)
    p.process([driver(1, 79, 10.0)])  # NVML is first...
    p.process([line(1, 10.3, XID79_GPU1)])  # ...the kernel's line follows
    assert p.stats.merged == 1
    first, richer = seen  # the one new event, then the same event made richer, for the verdict
    assert richer.id == first.id and (first.pid, richer.pid) == (None, 77)
    (stored,) = p.journal.events()
    assert stored.sources == "kmsg,nvml" and stored.pid == 77, "the kernel's richer record is kept"
    assert [t.count for t in p.journal.totals()] == [1]


def test_merging_works_either_way_and_within_one_batch(tmp_path: Path) -> None:
    p, _ = pipeline(tmp_path)
    p.process([line(1, 10.0, XID79_GPU1), driver(1, 79, 10.2)])
    assert [e.sources for e in p.journal.events()] == ["kmsg,nvml"]


def test_no_merge_across_gpus_codes_or_time(tmp_path: Path) -> None:
    p, _ = pipeline(tmp_path)
    p.process([line(1, 10.0, XID79_GPU1)])
    p.process([driver(0, 79, 10.1)])  # another GPU
    p.process([driver(1, 48, 10.1)])  # another code
    p.process([driver(1, 79, 10.0 + MERGE_WINDOW_SECONDS + 5)])  # too late to be the same report
    assert len(p.journal.events()) == 4 and p.stats.merged == 0


def test_a_burst_from_both_sources_pairs_one_to_one(tmp_path: Path) -> None:
    p, _ = pipeline(tmp_path)
    text = "NVRM: Xid (PCI:0000:18:00): 31, pid=5, name=train, Ch 00000010, intr 10000000"
    p.process([line(i, 50.0 + i * 0.01, text) for i in range(1, 6)])
    p.process([driver(0, 31, 50.0 + i * 0.01) for i in range(1, 6)])
    events = p.journal.events()
    assert len(events) == 5 and all(e.sources == "kmsg,nvml" for e in events)


def test_unknown_bus_id_is_kept_and_bound_by_the_kernel_line(tmp_path: Path) -> None:
    p, _ = pipeline(tmp_path)
    p.process(
        [
            line(1, 1.0, "NVRM: GPU at PCI:0000:e1:00: GPU-0b11d014-6ba6-4f3e-9e6a-7e1a1234abcd"),
            line(
                2, 2.0, "NVRM: Xid (PCI:0000:e1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
            ),
        ]
    )
    (event,) = p.journal.events()
    assert event.gpu_index is None and event.pci_bus_id == "0000:e1:00.0"
    assert event.uuid == "GPU-0b11d014-6ba6-4f3e-9e6a-7e1a1234abcd"


def test_a_log_full_of_bindings_keeps_the_newest_bounded(tmp_path: Path) -> None:
    """A corrupt or hostile kernel log can bind any number of bus ids; the daemon keeps the newest."""
    p, _ = pipeline(tmp_path)
    bindings = [
        line(
            i,
            1.0,
            f"NVRM: GPU at PCI:0000:{i >> 8:02x}:{i & 0x1F:02x}.{(i >> 5) & 7}: GPU-{i:08x}-6ba6-4f3e-9e6a-7e1a1234abcd",
        )
        for i in range(1, 3001)
    ]
    p.process(bindings)
    p.process([line(3001, 2.0, "NVRM: Xid (PCI:0000:0b:18.5): 79, pid=1, name=x, GPU has fallen off the bus.")])
    assert p.journal.events()[-1].uuid == f"GPU-{3000:08x}-6ba6-4f3e-9e6a-7e1a1234abcd"
    p.process([line(3002, 3.0, "NVRM: Xid (PCI:0000:00:01.0): 79, pid=1, name=x, GPU has fallen off the bus.")])
    assert p.journal.events()[-1].uuid is None, "the oldest binding was let go"


def test_sxids_are_their_own_kind(tmp_path: Path) -> None:
    p, _ = pipeline(tmp_path)
    p.process([line(1, 1.0, "nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up")])
    (event,) = p.journal.events()
    assert (event.kind, event.code, event.gpu_index, event.uuid) == ("sxid", 20034, None, None)


FALLEN_GPU1 = "NVRM: GPU 0000:2a:00.0: GPU has fallen off the bus."


def test_a_gpu_falling_off_the_bus_is_one_event_whichever_report_comes_first(tmp_path: Path) -> None:
    for name, texts in (("message-first", [FALLEN_GPU1, XID79_GPU1]), ("xid-first", [XID79_GPU1, FALLEN_GPU1])):
        p, _ = pipeline(tmp_path / name)
        p.process([KernelBatch("kmsg:b1", [Record(seq, 10.0 + seq, t) for seq, t in enumerate(texts, 1)])])
        assert [(e.code, e.pid, e.gpu_index) for e in p.journal.events()] == [(79, 77, 1)], name


def test_a_gpu_falling_off_the_bus_is_one_event_when_its_two_reports_are_read_apart(tmp_path: Path) -> None:
    """/dev/kmsg ends a batch whenever the reader catches up with the kernel: the message may be journaled
    before the Xid 79 line arrives. And NVML's report may have come before either."""
    for name, driver_first in (("kernel only", False), ("driver first", True)):
        p, seen = pipeline(tmp_path / name)
        if driver_first:
            p.process([driver(1, 79, 10.5)])
        p.process([KernelBatch("kmsg:b1", [Record(1, 11.0, FALLEN_GPU1)])])
        p.process([KernelBatch("kmsg:b1", [Record(2, 11.1, XID79_GPU1)])])
        (stored,) = p.journal.events()
        assert [t.count for t in p.journal.totals()] == [1], name
        assert (stored.code, stored.pid, stored.gpu_index) == (79, 77, 1), "the Xid line's richer record is kept"
        assert stored.sources == ("kmsg,nvml" if driver_first else "kmsg"), name
        assert seen[-1].id == stored.id and seen[-1].pid == 77, name


def test_a_held_back_report_keeps_the_time_of_its_own_line(tmp_path: Path) -> None:
    p, _ = pipeline(tmp_path)
    p.process([KernelBatch("kmsg:b1", [Record(1, 10.0, FALLEN_GPU1), Record(2, 20.0, "usb 1-1: new device")])])
    (event,) = p.journal.events()
    assert (event.code, event.ts, event.kmsg_seq, event.gpu_index) == (79, 10.0, 1, 1)
    assert p.journal.cursor("kmsg:b1") == Cursor("kmsg:b1", 2)


def test_lines_without_events_still_move_the_cursor(tmp_path: Path) -> None:
    p, seen = pipeline(tmp_path)
    p.process([KernelBatch("kmsg:b1", [Record(i, 1.0, f"usb 1-1: new device {i}") for i in range(1, 101)])])
    assert seen == [] and p.journal.cursor("kmsg:b1") == Cursor("kmsg:b1", 100)


# -- through the daemon ------------------------------------------------------------------------


def start_daemon(tmp_path: Path, boot_id: str, kmsg: Path) -> Daemon:
    clock = FakeClock()
    clock.advance(100)
    d = Daemon(
        SimBackend(load_scenario("h100-training"), clock=clock),
        settings(tmp_path, kmsg_path=kmsg),
        clock=clock,
        boot_id=boot_id,
    )
    d.start()
    following(d, kmsg)
    return d


def following(d: Daemon, kmsg: Path) -> None:
    """Until the kernel-log reader has looked at the file: a plain line written before would be old to it."""
    origin = f"file:{kmsg.absolute()}"
    wait_for(
        lambda: d.journal.cursor(origin) is not None, timeout=5, interval=0.01, what="the reader to note its place"
    )


def kmsg_line(seq: int, code: int, bus: str = "0000:18:00") -> str:
    return f"4,{seq},{seq * 1000},-;NVRM: Xid (PCI:{bus}): {code}, pid=9, name=python3, details {seq}\n"


def xid_count(d: Daemon, code: int) -> float:
    prefix = f'nvidia_gpu_xid_errors_total{{gpu="0",uuid="{d.snapshot.gpus[0].identity.uuid}",xid="{code}"}} '
    for row in d.metrics.text.decode().splitlines():
        if row.startswith(prefix):
            return float(row.removeprefix(prefix))
    return 0.0


def test_restart_neither_loses_nor_double_counts(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text("".join(kmsg_line(seq, 31) for seq in range(1, 4)))
    d = start_daemon(tmp_path, "boot-1", kmsg)
    # The reader notes its place before it reads the lines: wait for them, not for a moment of idleness.
    wait_for(lambda: xid_count(d, 31) >= 3, timeout=5, interval=0.02, what="3 XIDs counted")
    assert d.pipeline.idle.wait(timeout=5)
    assert xid_count(d, 31) == 3
    d.stop()
    with kmsg.open("a") as f:  # the kernel logs on while the daemon is down
        f.write("".join(kmsg_line(seq, 31) for seq in range(4, 6)))
    d = start_daemon(tmp_path, "boot-1", kmsg)
    wait_for(lambda: xid_count(d, 31) >= 5, timeout=5, interval=0.02, what="5 XIDs counted")
    assert d.pipeline.idle.wait(timeout=5)
    assert xid_count(d, 31) == 5, "the two lines logged while down are counted, the first three not again"
    d.stop()


def test_a_burst_of_ten_thousand_lines_is_journaled_completely(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    d = start_daemon(tmp_path, "boot-1", kmsg)
    try:
        with kmsg.open("a") as f:
            f.write("".join(kmsg_line(seq, 13) for seq in range(1, 10_001)))
        wait_for(lambda: xid_count(d, 13) >= 10_000, timeout=30, interval=0.05, what="10,000 XIDs counted")
        assert xid_count(d, 13) == 10_000 and len(d.journal.events(limit=20_000)) == 10_000
    finally:
        d.stop()


def test_an_injected_xid_is_on_metrics_without_waiting_for_a_poll(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    d = start_daemon(tmp_path, "boot-1", kmsg)
    try:
        assert d.driver_events is not None
        d.backend.inject(FaultSpec(gpu=0, kind="xid", xid=79))  # type: ignore[attr-defined]
        # The poll interval is 5 s: only the event path can be this quick.
        wait_for(lambda: xid_count(d, 79) >= 1, timeout=2, interval=0.01, what="the XID on /metrics")
        (event,) = d.journal.events()
        assert event.sources == "sim" and event.gpu_index == 0
    finally:
        d.stop()


def test_the_verdict_hears_what_the_kernel_log_adds_to_a_driver_event(tmp_path: Path) -> None:
    """NVML reports Xid 154 first, bare; the kernel's line, a moment later, names the action it asks for."""
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    d = start_daemon(tmp_path, "boot-1", kmsg)
    try:
        gpu = d.snapshot.gpus[0].identity
        d.pipeline.from_driver([DriverXid(0, 154, d.clock())], "nvml")
        assert d.pipeline.idle.wait(timeout=5)
        bus = gpu.pci_bus_id.removesuffix(".0")
        with kmsg.open("a") as f:  # a plain line: stamped when read, by the daemon's clock
            f.write(
                f"NVRM: Xid (PCI:{bus}): 154, pid='<unknown>', name=<unknown>, GPU recovery action "
                "changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
            )
        wait_for(
            lambda: d.journal.events()[0].sources == "kmsg,nvml", timeout=5, interval=0.02, what="both reports merged"
        )
        assert d.pipeline.idle.wait(timeout=5)
        (verdict,) = [g for g in d.diagnosis().body()["gpus"] if g["gpu"] == 0]
        assert verdict["action"] == "RESET_GPU", "not the catalog's REBOOT_NODE for a 154 without its text"
    finally:
        d.stop()


def test_retention_is_applied_while_the_daemon_runs(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    clock = FakeClock()
    d = Daemon(
        SimBackend(load_scenario("h100-training"), clock=clock),
        settings(tmp_path, journal_retention="2h"),
        clock=clock,
        boot_id="b1",
    )
    d.start()
    following(d, kmsg)
    try:
        with kmsg.open("a") as f:  # a plain line, stamped when read
            f.write("NVRM: Xid (PCI:0000:18:00): 31, pid=9, name=python3, details\n")
        wait_for(d.journal.events, timeout=5, interval=0.02, what="the XID journaled")
        clock.advance(3 * 3600)  # older than the retention now, and the hourly purge is due
        d.refresh()
        assert d.journal.events() == [] and xid_count(d, 31) == 1, "the event goes, the counter stays"
    finally:
        d.stop()


def test_a_fault_whose_two_reports_straddle_a_restart_is_counted_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    before = EventPipeline(journal, boot_id="b1", gpus=lambda: GPUS, on_events=lambda _: None, clock=lambda: 100.0)
    before.process([driver(1, 79, 100.0)])  # the driver's report, then the daemon stops
    seen: list[Event] = []
    after = EventPipeline(journal, boot_id="b1", gpus=lambda: GPUS, on_events=seen.extend, clock=lambda: 103.0)
    after.resume()
    after.process([line(1, 101.0, XID79_GPU1)])  # the kernel's line, read after the restart
    assert after.stats.merged == 1 and [t.count for t in journal.totals()] == [1]
    (stored,) = journal.events()
    assert stored.sources == "kmsg,nvml" and stored.pid == 77 and [e.id for e in seen] == [stored.id]


def test_a_journal_that_refuses_writes_holds_the_batch_until_it_goes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: nothing read is dropped, the cursor does not move, and it is all counted once later."""
    monkeypatch.setattr(pipeline_module, "_RETRY_SECONDS", (0.01,))
    p, seen = pipeline(tmp_path)
    real = p.journal.record
    refusals = 5

    def full_disk(*args: Any, **kwargs: Any) -> list[Event]:
        nonlocal refusals
        if refusals:
            refusals -= 1
            with p.journal._transaction(None):  # fails inside SQLite as a full disk does
                raise sqlite3.OperationalError("database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(p.journal, "record", full_disk)
    p.start()
    try:
        commit = p.from_kernel("kmsg:b1", [Record(1, 10.0, XID79_GPU1)])
        assert commit.wait(5.0) and commit.stored
        assert p.journal.stats.write_errors == 5 and p.journal.stats.up
        assert [t.count for t in p.journal.totals()] == [1] and len(seen) == 1
        assert p.journal.cursor("kmsg:b1") == Cursor("kmsg:b1", 1)
    finally:
        p.stop()


def test_stopping_gives_up_a_batch_the_journal_keeps_refusing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_module, "_RETRY_SECONDS", (0.01,))
    p, _ = pipeline(tmp_path)
    refused = threading.Semaphore(0)

    def full_disk(*args: Any, **kwargs: Any) -> list[Event]:
        refused.release()
        with p.journal._transaction(None):
            raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(p.journal, "record", full_disk)
    p.start()
    commit = p.from_kernel("kmsg:b1", [Record(1, 10.0, XID79_GPU1)])
    for _ in range(3):
        assert refused.acquire(timeout=5), "the journal is tried again"
    assert not commit.wait(0), "held while the journal refuses it, three tries in"
    assert not p.journal.stats.up and "disk is full" in (p.journal.stats.error or "")
    p.stop()
    assert commit.wait(5.0) and not commit.stored
    assert p.journal.cursor("kmsg:b1") is None, "read again at the next start"


def test_lines_the_code_cannot_process_are_skipped_not_retried_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, _ = pipeline(tmp_path)
    real = p._parser.feed

    def feed(text: str, line: int, kernel: bool | None = None) -> list[Any]:
        if "poison" in text:
            raise ValueError("a line the parser was never meant to see")
        return real(text, line, kernel)

    monkeypatch.setattr(p._parser, "feed", feed)
    p.start()
    try:
        # An Xid 79 and then the line the code trips on, in one batch: the batch is skipped.
        bad = p.from_kernel("kmsg:b1", [Record(1, 10.0, XID79_GPU1), Record(2, 10.1, "NVRM: poison")])
        assert bad.wait(5.0) and bad.stored, "the reader moves on"
        assert p.journal.cursor("kmsg:b1") == Cursor("kmsg:b1", 2) and p.stats.failed_batches == 1
        # NVML's report of that Xid 79 is not swallowed by a kernel report that was never journaled.
        p.from_driver([DriverXid(1, 79, 10.5)], "nvml")
        good = p.from_kernel("kmsg:b1", [Record(3, 11.0, "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, y")])
        assert good.wait(5.0) and good.stored
        assert p.idle.wait(5.0) and sorted(e.code for e in p.journal.events()) == [13, 79]
    finally:
        p.stop()


def test_a_corrupt_journal_moved_aside_keeps_its_place_in_the_kernel_log(tmp_path: Path) -> None:
    """Stop the daemon, let the kernel log five Xid 74s, clobber the journal's header (what a crash of the disk or a
    stray write does), start it: the journal is moved aside, and the five XIDs are still counted, once."""
    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text("Dec  1 13:00:00 node kernel: booted\n")  # a plain file: without a cursor, read from its end
    d = start_daemon(tmp_path, "boot-1", kmsg)
    d.stop()
    with kmsg.open("a") as f:
        f.writelines(
            f"Dec  1 13:0{i}:00 node kernel: NVRM: Xid (PCI:0000:18:00): 74, pid=1, name=x, NVLink: link {i}\n"
            for i in range(5)
        )
    journal = tmp_path / "journal.sqlite3"
    with journal.open("r+b") as f:
        f.write(b"\xde\xad\xbe\xef" * 25)  # the first 100 bytes: SQLite's header
    d = start_daemon(tmp_path, "boot-1", kmsg)
    try:
        wait_for(lambda: xid_count(d, 74) >= 5, timeout=10, interval=0.02, what="5 XIDs counted")
        assert d.pipeline.idle.wait(5) and xid_count(d, 74) == 5
        assert d.journal.stats.moved_aside == 1 and list(tmp_path.glob("journal.sqlite3.corrupt-*"))
    finally:
        d.stop()


def test_distinct_bus_ids_are_bounded_and_the_rest_counted_together(tmp_path: Path) -> None:
    """XIDs on thousands of bus ids that are no GPU of the node (a corrupt log, another machine's): the first
    MAX_UNKNOWN_DEVICES are kept apart, every other one counts under OTHER_DEVICES, and nothing is dropped."""
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    d = start_daemon(tmp_path, "boot-1", kmsg)
    buses = [f"{domain:04x}:{bus:02x}:00" for domain in range(1, 13) for bus in range(256)][:3000]
    try:
        with kmsg.open("a") as f:
            for n, bus in enumerate(buses):
                if n % 3 == 0:  # some bound by the kernel to a GPU the driver does not list
                    f.write(f"NVRM: GPU at PCI:{bus}: GPU-{n:08x}-0000-4000-8000-000000000000\n")
                f.write(f"NVRM: Xid (PCI:{bus}): 43, pid=1, name=x, Ch 00000010\n")
        wait_for(
            lambda: sum(t.count for t in d.journal.totals()) >= len(buses),
            timeout=30,
            interval=0.05,
            what="all counted",
        )
        d.refresh()
        totals = d.journal.totals()
        apart = {t.pci_bus_id for t in totals} - {pipeline_module.OTHER_DEVICES}
        assert len(apart) == pipeline_module.MAX_UNKNOWN_DEVICES
        other = [t for t in totals if t.pci_bus_id == pipeline_module.OTHER_DEVICES]
        assert sum(t.count for t in other) == len(buses) - pipeline_module.MAX_UNKNOWN_DEVICES
        page = d.metrics.text.decode()
        assert len([row for row in page.splitlines() if row.startswith("nvidia_gpu_xid_errors_total{")]) <= 65
        assert len(page) < 300 * 1024
        assert len(d.diagnosis().body()["findings"]) <= pipeline_module.MAX_UNKNOWN_DEVICES + 1
    finally:
        d.stop()
