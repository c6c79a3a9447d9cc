"""The performance engine on hand-made telemetry: each class, the shapes that must not raise one (a checkpoint
stall, a warm-up, a daemon that just started), and the per-workload accounting."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from gpu_triage.diagnosis.core.data_files import DataError, Problems, parse_yaml, read_data
from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.diagnosis.performance.data import CLASSES, load_performance, parse_performance
from gpu_triage.diagnosis.performance.engine import MAX_ACCOUNTS, PerformanceEngine
from gpu_triage.diagnosis.performance.window import GpuSample

JOB = Workload("slurm_job", "4242", user="alice")
POD = Workload("pod", "notebook-7", namespace="ml-research")
GIB = 1024**3
H100_PCIE = 63.0e9  # gen 5 x16: 32 GT/s x 16 lanes x 128/130, in bytes per second each way
BUSY = GpuSample(
    uuid="",
    index=0,
    utilization=0.95,
    sm_active=0.85,
    sm_occupancy=0.4,
    dram_active=0.5,
    pcie_rx_bytes_per_second=3e9,
    pcie_tx_bytes_per_second=2e9,
    pcie_capacity=H100_PCIE,
    nvlink_bytes_per_second=18 * 11e9,
    nvlink_capacity=18 * 25e9,
    sm_clock_hz=1.98e9,
    sm_max_clock_hz=1.98e9,
    reasons=0,
    temperature_celsius=62.0,
    memory_used_bytes=70 * GIB,
    processes=1,
    energy_joules=0.0,
    power_watts=650.0,
    workloads=(JOB,),
)
IDLE = replace(BUSY, utilization=0.0, sm_active=0.0, sm_occupancy=0.0, dram_active=0.0, pcie_rx_bytes_per_second=0.0,
               pcie_tx_bytes_per_second=0.0, nvlink_bytes_per_second=0.0, power_watts=90.0, reasons=0x1)  # fmt: skip

Shape = Callable[[int, float], GpuSample]  # (gpu, seconds since start) -> sample


def run(shape: Shape, seconds: float, *, gpus: int = 1, window: float = 300.0, every: float = 5.0,
        role: str = "") -> tuple[PerformanceEngine, dict[int, set[str]]]:  # fmt: skip
    """Feed `shape` for `seconds`; returns the engine and every class seen on each GPU along the way."""
    engine = PerformanceEngine(load_performance(), window, role)
    seen: dict[int, set[str]] = {}
    t = 0.0
    energy = [0.0] * gpus
    while t <= seconds:
        samples = []
        for g in range(gpus):
            s = shape(g, t)
            energy[g] += (s.power_watts or 0.0) * every
            samples.append(replace(s, uuid=f"GPU-{g}", index=g, energy_joules=energy[g]))
        engine.observe(10_000.0 + t, samples)
        for uuid, found in engine.report.by_gpu.items():
            seen.setdefault(int(uuid.removeprefix("GPU-")), set()).update(f.cls for f in found)
        t += every
    return engine, seen


def now(engine: PerformanceEngine) -> dict[int, set[str]]:
    return {int(u.removeprefix("GPU-")): {f.cls for f in found} for u, found in engine.report.by_gpu.items()}


def test_a_busy_well_fed_gpu_has_no_finding() -> None:
    _, seen = run(lambda g, t: BUSY, 3600, gpus=4)
    assert seen == {}


def test_a_held_idle_gpu_is_idle_allocated_after_the_idle_window_and_not_before() -> None:
    engine, seen = run(lambda g, t: replace(IDLE, workloads=(POD,)), 13 * 60)
    assert seen == {}, "15 minutes are the idle window: 13 are not enough"
    engine, _ = run(lambda g, t: replace(IDLE, workloads=(POD,)), 16 * 60)
    assert now(engine) == {0: {"gpu_idle_allocated"}}
    finding = engine.report.by_gpu["GPU-0"][0]
    assert finding.window_seconds == 900.0
    assert finding.evidence["activity"] == 0.0 and finding.workloads == (POD,)


def test_a_two_minute_checkpoint_stall_is_not_idle() -> None:
    # Training with a 2-minute checkpoint every 10 minutes: memory held, SMs at 0 during the stall.
    def shape(g: int, t: float) -> GpuSample:
        return IDLE if t % 600 >= 480 else BUSY

    _, seen = run(shape, 3 * 3600, gpus=8)
    assert seen == {}


def test_a_free_idle_gpu_is_not_idle_allocated() -> None:
    free = replace(IDLE, workloads=(), processes=0, memory_used_bytes=0)
    _, seen = run(lambda g, t: free, 3600)
    assert seen == {}


def test_memory_alone_is_a_hold() -> None:
    # No scheduler mapping, no process list (a container without the host's PIDs): the memory says it is held.
    orphan = replace(IDLE, workloads=(), processes=None, memory_used_bytes=40 * GIB)
    engine, _ = run(lambda g, t: orphan, 3600)
    assert now(engine) == {0: {"gpu_idle_allocated"}}


def test_a_daemon_that_just_started_judges_nothing() -> None:
    engine, seen = run(lambda g, t: replace(IDLE, workloads=(POD,)), 200)
    assert seen == {} and engine.report.judged_at is None


def test_the_window_flag_scales_every_window() -> None:
    engine, _ = run(lambda g, t: replace(IDLE, workloads=(POD,)), 100, window=30.0, every=1.0)
    assert now(engine) == {0: {"gpu_idle_allocated"}}
    assert engine.report.by_gpu["GPU-0"][0].window_seconds == 90.0


@pytest.mark.parametrize(
    ("name", "sample", "cls"),
    [
        ("h2d copies near the link", replace(BUSY, sm_active=0.3, pcie_rx_bytes_per_second=30e9), "input_bound"),
        (
            "nvlink near capacity",
            replace(BUSY, sm_active=0.35, nvlink_bytes_per_second=18 * 20e9),
            "communication_bound",
        ),
        (
            "pcie both ways, no nvlink",
            replace(
                BUSY,
                sm_active=0.3,
                pcie_rx_bytes_per_second=45e9,
                pcie_tx_bytes_per_second=45e9,
                nvlink_bytes_per_second=None,
                nvlink_capacity=None,
            ),
            "communication_bound",
        ),
        ("power cap", replace(BUSY, sm_clock_hz=1.5e9, reasons=0x4), "throttled"),
        ("low clocks, no reason", replace(BUSY, sm_clock_hz=1.4e9), "throttled"),
        ("dram saturated", replace(BUSY, dram_active=0.92, sm_occupancy=0.15), "memory_bound"),
    ],
)
def test_each_single_gpu_class(name: str, sample: GpuSample, cls: str) -> None:
    engine, _ = run(lambda g, t: sample, 400)
    assert now(engine) == {0: {cls}}, name


def test_throttled_from_the_duration_counters_not_the_bits_of_the_moment() -> None:
    # NVML's counter says the power cap held the clocks 3 s of every 5 s, though no poll saw the bit set.
    def shape(g: int, t: float) -> GpuSample:
        return replace(BUSY, reason_seconds={"sw_power_cap": t * 0.6}, sm_clock_hz=1.7e9)

    engine, _ = run(shape, 400)
    assert now(engine) == {0: {"throttled"}}
    assert engine.report.by_gpu["GPU-0"][0].evidence["slowdown_share"] == pytest.approx(0.6, abs=0.02)


@pytest.mark.parametrize("reason", [0x200, 0x400])  # nvmlClocksThrottleReasonBoardLimit, ...Reliability
def test_low_clocks_the_driver_explains_by_the_board_are_not_throttled(reason: int) -> None:
    _, seen = run(lambda g, t: replace(BUSY, sm_clock_hz=1.4e9, reasons=reason), 400)
    assert seen == {}


def test_an_idle_gpu_at_low_clocks_is_not_throttled() -> None:
    _, seen = run(lambda g, t: replace(IDLE, workloads=(), processes=0, memory_used_bytes=0, sm_clock_hz=3.45e8), 900)
    assert seen == {}


def test_bursts_with_idle_gaps_are_input_bound() -> None:
    def shape(g: int, t: float) -> GpuSample:
        return replace(BUSY, sm_active=0.6) if t % 20 < 10 else replace(IDLE, reasons=0)

    engine, _ = run(shape, 400)
    assert now(engine) == {0: {"input_bound"}}
    assert engine.report.by_gpu["GPU-0"][0].evidence["bursts"] >= 4


def test_the_straggler_is_the_gpu_behind_its_siblings_and_its_workload_says_so() -> None:
    def shape(g: int, t: float) -> GpuSample:
        return replace(BUSY, sm_active=0.55, temperature_celsius=75.0) if g == 5 else BUSY

    engine, _ = run(shape, 400, gpus=8)
    assert now(engine) == {5: {"straggler_gpu"}}
    ((workload, gpus, findings),) = engine.report.by_workload
    assert workload == JOB and gpus == tuple(range(8)) and [f.gpu for f in findings] == [5]


def test_gpus_of_different_workloads_are_not_siblings() -> None:
    other = Workload("slurm_job", "99", user="bob")

    def shape(g: int, t: float) -> GpuSample:
        return replace(BUSY, sm_active=0.4, workloads=(other,)) if g >= 4 else BUSY

    _, seen = run(shape, 900, gpus=8)
    assert seen == {}


def test_mig_against_the_node_role() -> None:
    mig = replace(BUSY, mig_enabled=True)
    engine, _ = run(lambda g, t: mig, 400, role="training")
    assert now(engine) == {0: {"mig_policy"}}
    _, seen = run(lambda g, t: mig, 400, role="inference")
    assert seen == {}
    _, seen = run(lambda g, t: replace(BUSY, mig_enabled=False), 400, role="inference")
    assert seen == {0: {"mig_policy"}}
    _, seen = run(lambda g, t: mig, 400)  # no role given: not judged
    assert seen == {}


def test_accounting_splits_a_shared_gpu_and_sums_to_the_gpu() -> None:
    a, b = Workload("pod", "a", namespace="x"), Workload("pod", "b", namespace="y")

    def shape(g: int, t: float) -> GpuSample:
        return replace(BUSY if t < 600 else IDLE, workloads=(a, b))

    engine, _ = run(shape, 1200)
    accounts = engine.accounts
    first, second = accounts[("GPU-0", a)], accounts[("GPU-0", b)]
    assert first == second
    assert first.allocated_seconds * 2 == pytest.approx(1200.0)
    assert first.idle_seconds * 2 == pytest.approx(600.0, abs=5.0)
    assert first.active_seconds * 2 == pytest.approx(0.85 * 600, abs=5.0)
    # Energy from the counter: 650 W busy, 90 W idle, 5 s apart.
    assert (first.energy_joules + second.energy_joules) == pytest.approx(650 * 600 + 90 * 600, rel=0.02)


def test_a_workload_that_leaves_ends_its_series() -> None:
    engine, _ = run(lambda g, t: replace(BUSY, workloads=(JOB,) if t < 100 else ()), 200)
    assert engine.accounts == {}


def test_accounting_is_bounded() -> None:
    many = tuple(Workload("pod", f"p{i}", namespace="n") for i in range(MAX_ACCOUNTS + 50))
    engine = PerformanceEngine(load_performance(), 300.0)
    for t in (0.0, 5.0):
        engine.observe(t, [replace(BUSY, uuid="GPU-0", workloads=many)])
    assert len(engine.accounts) == MAX_ACCOUNTS


def test_the_shipped_thresholds_name_every_class_in_the_operators_order() -> None:
    data = load_performance()
    assert tuple(data.classes) == CLASSES
    assert CLASSES[:5] == ("gpu_idle_allocated", "input_bound", "communication_bound", "throttled", "memory_bound")
    assert data.classes["gpu_idle_allocated"].windows == 3
    assert data.pcie_capacity(5, 16) == pytest.approx(H100_PCIE, rel=0.01)
    assert data.pcie_capacity(4, 16) == pytest.approx(31.5e9, rel=0.01)
    assert data.nvlink_capacity("NVIDIA B200") == 50e9
    assert data.nvlink_capacity("NVIDIA H100 80GB HBM3") == 25e9


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["classes"]["throttled"].update(reason_share=1.5), "reason_share: must be a number from 0 to 1"),
        (lambda d: d["classes"].pop("memory_bound"), "no class 'memory_bound'"),
        (lambda d: d["classes"]["input_bound"].update(typo=1), "unknown key 'typo'"),
        (lambda d: d["classes"]["straggler_gpu"].update(severity="critical"), "never pages"),
        (lambda d: d["classes"]["gpu_idle_allocated"].update(windows=0), "windows: must be a whole number"),
        (lambda d: d["classes"]["input_bound"].update(burst_idle_share=[0.9, 0.1]), "low must not be above high"),
        (lambda d: d.update(coverage="most"), "coverage: must be a number"),
    ],
)
def test_a_bad_thresholds_file_fails_with_every_problem_named(edit: Callable[[dict], object], message: str) -> None:
    doc = parse_yaml(read_data("performance.yaml"), "performance.yaml", Problems())
    edit(doc)
    with pytest.raises(DataError, match=message):
        parse_performance(doc)


def test_polls_slower_than_a_bucket_still_judge_the_window_on_time() -> None:
    # A minute between polls, 30 s buckets: the 15-minute idle window is judged after 15 minutes, not 30 polls.
    engine, _ = run(lambda g, t: replace(IDLE, workloads=(POD,)), 16 * 60, every=60.0)
    assert now(engine) == {0: {"gpu_idle_allocated"}}


def test_the_reason_bits_are_nvmls_as_the_backends_read_them() -> None:
    """diagnosis/ restates the clocks-event bits (it imports nothing from the exporter): held to the backends' table,
    every bit NVML defines is either a slowdown or an explained reason, never both."""
    from gpu_triage.diagnosis.performance.window import EXPLAINED_BITS, SLOWDOWN_BITS, SLOWDOWN_REASONS
    from gpu_triage.exporter.backends.readings import ClockEventReason

    assert sum(ClockEventReason(r).bit for r in SLOWDOWN_REASONS) == SLOWDOWN_BITS
    assert SLOWDOWN_BITS & EXPLAINED_BITS == 0
    assert sum(r.bit for r in ClockEventReason) == SLOWDOWN_BITS | EXPLAINED_BITS
