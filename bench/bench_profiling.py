"""What profiling (NVML GPM, DCGM) adds to a poll: figures, not pass/fail.

    .venv/bin/python bench/bench_profiling.py

There is no GPU here, so NVML and DCGM are the test fakes (tests/nvml_fake.py, tests/nvml_gpm_fake.py,
tests/dcgm_fake.py) answering from the simulator. The figures are gpu-triage's own CPU time per poll,
with the time spent inside the fake library calls measured and taken out, and how many library calls
it makes: on a GPU node each of those calls adds what the driver or the host engine takes, which only a
run there can tell.

1. NVML: one slow poll's profiling reads for 8 GPUs in steady state (one GPM sample per GPU, paired with
   the one the poll before kept), beside a fast poll of every other collector; and the first poll's wait.
2. The same on the h100-mig node: 6 whole GPUs and 2 GPUs of 2 MIG devices each.
3. DCGM: a fast poll and the profiling reads through the DCGM backend, and the calls they make.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml
import pytest

from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.dcgm import Address, DcgmBackend
from gpu_triage.exporter.backends.nvml.backend import NvmlBackend
from gpu_triage.exporter.backends.nvml.gpm import GpmProfiler
from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.polling.poller import FAST
from tests.dcgm_fake import running
from tests.nvml_fake import FakeNvml
from tests.nvml_gpm_fake import FakeGpmMig

REPEATS = 30
REPO = Path(__file__).resolve().parent.parent


class FakeClock:
    """Time that moves when told: polls a minute apart without waiting a minute."""

    def __init__(self) -> None:
        self.now = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Meter:
    """Counts the calls into a library's functions and the time spent inside them."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.inside = 0.0

    def wrap(self, module: Any, names: list[str], mp: pytest.MonkeyPatch) -> None:
        for name in names:
            mp.setattr(module, name, self._timed(name, getattr(module, name)))

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - t0

        return call

    @contextmanager
    def measure(self, out: dict[str, float]) -> Iterator[None]:
        self.calls.clear()
        self.inside = 0.0
        t0 = time.perf_counter()
        yield
        out["total"] = time.perf_counter() - t0
        out["ours"] = out["total"] - self.inside
        out["calls"] = sum(self.calls.values())


def poll_cost(
    backend: Any, meter: Meter, collectors: tuple[Collector, ...], clock: FakeClock, step: float
) -> dict[str, float]:
    """Median over REPEATS polls of reading `collectors` of every GPU, one after another."""
    runs: list[dict[str, float]] = []
    gpus = backend.discover()
    for _ in range(REPEATS):
        clock.advance(step)
        figures: dict[str, float] = {}
        with meter.measure(figures):
            for gpu in gpus:
                for collector in collectors:
                    backend.read(gpu, collector)
        runs.append(figures)
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def nvml_node(scenario: str, mp: pytest.MonkeyPatch) -> tuple[NvmlBackend, Meter, FakeClock, list[float]]:
    clock = FakeClock()
    sim = SimBackend(load_scenario(scenario), clock=clock)
    clock.advance(400)
    base = FakeNvml(sim)
    base.install(mp)
    FakeGpmMig(base, clock=clock).install(mp)
    meter = Meter()
    meter.wrap(pynvml, [n for n in dir(pynvml) if n.startswith("nvml") and callable(getattr(pynvml, n))], mp)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    backend = NvmlBackend()
    backend.gpm = GpmProfiler(clock=clock, sleep=sleep)
    backend.discover()
    return backend, meter, clock, waits


def row(what: str, f: dict[str, float]) -> None:
    print(f"  {what:<44} {f['ours'] * 1000:>8.2f} {f['total'] * 1000:>9.2f} {f['calls']:>7.0f}")


def header(title: str) -> None:
    print(f"\n{title}")
    print(f"  {'poll of 8 GPUs':<44} {'ours ms':>8} {'+fake ms':>9} {'calls':>7}")


def nvml(scenario: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        backend, meter, clock, waits = nvml_node(scenario, mp)
        first: dict[str, float] = {}
        with meter.measure(first):
            for gpu in backend.discover():
                backend.read(gpu, Collector.PROFILING)
        header(f"NVML, {scenario} (fakes): median of {REPEATS}")
        row("fast poll, every fast collector", poll_cost(backend, meter, FAST, clock, 5.0))
        row("profiling (GPM), steady state", poll_cost(backend, meter, (Collector.PROFILING,), clock, 60.0))
        row("profiling (GPM), first poll", first)
        wait = waits[0] * 1000
        print(f"  the first poll waits {wait:.0f} ms once per GPU ({len(waits)} GPUs), in that GPU's read worker")
        backend.close()


def dcgm() -> None:
    with pytest.MonkeyPatch.context() as mp:
        clock = FakeClock()
        sim = SimBackend(load_scenario("h100-training"), clock=clock)
        clock.advance(400)
        with running(sim) as engine:
            base = FakeNvml(sim)
            base.install(mp)
            FakeGpmMig(base).install(mp)
            backend = DcgmBackend(
                Address.parse(engine.address),
                bindings_dir=REPO / "tests" / "dcgm_bindings",
                companion=NvmlBackend(),
                clock=clock,
            )
            meter = Meter()
            agent = backend.b.agent
            meter.wrap(agent, [n for n in dir(agent) if n.startswith("dcgm") and callable(getattr(agent, n))], mp)
            meter.wrap(pynvml, [n for n in dir(pynvml) if n.startswith("nvml") and callable(getattr(pynvml, n))], mp)
            header(f"DCGM host engine (fake), h100-training: median of {REPEATS}; calls to DCGM and NVML")
            row("fast poll, every fast collector", poll_cost(backend, meter, FAST, clock, 5.0))
            row("profiling (DCGM fields)", poll_cost(backend, meter, (Collector.PROFILING,), clock, 60.0))
            row("health watches (one check for all GPUs)", poll_cost(backend, meter, (Collector.HEALTH,), clock, 5.0))
            backend.close()


def main() -> None:
    print(" ".join((__doc__ or "").split("\n\n")[2].split()))
    nvml("h100-training")
    nvml("h100-mig")
    dcgm()


if __name__ == "__main__":
    main()
