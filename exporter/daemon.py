"""The running daemon: the backend, the poller and the rendered metrics, wired together."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client.core import Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from exporter.backends.base import GpuBackend
from exporter.exposition import MetricsCache
from exporter.metrics import daemon_families, gpu_families
from exporter.poller import FAST, Poller
from exporter.settings import Settings
from exporter.snapshot import Snapshot

log = logging.getLogger(__name__)


class Daemon:
    def __init__(
        self, backend: GpuBackend, settings: Settings, clock: Callable[[], float] = time.time
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.clock = clock
        self.metrics = MetricsCache()
        self.poller = Poller(
            backend,
            interval=settings.collector_interval,
            slow_interval=settings.collector_slow_interval,
            timeout=settings.read_timeout,
            clock=clock,
            on_snapshot=lambda _: self.refresh(),
        )
        # The daemon's own process_* and python_* metrics, kept in a registry of their own.
        self._own: CollectorRegistry | None = None
        if not settings.web_disable_exporter_metrics:
            self._own = CollectorRegistry()
            for own in (ProcessCollector, PlatformCollector, GCCollector):
                own(registry=self._own)
        self._render_lock = threading.Lock()

    @property
    def snapshot(self) -> Snapshot:
        return self.poller.snapshot

    def start(self) -> None:
        """Find the GPUs and take the first snapshot; then poll in the background."""
        self.poller.start()
        gpus = self.snapshot.gpus
        log.info(
            "started",
            extra={"backend": self.backend.name, "gpus": len(gpus), "up": sum(g.up for g in gpus)},
        )

    def stop(self) -> None:
        self.poller.stop()
        self.backend.close()

    def refresh(self) -> None:
        """Render /metrics again: a new snapshot (or, later, a new event) changed what it says."""
        with self._render_lock:
            snapshot = self.snapshot
            families: list[Metric] = [*gpu_families(snapshot), *daemon_families(snapshot)]
            if self._own is not None:
                families.extend(self._own.collect())
            self.metrics.update(families)

    def poll_soon(self) -> None:
        """Read the fast fields now, in the background (after a simulated fault, say)."""
        threading.Thread(target=self.poller.poll, args=(FAST,), name="poll-now", daemon=True).start()

    def alive(self) -> bool:
        """The poll loop is turning (polls never block on the driver, so a stale loop is a bug)."""
        last = self.poller.last_poll_monotonic
        limit = 3 * self.settings.collector_interval + self.settings.read_timeout + 5.0
        return last is not None and time.monotonic() - last < limit

    def readiness(self) -> str | None:
        """None when ready to be scraped; otherwise why not."""
        snapshot = self.snapshot
        if not snapshot.taken_at:
            return "no snapshot yet"
        if not snapshot.backend_up:
            return f"the {snapshot.backend} backend is failing"
        age = self.clock() - snapshot.taken_at
        if age > 3 * self.settings.collector_interval + self.settings.read_timeout:
            return f"the last snapshot is {age:.0f}s old"
        return None
