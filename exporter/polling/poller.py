"""The background poller: reads every GPU through the backend and publishes Snapshots.

Each (GPU, collector) read is a task of the read pool, whose one worker reads them in turn, and the
poll waits for all of them up to a deadline. At each eighth of it a poll not done writes off the reads
stuck in a call, so that another worker takes the queue on. A read that misses the deadline marks its
collector failed and that GPU hung; its stale values are dropped rather than served, the other reads
are used, and the next poll starts on time. A read that is still stuck at the next poll is not started
again, so a hung driver call costs one thread, not one per poll; once it returns, the next fast poll
reads that collector again, even a slow one, so the GPU is back within seconds.

Polls are scheduled on the monotonic clock: setting the wall clock (NTP stepping it, `date -s`) changes
the times reported, never when the next poll runs. A step is logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from types import MappingProxyType

from gpu_triage.diagnosis.core.actions import GpuStatus
from gpu_triage.exporter.backends.base import BackendError, GpuBackend, GpuIdentity, GpuLostError, Result
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import Reading
from gpu_triage.exporter.polling.readpool import ReadPool
from gpu_triage.exporter.polling.snapshot import CollectorStatus, GpuState, Lost, Snapshot, gpu_status
from gpu_triage.exporter.worker import Worker

log = logging.getLogger(__name__)

FAST = tuple(c for c in Collector if not c.slow)
SLOW = tuple(c for c in Collector if c.slow)
# A poll not done looks for reads stuck in a call at each eighth of its deadline: a hung call holds up the reads
# behind it for an eighth and a half at most.
LOOKS = 8
CLOCK_STEP_SECONDS = 1.0  # the wall clock moving this much more or less than the monotonic one: a step


@dataclass(frozen=True, slots=True)
class _Outcome:
    result: Result | None
    error: BaseException | None
    seconds: float


class Poller:
    def __init__(
        self,
        backend: GpuBackend,
        *,
        interval: float,
        slow_interval: float,
        timeout: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_snapshot: Callable[[Snapshot], None] = lambda _: None,
    ) -> None:
        self.backend = backend
        self.interval = interval
        self.slow_interval = slow_interval
        self.timeout = timeout
        self._clock = clock
        self._monotonic = monotonic
        self._on_snapshot = on_snapshot
        self.snapshot = Snapshot(taken_at=0.0, backend=backend.name)
        self.last_poll_monotonic: float | None = None  # for liveness: the loop is turning
        self.gpus: list[GpuIdentity] = []  # found by discover(), fixed for the daemon's life
        self._failing: dict[tuple[int, Collector], str] = {}  # the error last logged per read, to log a change once
        self._inflight: dict[tuple[int, Collector], Future[_Outcome]] = {}
        self._lock = threading.Lock()
        self._pool: ReadPool | None = None
        self._wall_offset: float | None = None  # wall minus monotonic time at the last poll
        self._stopping = threading.Event()
        self._wake = threading.Event()  # set to bring the next fast poll forward
        self._loops: list[Worker] = []

    def discover(self) -> list[GpuIdentity]:
        """Find the GPUs, under the same deadline as any other driver call."""
        box: list[list[GpuIdentity]] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                box.append(self.backend.discover())
            except BaseException as e:  # handed to the caller's thread below
                errors.append(e)

        worker = threading.Thread(target=run, name="gpu-discover", daemon=True)
        worker.start()
        worker.join(max(self.timeout, 10.0))
        if errors:
            raise errors[0]
        if not box:
            raise BackendError("GPU discovery did not answer in time: the driver may be hung")
        self.gpus = box[0]
        # Reads take micro- to milliseconds: one worker keeps up with many GPUs, and workers reading side by
        # side only trade the GIL at every driver call (each lets go of it). _wait adds one per stuck call.
        self._pool = ReadPool()
        return self.gpus

    def start(self) -> None:
        """Discover, take the first full snapshot, then poll on schedule in the background: the fast and
        the slow fields each on a thread of their own, so a slow read never delays the fast ones."""
        if self._pool is None:
            self.discover()
        self.poll(Collector)
        self._stopping.clear()
        self._loops = [
            Worker(
                "poll-fast",
                _Every(self.poll, FAST, self.interval, self._wake, self._stopping).turn,
                stopping=self._stopping,
            ),
            Worker(
                "poll-slow",
                _Every(self.poll, SLOW, self.slow_interval, self._stopping, self._stopping).turn,
                stopping=self._stopping,
            ),
        ]
        for loop in self._loops:
            loop.start()

    def poll_now(self) -> None:
        """Bring the next fast poll forward to now; fast polls still run one at a time, in order."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        for loop in self._loops:
            # A poll in progress ends by its read deadline; it must not render after the journal closes.
            loop.stop(timeout=self.timeout + 10.0)
        self._loops = []
        if self._pool is not None:
            self._pool.shutdown()  # never waits: a hung driver call must not hang the shutdown

    def poll(self, collectors: Iterable[Collector]) -> Snapshot:
        """Read `collectors` of every GPU and publish the merged snapshot."""
        collectors = tuple(collectors)
        if not any(c.slow for c in collectors):
            collectors += self._cleared_slow()
        now, monotonic = self._clock(), self._monotonic()
        self._check_wall_clock(now, monotonic)
        assert self._pool is not None
        # Slow reads may wait rather than work (GPM pairs two samples 110 ms apart when it has none kept): one
        # after another, 64 GPUs' would take 7 s. A poll of slow collectors reads up to four side by side.
        wide = max(0, min(3, len(self.gpus) - 1)) if any(c.slow for c in collectors) else 0
        self._pool.widen(wide)
        try:
            tasks = self._submit(collectors)
            self._wait(list(tasks.values()))
        finally:
            self._pool.narrow(wide)
        outcomes = {key: fut.result() if fut.done() else None for key, fut in tasks.items()}
        for fut in tasks.values():
            if fut.running():
                self._pool.write_off(fut)
        with self._lock:
            snapshot = self._merge(collectors, outcomes, now, monotonic)
            self.snapshot = snapshot
            self.last_poll_monotonic = self._monotonic()
        self._on_snapshot(snapshot)  # outside the lock: rendering must not hold up the next poll
        return snapshot

    def _wait(self, reads: list[Future[_Outcome]]) -> None:
        """Wait for `reads` up to the deadline. The pool's one worker reads them in turn; at each look, a read
        that has been in its call for half the time between looks or longer is written off (reads take micro-
        to milliseconds), so that a replacement takes the queue on while it is stuck, or slow: it leaves once
        back. (At the deadline, poll() writes off every one of `reads` still in its call, however recent.)"""
        assert self._pool is not None
        step = self.timeout / LOOKS
        deadline = time.monotonic() + self.timeout
        for look in range(LOOKS - 1, 0, -1):
            reads = list(wait(reads, timeout=max(0.0, deadline - step * look - time.monotonic()))[1])
            if not reads:
                return
            self._pool.write_off_stuck(step / 2)
        wait(reads, timeout=max(0.0, deadline - time.monotonic()))

    def _cleared_slow(self) -> tuple[Collector, ...]:
        """Slow collectors whose hung call has returned since: read again now, not at the next slow poll."""
        with self._lock:
            return tuple(
                c
                for c in SLOW
                if any(
                    gpu.problems.get(c) == GpuStatus.HUNG and self._inflight[(gpu.identity.index, c)].done()
                    for gpu in self.snapshot.gpus
                    if (gpu.identity.index, c) in self._inflight
                )
            )

    def _check_wall_clock(self, now: float, monotonic: float) -> None:
        """Log a step of the wall clock once, when the poll after it sees it."""
        with self._lock:
            before, self._wall_offset = self._wall_offset, now - monotonic
        if before is not None and abs(self._wall_offset - before) > CLOCK_STEP_SECONDS:
            log.warning(
                "the wall clock stepped",
                extra={"seconds": round(self._wall_offset - before, 3), "note": "polls keep to their schedule"},
            )

    def _submit(self, collectors: tuple[Collector, ...]) -> dict[tuple[int, Collector], Future[_Outcome]]:
        assert self._pool is not None, "discover() first"
        tasks = {}
        with self._lock:
            for gpu in self.gpus:
                for collector in collectors:
                    key = (gpu.index, collector)
                    running = self._inflight.get(key)
                    if running is None or running.done():
                        running = self._pool.submit(self._read, gpu, collector, lane=gpu.index)
                        self._inflight[key] = running
                    tasks[key] = running
        return tasks

    def _read(self, gpu: GpuIdentity, collector: Collector) -> _Outcome:
        t0 = time.perf_counter()
        try:
            result = self.backend.read(gpu, collector)
        except Exception as e:  # reported per collector, never allowed to stop the poll
            return _Outcome(None, e, time.perf_counter() - t0)
        return _Outcome(result, None, time.perf_counter() - t0)

    def _merge(
        self,
        collectors: tuple[Collector, ...],
        outcomes: dict[tuple[int, Collector], _Outcome | None],
        now: float,
        monotonic: float,
    ) -> Snapshot:
        old = self.snapshot
        # The fast and slow polls publish in the order they finish: a slow one that waited out a hung read
        # must not move the snapshot's time back.
        now, monotonic = max(now, old.taken_at), max(monotonic, old.taken_monotonic)
        ok = dict.fromkeys(collectors, True)
        seconds = dict.fromkeys(collectors, 0.0)
        backend_up = True
        backend_problem: str | None = None
        gpus = []
        for gpu in self.gpus:
            previous = old.gpu(gpu.index) or GpuState(gpu)
            readings = dict(previous.readings)
            problems = {c: p for c, p in previous.problems.items() if c not in collectors}
            answer: str | None = None  # what the backend said when it found the GPU lost
            for collector in collectors:
                outcome = outcomes[(gpu.index, collector)]
                if outcome is None:
                    problems[collector] = GpuStatus.HUNG
                    ok[collector] = False
                    seconds[collector] = self.timeout
                    continue
                seconds[collector] = max(seconds[collector], outcome.seconds)
                if outcome.result is not None:
                    self._failing.pop((gpu.index, collector), None)
                    readings[collector] = outcome.result.reading
                    if outcome.result.failed_fields:
                        ok[collector] = False
                    continue
                if isinstance(outcome.error, GpuLostError):
                    problems[collector] = GpuStatus.LOST
                    answer = answer or str(outcome.error)
                elif isinstance(outcome.error, BackendError):
                    ok[collector] = False
                    backend_up = False  # logged once per change below, not for every GPU and collector
                    backend_problem = backend_problem or str(outcome.error)
                else:
                    ok[collector] = False
                    if self._failing.get((gpu.index, collector)) != repr(outcome.error):  # once, not every poll
                        log.error(
                            "GPU read failed",
                            extra={"gpu": gpu.index, "collector": collector, "error": repr(outcome.error)},
                        )
                    self._failing[(gpu.index, collector)] = repr(outcome.error)
                # Inventory is descriptive: keep the last known name/serial for the info series.
                if collector is not Collector.INVENTORY:
                    readings.pop(collector, None)
            lost = answer or f"the {self.backend.name} backend says the GPU is lost"
            gpus.append(_settled(previous, readings, problems, Lost(now, lost)))
        statuses = dict(old.collectors)
        for collector in collectors:
            last = now if ok[collector] else getattr(old.collectors.get(collector), "last_success", None)
            statuses[collector] = CollectorStatus(ok[collector], seconds[collector], last)
        if backend_up != old.backend_up:
            if backend_up:
                log.info("the GPU backend works again", extra={"backend": self.backend.name})
            else:
                log.error("the GPU backend fails", extra={"backend": self.backend.name, "error": backend_problem})
        return Snapshot(
            now, self.backend.name, tuple(gpus), MappingProxyType(statuses), backend_up, backend_problem, monotonic
        )


