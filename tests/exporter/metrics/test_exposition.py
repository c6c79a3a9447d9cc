"""Our encoder writes what prometheus_client's encoders write, for any family we could expose."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gpu_triage.exporter.metrics.exposition import encode


class _Families:
    """Hands already-built families to prometheus_client's encoders."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def reference_encode(families: list[Metric]) -> tuple[bytes, bytes]:
    """The same bodies through prometheus_client's own encoders: the yardstick for `encode`."""
    source = _Families(families)
    return generate_latest(source), generate_openmetrics(source)  # type: ignore[arg-type]


_names = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: not n.endswith(("_total", "_info", "_created", "_bucket", "_count", "_sum", "_gsum", "_gcount"))
)
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, 1e300, 2.0**53 + 1]),
    st.integers(min_value=-(2**63), max_value=2**63).map(float),
)


@st.composite
def _family(draw: st.DrawFn) -> Metric:
    name = draw(_names)
    doc = draw(_text)
    labels = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), max_size=3, unique=True))
    kind = draw(st.sampled_from(["gauge", "counter", "info", "stateset"]))
    rows = draw(st.lists(st.tuples(st.lists(_text, min_size=len(labels), max_size=len(labels)), _values), max_size=4))
    if kind == "info":
        info = InfoMetricFamily(name, doc, labels=labels)
        for values, _ in rows:
            info.add_metric(values, {"extra": "x"})
        return info
    if kind == "stateset":
        states = StateSetMetricFamily(name, doc, labels=labels)
        for values, value in rows:
            states.add_metric(values, {"a": value > 0, "b": not value > 0})
        return states
    unit = draw(st.sampled_from(["", "seconds", "bytes"])) if kind == "gauge" else ""
    family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
        name + (f"_{unit}" if unit else ""), doc, labels=labels, unit=unit
    )
    for values, value in rows:
        family.add_metric(values, abs(value) if kind == "counter" else value)
    return family


@settings(max_examples=300, deadline=None)
@given(st.lists(_family(), max_size=4, unique_by=lambda f: f.name))
def test_encode_matches_prometheus_client(families: list[Metric]) -> None:
    assert encode(families) == reference_encode(families)
