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


def test_a_row_of_counters_is_rated_counter_by_counter() -> None:
    """A GPU's links under one key: each link as `rate` would rate it on its own."""
    now = [0.0]
    rates = CounterRates(lambda: now[0])
    assert rates.rates((0, "nvlink"), [0, 100, None, 2**64 - 1]) == [None] * 4
    now[0] += 2
    # A counter that did not answer gives no rate, and the next one is over the time since it last did.
    assert rates.rates((0, "nvlink"), [10, None, 4, 5]) == [5.0, None, None, None]  # the last wrapped
    now[0] += 2
    assert rates.rates((0, "nvlink"), [10, 300, 8, 25]) == [0.0, 50.0, 2.0, 10.0]
    assert rates.rates((0, "nvlink"), [20, 300, 8, 25]) == [None] * 4  # no time between reads
    assert rates.rates((0, "nvlink"), [30, 300]) == [None, None]  # another number of links: started over
    rates.rates((1, "nvlink"), [0])
    rates.forget(0)
    now[0] += 1
    assert rates.rates((0, "nvlink"), [40, 400]) == [None, None]  # forgotten: a first read again
    assert rates.rates((1, "nvlink"), [3]) == [3.0]  # another GPU's row is kept
