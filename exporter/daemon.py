"""The running daemon: backend, poller, XID sources and journal, and the rendered metrics, wired together."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.knowledge import cache as knowledge
from gpu_triage.diagnosis.performance.data import load_performance
from gpu_triage.diagnosis.performance.engine import PerformanceReport
from gpu_triage.diagnosis.xid.node_verdict import Blind, NodeVerdict
from gpu_triage.exporter.backends.base import GpuBackend, XidEventSource
from gpu_triage.exporter.cache_store import store_from_env
from gpu_triage.exporter.http.api_models import Diagnosis
from gpu_triage.exporter.metrics.exposition import MetricsCache
from gpu_triage.exporter.metrics.gpu import GpuFamilies, daemon_families
from gpu_triage.exporter.metrics.performance import performance_families
from gpu_triage.exporter.metrics.verdicts import verdict_families
from gpu_triage.exporter.metrics.workloads import workload_families
from gpu_triage.exporter.metrics.xid import journal_families, source_families, xid_families
from gpu_triage.exporter.performance import Performance, performance_json
from gpu_triage.exporter.polling.poller import Poller
from gpu_triage.exporter.polling.snapshot import Snapshot
from gpu_triage.exporter.settings import DEV_KMSG, Settings
from gpu_triage.exporter.sources.driver_events import DriverEvents
from gpu_triage.exporter.sources.journal import Event, Journal, Mark, Total
from gpu_triage.exporter.sources.kmsg import KmsgFollower, boot_time
from gpu_triage.exporter.sources.pipeline import EventPipeline
from gpu_triage.exporter.verdict_report import diagnosis_json, summary
from gpu_triage.exporter.verdicts import Verdicts
from gpu_triage.exporter.workloads.tracker import ByGpu, Workloads

log = logging.getLogger(__name__)
JOURNAL_FILE = "journal.sqlite3"
PURGE_EVERY_SECONDS = 3600.0
_SETTLE_SECONDS = 2.0  # at most this long at start for the XID sources to open what they read


@dataclass(frozen=True, slots=True)
class Frame:
    """What one render of /metrics describes: a snapshot, who used its GPUs, and the verdict made from them."""

    snapshot: Snapshot
    node: NodeVerdict
    workloads: ByGpu
    performance: PerformanceReport = field(default_factory=PerformanceReport)  # beside the verdict, never in it


class Families:
    """client_python's collector protocol over a function that builds families afresh on each render."""

    def __init__(self, build: Callable[[], Iterable[Metric]]) -> None:
        self._build = build

    def collect(self) -> Iterable[Metric]:
        return self._build()


def _workloads(by_gpu: ByGpu) -> dict[str, tuple[Workload, ...]]:
    return {uuid: tuple(a.workload for a in found) for uuid, found in by_gpu.items()}


def _declared(backend: GpuBackend) -> Callable[[], Mapping[int, tuple[Workload, ...]]] | None:
    """The simulator's own pods and jobs (its scenario names them), by GPU index; None for a real backend."""
    found = getattr(backend, "declared_workloads", None)
    return found if callable(found) else None


def kernel_log(settings: Settings, backend: str) -> Path:
    """The kernel log to follow: --kmsg.path, else /dev/kmsg; but unless told, the simulator's node has a kernel log
    of its own, a file in the state directory (append the driver's lines to it), not this machine's."""
    if settings.kmsg_path is not None:
        return settings.kmsg_path
    if backend != "sim":
        return DEV_KMSG
    path = settings.state_dir / "kmsg.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError:
        pass  # the reader says it cannot read it, and the verdict that it is incomplete
    return path


def read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


