"""The driver's XID events (NVML's event API, or the simulator's), read in a thread of their own."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from gpu_triage.exporter.backends.base import DriverXid, XidEventSource
from gpu_triage.exporter.worker import Worker

log = logging.getLogger(__name__)

# How long one wait blocks in the driver. NVML's wait cannot be interrupted, so this is how long stop() may take
# (the event set must not be freed under a waiter): well inside systemd's TimeoutStopSec. Each return costs a
# Python round trip, so a quiet node pays for one a second.
_WAIT_SECONDS = 1.0
_FIRST_WAIT_SECONDS = 0.05  # the first one is short: until it returns, the verdict does not know the source works
_RETRY_SECONDS = 5.0


@dataclass
class DriverEventStats:
    up: bool = False
    error: str | None = None


class DriverEvents:
    def __init__(
        self,
        backend: XidEventSource,
        name: str,
        deliver: Callable[[list[DriverXid], str], None],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.stats = DriverEventStats()
        self._backend = backend
        self._deliver = deliver
        self._on_change = on_change  # called when the source starts or stops working
        self._wait = _FIRST_WAIT_SECONDS
        self._worker = Worker(f"{self.name}-events", self._turn)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop(timeout=2)

    def _turn(self) -> None:
        try:
            xids = self._backend.wait_xids(self._wait)
        except Exception as e:  # a broken event API must not take the daemon with it
            changed = self.stats.error != repr(e)
            if changed:
                log.error("driver XID events failed; retrying", extra={"source": self.name, "error": repr(e)})
            self.stats.up, self.stats.error = False, repr(e)
            if changed:
                self._on_change()
            self._worker.stopping.wait(_RETRY_SECONDS)
            return
        self._wait = _WAIT_SECONDS
        if self.stats.error is not None:
            log.info("driver XID events work again", extra={"source": self.name})
        changed = not self.stats.up
        self.stats.up, self.stats.error = True, None
        if changed:
            self._on_change()
        if xids:
            self._deliver(xids, self.name)
