"""Rendering metric families once per change into cached bytes, and serving those bytes.

A scrape picks a cached body by its Accept header (classic text or OpenMetrics) and, when the
client takes gzip, a compressed copy made once per render. It never builds metrics itself. The
families are built at each change; their bytes are encoded by the first scrape that needs them
(once per change, whatever the number of scrapes): the daemon renders at every poll (every 5 s by
default) and every XID batch, while Prometheus scrapes every 15 s to 1 min, so encoding each render
would be mostly for nobody.
"""

from __future__ import annotations

import gzip
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.utils import floatToGoString

# Text and OpenMetrics differ only in their metadata lines for the families we expose (gauges,
# counters, info, statesets; no timestamps, exemplars or _created samples), so each sample line is
# formatted once and shared. The bytes are the same as prometheus_client's encoders give (tested);
# building them by hand makes a render several times cheaper.
_TEXT_TYPES = {"gauge": "gauge", "counter": "counter", "info": "gauge", "stateset": "gauge"}
_TEXT_SUFFIX = {"counter": "_total", "info": "_info"}


def _label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _sample_lines(metric: Metric) -> str:
    lines = []
    for s in metric.samples:
        v = s.value
        # Most of a page is 0s and 1s (state sets, link states): skip the general formatter for them.
        # -0.0 == 0.0, but prometheus_client writes it with its sign.
        if v == 1.0:
            value = "1.0"
        elif v == 0.0 and math.copysign(1.0, v) > 0:
            value = "0.0"
        else:
            value = floatToGoString(v)  # type: ignore[no-untyped-call]
        if s.labels:
            labels = ",".join([f'{k}="{_label_value(v)}"' for k, v in sorted(s.labels.items())])
            lines.append(f"{s.name}{{{labels}}} {value}\n")
        else:
            lines.append(f"{s.name} {value}\n")
    return "".join(lines)


def encode(families: Iterable[Metric]) -> tuple[bytes, bytes]:
    """(classic text 0.0.4, OpenMetrics 1.0.0) for `families`."""
    families = list(families)
    _check_types(families)
    parts = _parts(families)
    return _text(parts), _openmetrics(parts)


# Per family: (its name in the classic format, TYPE there, escaped help, OpenMetrics name, type, unit, samples)
_Part = tuple[str, str, str, str, str, str, str]


def _check_types(families: list[Metric]) -> None:
    for metric in families:
        if metric.type not in _TEXT_TYPES:
            raise ValueError(f"{metric.name}: metric type {metric.type} is not supported by this encoder")


def _parts(families: list[Metric]) -> list[_Part]:
    """Families whose types `_check_types` passed."""
    out = []
    for metric in families:
        name = metric.name + _TEXT_SUFFIX.get(metric.type, "")
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append((name, _TEXT_TYPES[metric.type], doc, metric.name, metric.type, metric.unit, _sample_lines(metric)))
    return out


def _text(parts: list[_Part]) -> bytes:
    return "".join(f"# HELP {n} {doc}\n# TYPE {n} {kind}\n{samples}" for n, kind, doc, *_, samples in parts).encode()


def _openmetrics(parts: list[_Part]) -> bytes:
    out = []
    for _, _, doc, name, kind, unit, samples in parts:
        om_doc = doc.replace('"', r"\"")
        units = f"# UNIT {name} {unit}\n" if unit else ""
        out.append(f"# HELP {name} {om_doc}\n# TYPE {name} {kind}\n{units}{samples}")
    out.append("# EOF\n")
    return "".join(out).encode()


class _Render:
    """One change's families, encoded in each format on first demand, at most once."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families
        self._parts: list[_Part] | None = None
        self._bodies: dict[bool, _Body] = {}
        self._lock = threading.Lock()

    def body(self, openmetrics: bool) -> _Body:
        body = self._bodies.get(openmetrics)
        if body is None:
            with self._lock:
                if (body := self._bodies.get(openmetrics)) is None:
                    if self._parts is None:
                        self._parts = _parts(self._families)
                    body = _Body((_openmetrics if openmetrics else _text)(self._parts))
                    self._bodies[openmetrics] = body
        return body


@dataclass
class _Body:
    data: bytes
    _gzipped: bytes | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def gzipped(self) -> bytes:
        # Made on the first scrape that asks for it, once per render.
        if self._gzipped is None:
            with self._lock:
                if self._gzipped is None:
                    self._gzipped = gzip.compress(self.data, compresslevel=1, mtime=0)
        return self._gzipped


@lru_cache(maxsize=64)
def _openmetrics_wanted(accept: str) -> bool:
    # Prometheus sends the same Accept header on every scrape: decide once per distinct header.
    return choose_encoder(accept)[1].startswith("application/openmetrics-text")


@dataclass(frozen=True, slots=True)
class Scrape:
    body: bytes
    content_type: str
    gzipped: bool


class MetricsCache:
    def __init__(self) -> None:
        self._render = _Render([])

    def update(self, families: list[Metric]) -> None:
        """Swap in `families`; a bad family fails here, in the render, never in a scrape."""
        _check_types(families)
        self._render = _Render(families)  # one reference assignment: a scrape sees the old or the new

    def get(self, accept: str | None, accept_encoding: str | None) -> Scrape:
        if accept and _openmetrics_wanted(accept):
            body, content_type = self._render.body(True), OPENMETRICS_CONTENT_TYPE
        else:
            body, content_type = self._render.body(False), CONTENT_TYPE_PLAIN_0_0_4
        if accept_encoding and "gzip" in accept_encoding:
            return Scrape(body.gzipped(), content_type, True)
        return Scrape(body.data, content_type, False)

    @property
    def text(self) -> bytes:
        return self._render.body(False).data
