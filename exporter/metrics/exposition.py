"""Rendering metric families on demand into cached bytes, and serving those bytes.

A scrape picks a cached body by its Accept header (classic text or OpenMetrics) and, when the
client takes gzip, a compressed copy made once per render. The daemon says at each change (every
poll, every XID batch) how to build the families; they are built, and their bytes encoded, by the
first scrape that needs them, once per change whatever the number of scrapes: the daemon changes
every 1-5 s while Prometheus scrapes every 15 s to 1 min, so building at each change would be mostly
for nobody. Building reads only what the daemon holds (the last snapshot, the journal), never the
driver.
"""

from __future__ import annotations

import gzip
import logging
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

log = logging.getLogger(__name__)
Build = Callable[[], list[Metric]]

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


def format_value(v: float) -> str:
    """A sample's value as prometheus_client writes it."""
    # Most of a page is 0s and 1s (state sets, link states): skip the general formatter for them.
    # -0.0 == 0.0, but prometheus_client writes it with its sign.
    if v == 1.0:
        return "1.0"
    if v == 0.0 and math.copysign(1.0, v) > 0:
        return "0.0"
    # floatToGoString is repr() but for infinities, NaN and Go's exponent from 1e7 on (a "." past the 7th place).
    text = repr(v)
    dot = text.find(".")
    if 0 < dot <= 6:
        return text
    if dot > 6 and v > 0:  # floatToGoString's own words, without its checks again: a page has thousands of these
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return floatToGoString(v)  # type: ignore[no-untyped-call,no-any-return]


# An int below 2**53 in magnitude is a float exactly, and repr() writes such a float with all its digits.
_EXACT = 1 << 53
_EXPONENT = tuple(f"e+{digits - 1:02d}" for digits in range(17))  # Go's exponent, by how many digits an int has


def format_number(v: float) -> str:
    """format_value(float(v)), several times sooner for an int (the counters: most of what moves on a page)."""
    if type(v) is not int:  # a float, or a bool
        return format_value(float(v))
    if -_EXACT < v < 1_000_000:
        return f"{v}.0"
    if 0 < v < _EXACT:  # from 1e6 on, Go's exponent: 1234567 is 1.234567e+06
        text = str(v)
        digits = text.rstrip("0")
        return f"{digits[0]}.{digits[1:]}{_EXPONENT[len(text)]}" if len(digits) > 1 else digits + _EXPONENT[len(text)]
    return format_value(float(v))


