"""Rates from NVML's cumulative counters: the change over the time between two reads, and none when unsure."""

from __future__ import annotations

from gpu_triage.exporter.backends.counter_rates import CounterRates


def test_a_rate_is_the_change_over_the_time_between_reads_and_none_the_first_time() -> None:
    now = [100.0]
    rates = CounterRates(lambda: now[0])
    assert rates.rate((0, "tx"), 1_000) is None
    now[0] += 10
    assert rates.rate((0, "tx"), 51_000) == 5_000.0
    now[0] += 2
    assert rates.rate((0, "tx"), 51_000, per_unit=1024) == 0.0


def test_a_counter_that_went_down_gives_no_rate_rather_than_a_wrong_one() -> None:
    """nvml.h on NVML_FI_DEV_PCIE_COUNT_TX_BYTES: "Value can be wrapped". A reload restarts it too."""
    now = [0.0]
    rates = CounterRates(lambda: now[0])
    rates.rate((1, "rx"), 2**64 - 10)
    now[0] += 1
    assert rates.rate((1, "rx"), 5) is None  # wrapped: the interval is skipped
    now[0] += 1
    assert rates.rate((1, "rx"), 105) == 100.0  # and the next one is measured from the new value


def test_no_time_between_reads_gives_no_rate_and_a_forgotten_gpu_starts_over() -> None:
    now = [0.0]
    rates = CounterRates(lambda: now[0])
    rates.rate((2, "tx"), 0)
    assert rates.rate((2, "tx"), 10) is None
    rates.rate((3, "tx"), 0)
    rates.forget(2)
    now[0] += 1
    assert rates.rate((2, "tx"), 20) is None  # forgotten: a first read again
    assert rates.rate((3, "tx"), 10) == 10.0  # another GPU's counters are kept
