"""The connection to the DCGM host engine: made at start, remade whenever it is lost, never given up.

When the host engine goes away (restarted, upgraded, killed), every call on the old connection fails
with DCGM_ST_CONNECTION_NOT_VALID, and DCGM does not reconnect by itself. The backend then reports
itself broken (`gpu_triage_backend_up 0`, each collector failing) with `status` saying what happened,
and the next reads try again: at once, then after 1, 2, 4… seconds, at most every 30 s. A read
during the back-off fails at once instead of waiting; one read at a time tries to connect, and the
others wait for its outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpu_triage.exporter.backends.base import BackendError
from gpu_triage.exporter.backends.dcgm.address import Address, unreachable
from gpu_triage.exporter.backends.dcgm.bindings import Bindings
from gpu_triage.exporter.backends.dcgm.session import Session

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_MS = 2000
MAX_BACKOFF_SECONDS = 30.0
_initialised: set[str] = set()  # dcgmInit once per process
_init_lock = threading.Lock()


class Connection:
    def __init__(
        self,
        b: Bindings,
        address: Address,
        *,
        interval: float,
        slow_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.b = b
        self.address = address
        self._intervals = (interval, slow_interval)
        self._clock = clock
        self._session: Session | None = None
        self._lock = threading.Lock()
        self._attempts = 0
        self._retry_at = 0.0
        self._lost_at: float | None = None
        self._lost_why = ""  # what the call that found it gone said
        self._why = ""  # what the last attempt to reconnect said
        self.connects = 0  # how many sessions were made: 1 at start, one more per reconnect

    def open(self) -> Session:
        """The first connection, at start: failing here is a start-up error, not something to retry."""
        with self._lock:
            self._session = self._connect()
            return self._session

    def session(self) -> Session:
        """The live session; reconnects when it is due. BackendError (saying why) while there is none."""
        live = self._session
        if live is not None:
            return live
        # Another read may be connecting right now: wait for it (a connect is bounded), then use its result.
        if not self._lock.acquire(timeout=CONNECT_TIMEOUT_MS / 1000 + 1.0):
            raise BackendError(self.status)
        try:
            if self._session is not None:
                return self._session
            if self._clock() < self._retry_at:
                raise BackendError(self.status)
            try:
                self._session = self._connect()
            except BackendError as e:
                self._attempts += 1
                self._why = str(e)
                self._retry_at = self._clock() + min(2.0 ** (self._attempts - 1), MAX_BACKOFF_SECONDS)
                raise BackendError(self.status) from e
            log.info("DCGM host engine is back", extra={"address": str(self.address), "attempts": self._attempts})
            self._attempts, self._lost_at = 0, None
            return self._session
        finally:
            self._lock.release()

    def lost(self, session: Session, err: BaseException) -> None:
        """A call on `session` found the host engine gone: drop the session, reconnect on a later read."""
        with self._lock:
            if self._session is not session:
                return  # another read already noticed
            self._session = None
            self._lost_at = self._clock()
            self._lost_why = self.b.describe(err)
            self._retry_at = 0.0
        log.error(
            "lost the DCGM host engine; reconnecting", extra={"address": str(self.address), "dcgm": self._lost_why}
        )
        session.close()

    def close(self) -> None:
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    @property
    def status(self) -> str:
        if self._session is not None:
            return f"connected to the DCGM host engine at {self.address}"
        if self._lost_at is None and not self._attempts:
            return f"not connected to the DCGM host engine at {self.address}"
        wait = max(0.0, self._retry_at - self._clock())
        tries = f"{self._attempts} attempt(s) failed ({self._why}), next in {wait:.0f}s" if self._attempts else "now"
        if self._lost_at is None:
            return f"cannot connect to the DCGM host engine at {self.address}; trying again: {tries}"
        ago = self._clock() - self._lost_at
        return f"lost the DCGM host engine at {self.address} {ago:.0f}s ago ({self._lost_why}); reconnecting: {tries}"

    def _connect(self) -> Session:
        if (why := unreachable(self.address)) is not None:
            raise BackendError(f"no DCGM host engine answers at {self.address} ({why})")
        initialise(self.b)
        target, unix = self.address.for_dcgm()
        params = self.b.connect_params(timeout_ms=CONNECT_TIMEOUT_MS, unix_socket=unix)
        try:
            handle = self.b.agent.dcgmConnect_v2(target, params)
        except self.b.structs.DCGMError as e:
            raise BackendError(f"cannot connect to the DCGM host engine at {self.address}: {self.b.describe(e)}") from e
        session = Session(self.b, handle)
        try:
            session.start(*self._intervals)
        except self.b.structs.DCGMError as e:
            session.close()
            raise BackendError(f"the DCGM host engine at {self.address} refused the setup: {self.b.describe(e)}") from e
        except Exception as e:  # bindings of another DCGM version: close, and back off like any failure
            session.close()
            raise BackendError(f"setting up DCGM watches at {self.address} failed: {e!r}") from e
        self.connects += 1
        return session


def initialise(b: Bindings) -> None:
    """Load libdcgm and initialise the client library: once per process."""
    with _init_lock:
        if str(b.path) in _initialised:
            return
        try:
            b.structs._dcgmInit()  # loads libdcgm.so.4 (.3 for DCGM 3) from the system's library paths
            b.agent.dcgmInit()
        except b.structs.DCGMError as e:
            raise BackendError(f"cannot load DCGM's library (libdcgm): {b.describe(e)}") from e
        _initialised.add(str(b.path))