def series_head(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """What comes before a sample's value: its name and its labels, sorted and escaped, then a space."""
    pairs = sorted(labels)
    if not pairs:
        return f"{name} "
    return name + "{" + ",".join([f'{k}="{_label_value(v)}"' for k, v in pairs]) + "} "


def _sample_lines(metric: Metric) -> bytes:
    if isinstance(metric, Preformatted):
        return metric.data
    return "".join(
        [f"{series_head(s.name, s.labels.items())}{format_value(s.value)}\n" for s in metric.samples]
    ).encode()


class Preformatted(Metric):
    """A family whose sample lines are written already (series_head + format_value + newline, each; `data` is
    them encoded), for the families with thousands of series on a big node. Its `samples` are read back from
    those lines, for what wants them as values (tests, prometheus_client's own encoders)."""

    def __init__(self, like: Metric, data: bytes) -> None:
        super().__init__(like.name, like.documentation, like.type, like.unit)
        self.data = data

    @property
    def samples(self) -> list[Sample]:
        from prometheus_client.parser import text_string_to_metric_families

        (part,) = _parts([self])
        page = _text([part])
        return [s for family in text_string_to_metric_families(page.decode()) for s in family.samples]

    @samples.setter
    def samples(self, _: list[Sample]) -> None:
        pass  # Metric.__init__ sets it to []: the lines are the samples


def encode(families: Iterable[Metric]) -> tuple[bytes, bytes]:
    """(classic text 0.0.4, OpenMetrics 1.0.0) for `families`."""
    families = list(families)
    _check_types(families)
    parts = _parts(families)
    return _text(parts), _openmetrics(parts)


# Per family: (its name in the classic format, TYPE there, escaped help, OpenMetrics name, type, unit, samples)
_Part = tuple[str, str, str, str, str, str, bytes]


def _check_types(families: list[Metric]) -> None:
    for metric in families:
        if metric.type not in _TEXT_TYPES:
            raise ValueError(f"{metric.name}: metric type {metric.type} is not supported by this encoder")


def _parts(families: list[Metric]) -> list[_Part]:
    """Families whose types `_check_types` passed."""
    out: list[_Part] = []
    for metric in families:
        name = metric.name + _TEXT_SUFFIX.get(metric.type, "")
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        # Encoded once for both formats: the sample lines are most of the page.
        out.append((name, _TEXT_TYPES[metric.type], doc, metric.name, metric.type, metric.unit, _sample_lines(metric)))
    return out


def _text(parts: list[_Part]) -> bytes:
    out: list[bytes] = []
    for n, kind, doc, *_, samples in parts:
        out += (f"# HELP {n} {doc}\n# TYPE {n} {kind}\n".encode(), samples)
    return b"".join(out)


def _openmetrics(parts: list[_Part]) -> bytes:
    out: list[bytes] = []
    for _, _, doc, name, kind, unit, samples in parts:
        om_doc = doc.replace('"', r"\"")
        units = f"# UNIT {name} {unit}\n" if unit else ""
        out += (f"# HELP {name} {om_doc}\n# TYPE {name} {kind}\n{units}".encode(), samples)
    out.append(b"# EOF\n")
    return b"".join(out)


class _Render:
    """One change's families, built on first demand and encoded in each format, each at most once.

    A build that fails (a bug) is logged and the last render that built serves instead: a scrape gets the
    page as it was rather than an error, and the next change tries again."""

    def __init__(self, build: Build, previous: _Render | None) -> None:
        self._build: Build | None = build
        # Until this one has built: the last render that did, to serve should this one fail. Never an unbuilt one,
        # so that a daemon nobody scrapes for a month holds two renders, not a chain of them.
        self._previous: _Render | None = previous if previous is None or previous.built else previous._previous
        self._parts: list[_Part] | None = None
        self._bodies: dict[bool, _Body] = {}
        self._lock = threading.RLock()

    @property
    def built(self) -> bool:
        return self._parts is not None

    def ready(self, openmetrics: bool) -> _Body | None:
        return self._bodies.get(openmetrics)

    def parts(self) -> list[_Part] | None:
        """Built on the first call; None only when this render failed and none before it built."""
        with self._lock:
            if self._build is not None:
                build, self._build = self._build, None
                try:
                    families = build()
                    _check_types(families)
                    self._parts = _parts(families)
                except Exception:
                    log.exception("building the metrics page failed; serving the last one built")
                    self._parts = self._previous.parts() if self._previous is not None else None
                self._previous = None
            return self._parts

    def body(self, openmetrics: bool) -> _Body:
        body = self._bodies.get(openmetrics)
        if body is None:
            with self._lock:
                if (body := self._bodies.get(openmetrics)) is None:
                    parts = self.parts() or []
                    body = _Body((_openmetrics if openmetrics else _text)(parts))
                    self._bodies[openmetrics] = body
        return body


@dataclass
class _Body:
    data: bytes
    _gzipped: bytes | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ready_gzipped(self) -> bytes | None:
        return self._gzipped

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
        self._render = _Render(list, None)

    def update(self, families: Build | list[Metric]) -> None:
        """Swap in the families of a change, or how to build them when a scrape asks."""
        build: Build = families if callable(families) else lambda: families
        # One reference assignment: a scrape sees the old render or the new. The old one stays reachable only
        # until the new one has built.
        self._render = _Render(build, self._render)

    def _pick(self, accept: str | None) -> tuple[bool, str]:
        if accept and _openmetrics_wanted(accept):
            return True, OPENMETRICS_CONTENT_TYPE
        return False, CONTENT_TYPE_PLAIN_0_0_4

    def cached(self, accept: str | None, accept_encoding: str | None) -> Scrape | None:
        """The scrape's answer if it is made already (no building, no encoding), else None."""
        openmetrics, content_type = self._pick(accept)
        body = self._render.ready(openmetrics)
        if body is None:
            return None
        if accept_encoding and "gzip" in accept_encoding:
            gzipped = body.ready_gzipped()
            return None if gzipped is None else Scrape(gzipped, content_type, True)
        return Scrape(body.data, content_type, False)

    def get(self, accept: str | None, accept_encoding: str | None) -> Scrape:
        openmetrics, content_type = self._pick(accept)
        body = self._render.body(openmetrics)
        if accept_encoding and "gzip" in accept_encoding:
            return Scrape(body.gzipped(), content_type, True)
        return Scrape(body.data, content_type, False)

    @property
    def text(self) -> bytes:
        return self._render.body(False).data
