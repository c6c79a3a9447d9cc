"""The XID path: kernel-log records and driver events in, journaled events out.

Two kinds of source report XIDs: the kernel log (/dev/kmsg or a file: rich text, replayable) and
the driver's event API (NVML events, or the simulator's injection: immediate, but no history).
Both feed one queue, drained by one thread that maps each event to its GPU, merges the same fault
reported by both kinds of source into one event, journals the batch in one transaction and tells
the daemon what is new. One thread means the kernel-log parser's state (messages that span lines)
and the merge window need no locks.

Nothing read is lost to a journal that cannot be written (a full disk): the batch, already parsed
and merged, is kept and written again until it goes in, and the kernel-log reader waits for each of
its batches to be committed before it reads on, so the cursor only ever moves past what is stored.
The merge window starts with the journal's latest events, so a fault whose two reports straddle a
restart is still counted once.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gpu_triage.diagnosis.xid.incidents import COMPUTE_INSTANCE, GPU_INSTANCE
from gpu_triage.diagnosis.xid.kernel_log import SYNTHESIZED, EventKind, KernelEvent
from gpu_triage.diagnosis.xid.kernel_parser import KernelLogParser, ScanStats
from gpu_triage.diagnosis.xid.node_verdict import OTHER_DEVICES
from gpu_triage.exporter.backends.base import DriverXid, GpuIdentity
from gpu_triage.exporter.sources.journal import Cursor, Event, Journal, Mark
from gpu_triage.exporter.sources.records import Record
from gpu_triage.exporter.worker import Worker

log = logging.getLogger(__name__)

# A fault seen by both the kernel log and the driver's events arrives within this many seconds twice.
MERGE_WINDOW_SECONDS = 10.0
_MAX_WAITING = 10_000  # per (kind, GPU, code): a storm beyond this merges less, never slower
# Bus ids a kernel log bound to a UUID: a node has a few dozen; a hostile or corrupt log cannot grow it past this.
_MAX_BOUND = 1024
# Bus ids of XIDs (or SXIDs) on devices that are none of the node's GPUs, kept apart: the first ones are; the rest
# count together under OTHER_DEVICES, so that every table keyed by bus id downstream stays this small.
MAX_UNKNOWN_DEVICES = 64
_KERNEL = "kmsg"
_RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)  # between attempts to write a batch the journal refused


class Commit:
    """Set once the batch it was handed out with is in the journal (or the pipeline stopped without it)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.stored = False

    def settle(self, stored: bool) -> None:
        self.stored = stored
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once settled."""
        return self._done.wait(timeout)


@dataclass(frozen=True, slots=True)
class KernelBatch:
    """Records of one kernel log, in order (see KmsgFollower), and where the reader stands after them."""

    origin: str
    records: Sequence[Record]
    mark: str = ""  # a followed file's place, stored with the cursor (see logfile.FileMark)
    seq: int | None = None  # the cursor's seq when there are no records: a place noted before any line
    commit: Commit = field(default_factory=Commit)

    @property
    def cursor(self) -> Cursor | None:
        if self.records:
            return Cursor(self.origin, self.records[-1].seq, self.mark)
        return None if self.seq is None else Cursor(self.origin, self.seq, self.mark)


@dataclass(frozen=True, slots=True)
class DriverBatch:
    """XIDs from the driver's event API."""

    source: str  # the backend that reported them: nvml, sim
    xids: Sequence[DriverXid]


Batch = KernelBatch | DriverBatch


@dataclass
class PipelineStats:
    merged: int = 0  # reports folded into an event another source had already given
    kmsg_lines: int = 0
    failed_batches: int = 0  # batches that could not be processed, skipped
    parse: ScanStats = field(default_factory=ScanStats)


