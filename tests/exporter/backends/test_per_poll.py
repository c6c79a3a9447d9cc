"""An answer shared by the reads of one poll: each reader takes it once, then asks afresh."""

from __future__ import annotations

from gpu_triage.exporter.backends.per_poll import PerPoll


class Driver:
    def __init__(self) -> None:
        self.asked = 0
        self.fails = False

    def ask(self) -> tuple[int, bool]:
        self.asked += 1
        return self.asked, not self.fails


def test_each_reader_takes_an_answer_once_and_the_first_to_come_back_asks_again() -> None:
    shared: PerPoll[int, int] = PerPoll()
    driver = Driver()
    poll_1 = [shared.get(0, reader, driver.ask) for reader in ("memory", "processes", "profiling")]
    poll_2 = [shared.get(0, reader, driver.ask) for reader in ("processes", "memory")]
    assert (poll_1, poll_2) == ([1, 1, 1], [2, 2])
    assert shared.get(1, "memory", driver.ask) == 3  # every key has answers of its own


def test_an_answer_with_a_failure_is_not_shared() -> None:
    shared: PerPoll[int, int] = PerPoll()
    driver = Driver()
    driver.fails = True
    assert [shared.get(0, reader, driver.ask) for reader in ("memory", "processes")] == [1, 2]


def test_a_forgotten_answer_is_asked_afresh_even_one_being_asked_for_then() -> None:
    shared: PerPoll[int, int] = PerPoll()
    driver = Driver()
    shared.get(0, "memory", driver.ask)
    shared.forget(0)
    assert shared.get(0, "processes", driver.ask) == 2

    def ask_while_the_gpu_fails() -> tuple[int, bool]:
        shared.forget(0)  # another read of the GPU failed meanwhile
        return driver.ask()

    assert shared.get(0, "processes", ask_while_the_gpu_fails) == 3  # it has taken 2: a new poll
    assert shared.get(0, "memory", driver.ask) == 4