def _settled(
    previous: GpuState, readings: dict[Collector, Reading], problems: dict[Collector, str], lost: Lost
) -> GpuState:
    """A GPU's new state from its readings and problems; `lost` is when and why, should it be lost now."""
    is_lost = GpuStatus.LOST in problems.values()
    for collector in list(readings):
        # A lost GPU has no current values at all; a hung call only loses its own.
        if collector is not Collector.INVENTORY and (is_lost or collector in problems):
            del readings[collector]
    _log_changes(previous.identity.index, previous.problems, problems)
    # Lost since the first poll that found it so, with what the backend said then.
    gone = (previous.lost or lost) if is_lost else None
    return GpuState(previous.identity, MappingProxyType(readings), MappingProxyType(problems), gone)


def _log_changes(gpu: int, before: Mapping[Collector, str], after: Mapping[Collector, str]) -> None:
    """Log a GPU going lost or hung, and coming back, once per change rather than every poll."""
    if before == after:
        return
    was, now = gpu_status(before), gpu_status(after)
    hung = sorted(c.value for c, p in after.items() if p == GpuStatus.HUNG and before.get(c) != GpuStatus.HUNG)
    if now == GpuStatus.LOST and was != GpuStatus.LOST:
        log.error("GPU is lost", extra={"gpu": gpu})
    elif hung:
        log.warning("GPU calls missed their deadline; treating the GPU as hung", extra={"gpu": gpu, "calls": hung})
    elif now == GpuStatus.UP:
        log.info("GPU answers again", extra={"gpu": gpu, "was": was})


class _Every:
    """One poll loop's turn: poll `collectors` every `interval` seconds of monotonic time. A poll that runs
    late is not made up for: the next one keeps to the schedule (and `wake` brings one forward)."""

    def __init__(
        self,
        poll: Callable[[tuple[Collector, ...]], object],
        collectors: tuple[Collector, ...],
        interval: float,
        wake: threading.Event,
        stopping: threading.Event,
    ) -> None:
        self._poll = poll
        self._collectors = collectors
        self._interval = interval
        self._wake = wake
        self._stopping = stopping
        self._due = time.monotonic() + interval

    def turn(self) -> None:
        delay = self._due - time.monotonic()
        if delay > 0:
            self._wake.wait(delay)
        if self._stopping.is_set():
            return
        if self._wake is not self._stopping:
            self._wake.clear()
        try:
            self._poll(self._collectors)
        except Exception:  # a bug, not the driver (reads report their own errors): keep polling
            log.exception("poll failed", extra={"collectors": len(self._collectors)})
        now = time.monotonic()
        while self._due <= now:
            self._due += self._interval
