"""The page is built when a scrape asks, once per change, and a build that fails serves the page before."""

from __future__ import annotations

import logging
import threading

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric

from gpu_triage.exporter.metrics.exposition import MetricsCache


def _page(value: float) -> list[Metric]:
    family = GaugeMetricFamily("nvidia_gpu_power_watts", "Power draw.", labels=["gpu"])
    family.add_metric(["0"], value)
    return [family]


class _Builder:
    def __init__(self, value: float | None) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> list[Metric]:
        self.calls += 1
        if self.value is None:
            raise RuntimeError("a bug in a family")
        return _page(self.value)


def test_nothing_is_built_until_a_scrape_and_then_once_for_every_scrape_and_format() -> None:
    cache, build = MetricsCache(), _Builder(250.0)
    cache.update(build)
    assert build.calls == 0, "a change alone builds nothing"
    assert cache.cached(None, None) is None, "nothing made yet"
    threads = [threading.Thread(target=cache.get, args=(None, "gzip")) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache.get("application/openmetrics-text; version=1.0.0", None)
    assert build.calls == 1
    plain = cache.cached(None, None)
    assert plain is not None and b'nvidia_gpu_power_watts{gpu="0"} 250.0\n' in plain.body
    assert cache.cached(None, "gzip") is not None


def test_a_build_that_fails_serves_the_last_page_built_and_the_next_change_builds_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = MetricsCache()
    cache.update(_Builder(250.0))
    assert b"250.0" in cache.text
    cache.update(_Builder(None))
    with caplog.at_level(logging.ERROR):
        assert b"250.0" in cache.text
    assert "building the metrics page failed" in caplog.text
    cache.update(_Builder(300.0))
    assert b"300.0" in cache.text


def test_changes_nobody_scrapes_do_not_pile_up() -> None:
    cache = MetricsCache()
    cache.update(_Builder(7777.5))
    assert b"7777.5" in cache.text
    for value in range(1000):
        cache.update(_Builder(float(value)))
    cache.update(_Builder(None))
    assert b"7777.5" in cache.text, "the last page built, not one of the thousand never built"