class EventPipeline:
    def __init__(
        self,
        journal: Journal,
        *,
        boot_id: str,
        gpus: Callable[[], Sequence[GpuIdentity]],
        on_events: Callable[[list[Event]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.journal = journal
        self.boot_id = boot_id
        self.stats = PipelineStats()
        self._gpus = gpus
        self._on_events = on_events
        self._queue: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._parser = KernelLogParser(self.stats.parse)
        # PCI bus id -> uuid, from the kernel log's binding lines; those before the cursor are in the
        # journal as "init" marks (see `resume`), so a restart still names a GPU the driver no longer lists.
        self._bound: dict[str, str] = {}
        self._unknown: dict[str, set[str]] = {"xid": set(), "sxid": set()}  # bus ids kept apart, by kind
        self._marks: list[Mark] = []  # this batch's, journaled with it
        # Reports waiting for the other kind of source to report them too, by (kind, gpu, code).
        self._waiting: dict[tuple[str, str, int], tuple[deque[_Slot], deque[_Slot]]] = {}
        # The latest Xid-less "fallen off the bus" event of each GPU: its Xid 79 line may follow in a later batch.
        self._fallen: dict[tuple[str, str, int], _Slot] = {}
        self._newest = float("-inf")  # the time of the newest report seen: older ones wait this long for a twin
        self._clock = clock
        # Its loop ends on the sentinel stop() queues, not on stop() itself: what was queued before is journaled.
        self._worker = Worker("event-pipeline", self._turn)
        self._unfinished = 0  # batches queued and not yet journaled
        self._count_lock = threading.Lock()
        self.idle = threading.Event()  # set while nothing is queued or in progress (tests wait on it)
        self.idle.set()

    # -- feeding (any thread) ------------------------------------------------------------------

    def from_kernel(self, origin: str, records: list[Record], mark: str = "", seq: int | None = None) -> Commit:
        """`records` of the kernel log `origin` (see KmsgFollower), in order; settled once journaled."""
        batch = KernelBatch(origin, records, mark, seq)
        self._put(batch)
        return batch.commit

    def from_driver(self, xids: list[DriverXid], source: str) -> None:
        if xids:
            self._put(DriverBatch(source, xids))

    def _put(self, batch: Batch) -> None:
        with self._count_lock:
            self._unfinished += 1
            self.idle.clear()
        self._queue.put(batch)

    def resume(self) -> None:
        """Pick up from the journal what the last run left: GPU bindings, and the events whose twin report may
        still come. Before `start`; the journal must be open."""
        marks, recent = self.journal.marks(), self.journal.events(since=self._clock() - MERGE_WINDOW_SECONDS)
        totals = self.journal.totals()
        self._bound = {}
        for m in marks:  # oldest first: the newest bindings are the ones kept
            if m.kind == "init":
                self._bind(m.note, m.uuid)
        self._unknown = {"xid": set(), "sxid": set()}
        for t in sorted(totals, key=lambda t: -t.last_seen):  # the devices counted apart so far stay apart
            if not t.uuid and t.pci_bus_id and t.kind in self._unknown:
                self._device(t.kind, t.pci_bus_id)
        self._waiting.clear()  # read again from the start when an earlier try failed half-way
        self._fallen.clear()
        for event in recent:
            if "," not in event.sources:  # one kind of source so far: its twin may still come
                self._add(event, [], [])

    def start(self) -> None:
        """Journal what comes in, on a thread of its own; `resume` first."""
        self._worker.start()

    def stop(self) -> None:
        """Finish what is queued (a journal write in flight completes), then stop; a journal that keeps
        refusing writes is given up on: what it did not store is read again at the next start."""
        self._stopping.set()
        self._queue.put(None)
        self._worker.join(timeout=10)

    # -- the pipeline thread -------------------------------------------------------------------

    def _turn(self) -> None:
        items = [self._queue.get()]
        while len(items) < 64:  # batch what is already queued: one transaction, one render
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if None in items:  # stop()'s sentinel: this turn, which journals everything queued before it, is the last
            self._worker.stopping.set()
        batches = [i for i in items if i is not None]
        stored = False
        try:
            self.process(batches)
            stored = True
        except sqlite3.Error:
            pass  # stopping while the journal refused the batch: it is read again at the next start
        except Exception:
            # Not the journal: something in these lines the code did not expect. Moving the cursor past
            # them costs their XIDs; not moving it would stop the kernel-log source for good.
            log.exception("event pipeline batch failed; skipping it")
            self.stats.failed_batches += 1
            self._forget_unstored()
            stored = self._skip(batches)
        _settle(batches, stored)
        with self._count_lock:
            self._unfinished -= len(batches)
            if self._unfinished == 0:
                self.idle.set()
        # Returning drops this batch before the next is waited for: a burst's lines do not stay in memory.

    def process(self, batches: Sequence[Batch]) -> list[Event]:
        """Journal one batch of source items; returns the new events (merged ones are not new).

        `on_events` hears of the new events and of journaled ones a second source made richer."""
        gpus = {g.pci_bus_id: g for g in self._gpus()}
        by_index = {g.index: g for g in gpus.values()}
        self._let_go()
        fresh: list[_Slot] = []
        enriched: list[_Slot] = []
        cursor: Cursor | None = None
        for batch in batches:
            if isinstance(batch, KernelBatch):
                records = batch.records
                cursor = batch.cursor or cursor
                for record in records:
                    self.stats.kmsg_lines += 1
                    for ke in self._parser.feed(record.text, record.seq, record.kernel):
                        self._add_kernel(ke, _record_of(ke, records, record), gpus, fresh, enriched)
                # The driver prints both reports of a GPU falling off the bus at once: whatever the parser
                # still holds back, waiting for the other one, is complete by the end of what was read.
                if records:
                    for ke in self._parser.flush():
                        self._add_kernel(ke, _record_of(ke, records, records[-1]), gpus, fresh, enriched)
            else:
                for xid in batch.xids:
                    self._add(self._from_driver(xid, batch.source, by_index), fresh, enriched)
        marks, self._marks = self._marks, []
        stored = self._store([slot.event for slot in fresh], cursor, marks, [slot.event for slot in enriched])
        for slot, event in zip(fresh, stored, strict=True):
            slot.event = event
        if stored or enriched:
            self._on_events(stored + [slot.event for slot in enriched])
        return stored

    def _store(self, events: list[Event], cursor: Cursor | None, marks: list[Mark], merges: list[Event]) -> list[Event]:
        """One transaction, tried until the journal takes it: parsing and merging are done and not redone."""
        for attempt in itertools.count():
            try:
                return self.journal.record(events, cursor, marks, merges)
            except sqlite3.Error:
                if self._stopping.is_set():
                    raise
                self._stopping.wait(_RETRY_SECONDS[min(attempt, len(_RETRY_SECONDS) - 1)])
        raise AssertionError("unreachable")  # for the type checker: count() never ends

    def _let_go(self) -> None:
        """Reports too old to be the twin of the newest one seen, of every GPU and code: a burst must not stay in
        memory until the next report of its own kind. The reports came in time order: each queue is cut at its front."""
        now = self._newest
        for key, queues in list(self._waiting.items()):
            for waiting in queues:
                while waiting and waiting[0].event.ts < now - MERGE_WINDOW_SECONDS:
                    waiting.popleft()
            if not any(queues):
                del self._waiting[key]
        for key, slot in list(self._fallen.items()):
            if slot.event.ts < now - MERGE_WINDOW_SECONDS:
                del self._fallen[key]

    def _forget_unstored(self) -> None:
        """Reports of a skipped batch were never journaled: their twins must not merge into them and vanish."""
        for key, queues in list(self._waiting.items()):
            for queue_ in queues:
                kept = [slot for slot in queue_ if slot.event.id]
                queue_.clear()
                queue_.extend(kept)
            if not any(queues):
                del self._waiting[key]
        self._fallen = {key: slot for key, slot in self._fallen.items() if slot.event.id}

    def _skip(self, batches: Sequence[Batch]) -> bool:
        cursors = [b.cursor for b in batches if isinstance(b, KernelBatch) and b.cursor is not None]
        try:
            self.journal.record([], cursors[-1] if cursors else None)
        except sqlite3.Error:
            return False
        return True

    def _add_kernel(
        self,
        ke: KernelEvent,
        record: Record,
        gpus: dict[str, GpuIdentity],
        fresh: list[_Slot],
        enriched: list[_Slot],
    ) -> None:
        event = self._from_kernel(ke, record, gpus)
        if event is not None:
            self._add(event, fresh, enriched)

    def _bind(self, bus: str, uuid: str) -> None:
        self._bound.pop(bus, None)  # newest last: the oldest binding is the one to forget
        self._bound[bus] = uuid
        if len(self._bound) > _MAX_BOUND:
            del self._bound[next(iter(self._bound))]

    def _device(self, kind: str, bus: str) -> str:
        """`bus` if it is kept apart (or can be, still), else OTHER_DEVICES."""
        kept = self._unknown[kind]
        if bus in kept or bus == OTHER_DEVICES:
            return bus
        if len(kept) < MAX_UNKNOWN_DEVICES:
            kept.add(bus)
            return bus
        return OTHER_DEVICES

    def _from_kernel(self, ke: KernelEvent, record: Record, gpus: dict[str, GpuIdentity]) -> Event | None:
        if ke.kind is EventKind.GPU_BINDING:
            if ke.pci_bus_id and ke.uuid:
                self._bind(ke.pci_bus_id, ke.uuid)
                # The driver prints this line when it brings the GPU up: before the GPU's first Xid of a
                # boot, and on some drivers after a reset. Marked, it closes what a reset cures.
                self._marks.append(Mark(record.ts, ke.uuid, "init", ke.pci_bus_id))
            return None
        if ke.code is None:
            return None
        bus = ke.pci_bus_id
        gpu = gpus.get(bus or "")
        uuid = gpu.uuid if gpu else self._bound.get(bus or "")
        if bus and gpu is None:  # a switch, or a device the driver does not list (even one the kernel bound)
            bus = self._device(ke.kind.value, bus)
            uuid = None if bus == OTHER_DEVICES else uuid
        return Event(
            ts=record.ts,
            boot_id=self.boot_id,
            sources=_KERNEL,
            kind=ke.kind.value,
            code=ke.code,
            text=ke.text,
            gpu_index=gpu.index if gpu and ke.kind is EventKind.XID else None,
            uuid=uuid if ke.kind is EventKind.XID else None,
            pci_bus_id=bus,
            pid=ke.pid,
            process=ke.process,
            kmsg_seq=record.seq,
            details=dict(ke.details),
        )

    def _from_driver(self, xid: DriverXid, source: str, gpus: dict[int, GpuIdentity]) -> Event:
        gpu = gpus.get(xid.gpu)
        text = f"Xid {xid.code}, {xid.message}" if xid.message else f"Xid {xid.code} reported by the {source} event API"
        details = dict(xid.extra)
        if xid.gpu_instance is not None:  # the driver attributes it to one MIG instance
            details[GPU_INSTANCE] = str(xid.gpu_instance)
            if xid.compute_instance is not None:
                details[COMPUTE_INSTANCE] = str(xid.compute_instance)
        return Event(
            ts=xid.timestamp,
            boot_id=self.boot_id,
            sources=source,
            kind="xid",
            code=xid.code,
            text=text,
            gpu_index=gpu.index if gpu else None,
            uuid=gpu.uuid if gpu else None,
            pci_bus_id=gpu.pci_bus_id if gpu else None,
            details=details,
        )

    def _add(self, event: Event, fresh: list[_Slot], enriched: list[_Slot]) -> None:
        """Append `event` to `fresh`, unless it is the other kind of source's report of an event we have
        (a journaled one is then updated: appended to `enriched`).

        Each (kind, GPU, code) keeps two time-ordered queues, of reports from the kernel log and from
        the driver, each waiting for its twin: a report looks only at the other queue's oldest entries,
        so a storm of XIDs costs constant time per report, not a scan of the window.
        """
        key = (event.kind, event.uuid or event.pci_bus_id or "", event.code)
        self._newest = max(self._newest, event.ts)
        if self._folded_into_fallen(key, event, enriched):
            return
        queues = self._waiting.setdefault(key, (deque(maxlen=_MAX_WAITING), deque(maxlen=_MAX_WAITING)))
        from_kernel = event.sources == _KERNEL
        # [0]: driver reports, [1]: kernel reports
        others, mine = (queues[0], queues[1]) if from_kernel else (queues[1], queues[0])
        for waiting in (others, mine):  # with one kind of source running, its own reports must go too
            while waiting and waiting[0].event.ts < event.ts - MERGE_WINDOW_SECONDS:
                waiting.popleft()  # too old to be anyone's twin now
        if others and abs(others[0].event.ts - event.ts) <= MERGE_WINDOW_SECONDS:
            slot = others.popleft()
            other = slot.event
            kernel, driver = (event, other) if from_kernel else (other, event)
            # The kernel's record is the richer one (text, pid, process, payload); keep it, with what only the
            # driver says (the MIG instance).
            slot.event = replace(
                kernel,
                sources=f"{_KERNEL},{driver.sources}",
                id=other.id,
                ts=min(event.ts, other.ts),
                details={**driver.details, **kernel.details},
            )
            self.stats.merged += 1
            if other.id:  # already journaled in an earlier batch (or before a restart)
                enriched.append(slot)
        else:
            slot = _Slot(event)
            if not event.id:
                fresh.append(slot)
            mine.append(slot)
        if event.details.get("synthesized") == SYNTHESIZED:
            self._fallen[key] = slot

    def _folded_into_fallen(self, key: tuple[str, str, int], event: Event, enriched: list[_Slot]) -> bool:
        """The kernel's Xid 79 line for a GPU whose Xid-less "fallen off the bus" message came first, in an earlier
        batch (the parser pairs the two within a batch): the same fault, already counted, now with its Xid line."""
        if event.sources != _KERNEL or event.code != 79 or event.details.get("synthesized") == SYNTHESIZED:
            return False
        slot = self._fallen.pop(key, None)
        if slot is None or abs(slot.event.ts - event.ts) > MERGE_WINDOW_SECONDS:
            return False
        slot.event = replace(event, sources=slot.event.sources, id=slot.event.id, ts=min(event.ts, slot.event.ts))
        self.stats.merged += 1
        if slot.event.id:
            enriched.append(slot)
        return True


def _settle(batches: Sequence[Batch], stored: bool) -> None:
    for batch in batches:
        if isinstance(batch, KernelBatch):
            batch.commit.settle(stored)


def _record_of(ke: KernelEvent, records: Sequence[Record], otherwise: Record) -> Record:
    """The record an event was made from: the parser may hand it out lines later (its time is that record's)."""
    if ke.line == otherwise.seq:
        return otherwise
    i = bisect.bisect_left(records, ke.line, key=lambda r: r.seq)
    return records[i] if i < len(records) and records[i].seq == ke.line else otherwise


@dataclass
class _Slot:
    """An event waiting for its twin; the journal's stored copy (with its id) replaces it in place."""

    event: Event