class Daemon:
    def __init__(
        self,
        backend: GpuBackend,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        boot_id: str | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.store = store_from_env()  # the checked data and the compiled log scan, between restarts
        self.clock = clock  # wall-clock time: what the daemon reports
        self.monotonic = monotonic  # how old things are: unmoved when the wall clock is set
        self.boot_id = boot_id or read_boot_id()
        self.metrics = MetricsCache()
        self.poller = Poller(
            backend,
            interval=settings.collector_interval,
            slow_interval=settings.collector_slow_interval,
            timeout=settings.read_timeout,
            clock=clock,
            monotonic=monotonic,
            on_snapshot=lambda _: self.refresh(),
        )
        self.journal = Journal(settings.state_dir / JOURNAL_FILE)
        self.verdicts = Verdicts(self.journal, self.boot_id)
        self.journal.on_marks = self.verdicts.add_marks
        self.pipeline = EventPipeline(
            self.journal, boot_id=self.boot_id, gpus=lambda: self.poller.gpus, on_events=self._on_events, clock=clock
        )
        self.kmsg: KmsgFollower | None = None
        if settings.source_kmsg:
            self.kmsg = KmsgFollower(
                kernel_log(settings, backend.name),
                self.pipeline.from_kernel,
                cursor=self.journal.cursor,
                boot_id=self.boot_id,
                boot_time=boot_time,
                clock=clock,
                on_change=self._source_changed,
            )
        self.driver_events: DriverEvents | None = None
        if settings.source_events and isinstance(backend, XidEventSource) and backend.reports_xids:
            self.driver_events = DriverEvents(
                backend, backend.name, self.pipeline.from_driver, on_change=self._source_changed
            )
        self._sources_moved = threading.Event()  # a source started or stopped working
        # Who uses each GPU (Kubernetes pods, Slurm jobs); a new pod mapping is on /metrics at once.
        self.workloads = Workloads(settings, on_change=self.refresh, clock=clock, declared=_declared(backend))
        # Why jobs are slow and what they cost: a bad thresholds file fails here, at start-up.
        self.performance = Performance(load_performance(), settings.performance_window, settings.performance_node_role)
        # Everything /metrics shows, in page order; a new producer of families registers here.
        self.registry = CollectorRegistry(auto_describe=False)
        self._frame = Frame(self.snapshot, self.verdicts.node, {})
        gpu_page = GpuFamilies()  # keeps the lines of the readings that did not change, for the next page
        for build in (
            lambda: gpu_page.build(self._frame.snapshot),
            lambda: workload_families(self._frame.snapshot, self._frame.workloads, self.workloads),
            lambda: performance_families(self._frame.snapshot, self._frame.performance, self.performance.accounts),
            lambda: xid_families(self.xid_totals()),
            lambda: verdict_families(self._frame.snapshot, self._frame.node),
            lambda: daemon_families(self._frame.snapshot),
            self._source_families,
            lambda: journal_families(self.journal.stats),
        ):
            self.registry.register(Families(build))
        if not settings.web_disable_exporter_metrics:  # the daemon's own process_* and python_* metrics
            for own in (ProcessCollector, PlatformCollector, GCCollector):
                own(registry=self.registry)
        self._render_lock = threading.Lock()
        self._purged_at = float("-inf")
        self._stopped = False
        self._started = False
        self._resumed = False  # the journal is open and the XID history loaded
        self._sources_started = False

    @property
    def snapshot(self) -> Snapshot:
        return self.poller.snapshot

    def start(self) -> None:
        """Check the diagnosis data (DataError lists every problem), find the GPUs, take the first snapshot,
        then poll and follow the XID sources in the background. The checked data comes from the cache
        when it holds this version's (diagnosis/knowledge/cache.py)."""
        knowledge.load(self.store)
        self.poller.discover()
        with self._render_lock:
            self._started = True
            self._resume_xids()  # when the journal cannot be opened (a full disk), each render tries again
        # The first snapshot before the first XID: a verdict made without one would take every GPU with XID
        # history for a GPU the driver does not list, and call it lost.
        self.poller.start()
        with self._render_lock:
            self._start_sources()
        self._settle_sources()
        self.workloads.start()
        gpus = self.snapshot.gpus
        log.info(
            "started",
            extra={
                "backend": self.backend.name,
                "why": self.backend.why,
                "gpus": len(gpus),
                "up": sum(g.up for g in gpus),
                "boot": self.boot_id,
            },
        )

    def _resume_xids(self) -> None:
        """Once the journal opens: retention, the XID history into the verdicts, and the pipeline that
        journals new events. Until then the node reports GPU telemetry and `gpu_triage_journal_up 0`."""
        if self._resumed or not self.journal.open():
            return
        try:
            self.pipeline.resume()
            self.verdicts.load(self.clock())
        except sqlite3.Error:  # opened, then failed to read: the next render tries again
            log.warning("cannot read the event journal; trying again", exc_info=True)
            return
        self._purge_now_and_then(self.clock())
        self.pipeline.start()
        self._resumed = True

    def _start_sources(self) -> None:
        """The XID sources read on from their cursors in the journal, so they wait for it."""
        if self._resumed and not self._sources_started and self.snapshot.taken_at:
            for source in (self.kmsg, self.driver_events):
                if source is not None:
                    source.start()
            self._sources_started = True

    def _source_changed(self) -> None:
        """A source began or stopped working: the verdict's completeness changed, so render it now."""
        self._sources_moved.set()
        self.refresh()

    def _settle_sources(self) -> None:
        """Give the sources just started a moment to open what they read, so that the first verdict a client
        gets says whether they work rather than that they have not been tried yet."""
        deadline = self.monotonic() + _SETTLE_SECONDS
        while any(b.starting for b in self.incomplete()) and self.monotonic() < deadline:
            self._sources_moved.wait(0.05)
            self._sources_moved.clear()
        self.refresh()

    def stop(self) -> None:
        """Stop reading, let the journal finish what is queued, then let go of the driver."""
        with self._render_lock:
            self._started = False  # a render from now on must not start the XID path (a journal just opened)
        self.workloads.stop()
        for source in (self.kmsg, self.driver_events):
            if source is not None:
                source.stop()
        self.pipeline.stop()
        self.poller.stop()
        with self._render_lock:
            self._stopped = True  # a late render (a poll started by a fault) must not use the journal
            self.journal.close()
        self.backend.close()

    def _purge_now_and_then(self, now: float) -> None:
        """Retention by age, applied hourly: the daemon runs for months."""
        if now - self._purged_at >= PURGE_EVERY_SECONDS and self.journal.is_open:
            self._purged_at = now
            try:
                self.journal.purge(now - self.settings.journal_retention)
            except sqlite3.Error:  # a full disk: the journal says so (journal_up); try again in an hour
                log.warning("journal retention could not be applied; trying again later", exc_info=True)

    def _on_events(self, events: list[Event]) -> None:
        for event in events:
            self.verdicts.add(event)
        # A new XID is on /metrics, and in the verdict, now, not at the next poll.
        self.refresh()

    def xid_totals(self) -> list[Total]:
        """Every GPU's XID counts; none while the journal cannot be opened (the counters are absent, not 0)."""
        if not self.journal.is_open:
            return []
        try:
            return self.journal.totals()
        except sqlite3.Error:  # a read that fails now and then must not cost the render
            log.warning("cannot read the XID totals from the journal", exc_info=True)
            return []

    def acknowledge(self, uuid: str, note: str) -> None:
        """An operator says the GPU's XID findings so far are dealt with."""
        self.journal.mark(Mark(self.clock(), uuid, "acknowledged", note))
        self.refresh()

    def diagnosis(self) -> Diagnosis:
        frame = self._frame  # one render's snapshot and verdict: the API and /metrics never disagree
        body = diagnosis_json(frame.snapshot, frame.node, self.boot_id, self.clock(), _workloads(frame.workloads))
        body.performance = performance_json(frame.performance, self.settings.performance_window)
        return body

    def status_line(self) -> str:
        frame = self._frame
        return summary(frame.snapshot, frame.node)

    def refresh(self) -> None:
        """A new snapshot or a new event changed what /metrics says: make the verdict now, and let the next scrape
        build the page from it."""
        with self._render_lock:
            if self._stopped:
                return
            if self._started and not self._resumed:
                self._resume_xids()
                self._start_sources()
            snapshot = self.snapshot
            now = self.clock()
            self._purge_now_and_then(now)
            by_gpu = self.workloads.current(snapshot)
            found = _workloads(by_gpu)
            by_bus = {g.identity.pci_bus_id: found.get(g.identity.uuid, ()) for g in snapshot.gpus}
            node = self.verdicts.update(
                snapshot, now, by_bus, settled=self.workloads.settled, incomplete=self.incomplete()
            )
            self.performance.observe(snapshot, by_gpu)
            self._frame = Frame(snapshot, node, by_gpu, self.performance.report)
            self.metrics.update(self._build_page)  # built when a scrape asks, from the frame current then
            self.verdicts.node = node

    def _build_page(self) -> list[Metric]:
        """Every family of /metrics, from the last frame; under the render lock, so that the journal is not closed
        while its totals are read."""
        with self._render_lock:
            return list(self.registry.collect())

    def incomplete(self) -> list[Blind]:
        """The sources the verdict depends on that cannot be read now: while one is down, the daemon would miss
        the next XID, and its verdict says so instead of calling the node healthy."""
        if not self.journal.stats.up or not self.journal.is_open:
            # The XID sources read on from cursors in the journal: until it opens, they wait for it.
            error = self.journal.stats.error
            return [Blind("journal", error or "the event journal is not open yet", starting=error is None)]
        out = []
        if self.kmsg is not None and not self.kmsg.stats.up:
            error = self.kmsg.stats.error
            out.append(Blind("kmsg", error or f"{self.kmsg.path} has not been read yet", starting=error is None))
        events = self.driver_events
        if events is not None and not events.stats.up:
            error = events.stats.error
            what = "the driver's XID events have not been read yet"
            out.append(Blind(events.name, error or what, starting=error is None))
        if self.kmsg is None and events is None:
            out.append(Blind("xid", "the kernel log is not read (--no-source.kmsg) and no driver events are"))
        # What the GPUs say counts as much: a backend that fails, or a poll loop that stopped, would keep showing
        # the last readings' verdict, healthy as it may be.
        snapshot = self.snapshot
        if snapshot.taken_at and not snapshot.backend_up:
            out.append(Blind("backend", f"the {snapshot.backend} backend fails: {snapshot.backend_problem}"))
        elif snapshot.taken_at and (age := self.monotonic() - snapshot.taken_monotonic) > self.stale_after:
            out.append(Blind("backend", f"the last GPU readings are {age:.0f}s old"))
        return out

    @property
    def frame(self) -> Frame:
        """What the last render of /metrics showed; pages that show a verdict read it from here."""
        return self._frame

    @property
    def gpu_workloads(self) -> ByGpu:
        """Who used each GPU (by uuid) at the last render."""
        return self._frame.workloads

    def _source_families(self) -> Iterable[Metric]:
        return source_families(
            self.kmsg.stats if self.kmsg else None,
            self.driver_events.stats if self.driver_events else None,
            self.backend.name,
            self.pipeline.stats,
        )

    def poll_soon(self) -> None:
        """Read the fast fields now, in the background (after a simulated fault, say)."""
        self.poller.poll_now()

    @property
    def stale_after(self) -> float:
        """Seconds after which the last poll counts as stale: three missed intervals and a hung read."""
        return 3 * self.settings.collector_interval + self.settings.read_timeout

    def alive(self) -> bool:
        """The poll loop is turning (polls never block on the driver, so a stale loop is a bug)."""
        last = self.poller.last_poll_monotonic
        return last is not None and self.monotonic() - last < self.stale_after + 5.0

    def readiness(self) -> str | None:
        """None when ready to be scraped; otherwise why not."""
        snapshot = self.snapshot
        if not snapshot.taken_at:
            return "no snapshot yet"
        if not snapshot.backend_up:
            return f"the {snapshot.backend} backend is failing: {snapshot.backend_problem}"
        if not self.journal.stats.up:
            return f"the event journal cannot be written ({self.journal.stats.error})"
        age = self.monotonic() - snapshot.taken_monotonic
        if age > self.stale_after:
            return f"the last snapshot is {age:.0f}s old"
        # A source that fails, not one still opening what it reads (the verdict says that one, for a moment).
        if blind := [b for b in self.incomplete() if not b.starting]:
            return "the verdict is incomplete: " + "; ".join(f"{b.source}: {b.problem}" for b in blind)
        return None
