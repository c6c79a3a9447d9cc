"""Render the shipped Grafana dashboards from real Prometheus data to PNG, for dashboards/README.md.

    .venv/bin/python tools/render_dashboards.py                  # start two simulated nodes + Prometheus, ~2.5 min
    .venv/bin/python tools/render_dashboards.py --seconds 60     # a shorter run
    .venv/bin/python tools/render_dashboards.py --prometheus http://prom:9090 --range 3600 [--instance host:9481]

Grafana is not packaged for this project's machines, so this draws each panel where its gridPos puts it, from
the same queries Grafana would send (interpolated by tests/dashboards/grafana.py, the code the dashboard tests
use): time series as lines or bars, state timelines as coloured bands, stats, bar gauges and tables as text,
with the panels' units, value mappings, legends and the XID annotations. Without --prometheus it starts, with
the end-to-end test helpers, a gpu-triage on the fault scenario (faults injected along the way so that the run
shows all of them), a healthy one, and a Prometheus scraping both, and renders what they produced.

Needs matplotlib (a development dependency; the tests do not).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator, MultipleLocator
from matplotlib.transforms import Bbox
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the dashboard and e2e helpers live under tests/, which is not installed

if TYPE_CHECKING:
    from tests.dashboards.grafana import Context, Dashboard, Panel, Query, Series, Window

OUT = REPO / "dashboards" / "images"
RATE_INTERVAL = 5  # seconds: 4 scrape intervals of the 1 s scrape the helpers configure, as Grafana would pick
# Grafana's dark theme and named colours, so that the pictures read like the real thing.
BG, PANEL, TEXT, MUTED, GRIDLINE = "#111217", "#181b1f", "#ccccdc", "#8e8e9e", "#2c3235"
NAMED = {
    "green": "#73BF69", "dark-green": "#37872D", "orange": "#FF9830", "dark-orange": "#FA6400", "red": "#F2495C",
    "dark-red": "#C4162A", "purple": "#B877D9", "blue": "#5794F2", "yellow": "#FADE2A", "text": TEXT,
    "transparent": PANEL,
}  # fmt: skip
PALETTE = [
    "#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A6", "#705DA0",
    "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477",
]  # fmt: skip
PX_PER_ROW = 30  # Grafana's grid: 24 columns, rows of 30 px
LEGEND_ROW_PX = 12
ROW_PX = 17  # a table row
TICK_STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]  # seconds
WIDTH_PX = 1800
MAX_PNG_BYTES = 900_000

# Faults injected into the faulty node, at these fractions of the run. The scenario's own schedule spreads its
# faults over seven minutes; these bring all of them into a short run. The third field is when the scenario
# itself brings the fault (seconds): a run that lasts that long gets it from the scenario instead. The faults
# without a duration last to the end, so that the tables of "now" show them too.
SCHEDULE: list[tuple[float, dict[str, Any], float | None]] = [
    (0.40, {"gpu": 2, "kind": "thermal_slowdown"}, 60),
    (0.50, {"gpu": 4, "kind": "nvlink_down", "link": 7}, None),
    (0.60, {"gpu": 5, "kind": "ecc_correctable", "count": 3}, 90),
    (0.67, {"gpu": 6, "kind": "ecc_uncorrectable"}, None),
    (0.67, {"gpu": 6, "kind": "xid", "xid": 48}, None),
    (0.68, {"gpu": 6, "kind": "row_remap_pending"}, None),
    (0.80, {"gpu": 1, "kind": "xid", "xid": 13}, 120),
    (0.90, {"gpu": 3, "kind": "xid", "xid": 79}, None),
    (0.90, {"gpu": 3, "kind": "gpu_lost"}, None),
]


def color(name: str | None, fallback: str = TEXT) -> str:
    if not name:
        return fallback
    return NAMED.get(name, name)


# --- units, thresholds, mappings -----------------------------------------------------------------------------


def _number(number: float, decimals: int | None) -> str:
    if decimals is not None:
        return f"{number:.{decimals}f}"
    places = 0 if abs(number) >= 100 else 1 if abs(number) >= 10 else 2  # about three significant digits
    return f"{number:.{places}f}".rstrip("0").rstrip(".") if places else f"{number:.0f}"


def _scaled(value: float, steps: Sequence[tuple[float, str]], decimals: int | None) -> str:
    factor, suffix = next(((f, x) for f, x in steps if abs(value) >= f), steps[-1])
    return _number(value / factor, decimals) + suffix


SI = [(1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k"), (1.0, " ")]
SECONDS = [(1.0, " s"), (1e-3, " ms"), (1e-6, " µs")]
IEC = [(2.0**40, " TiB"), (2.0**30, " GiB"), (2.0**20, " MiB"), (2.0**10, " KiB"), (1.0, " B")]


def fmt(value: float, unit: str, decimals: int | None = None) -> str:
    """A value as Grafana shows it in `unit` (the units the dashboards use)."""
    if math.isnan(value):
        return "NaN"
    if unit == "percentunit":
        return f"{value * 100:.{0 if decimals is None else decimals}f}%"
    if unit == "bytes":
        return _scaled(value, IEC, decimals)
    if unit == "dateTimeAsIso":
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value / 1000))
    suffix = {"watt": "W", "hertz": "Hz", "Bps": "B/s", "kwatth": "kWh", "celsius": "°C", "cps": "c/s", "s": "s"}
    if unit in ("watt", "hertz", "Bps", "cps"):
        return _scaled(value, SI, decimals) + suffix[unit]
    if unit == "s":
        return _scaled(value, SECONDS, decimals) if value else "0 s"
    if unit in ("kwatth", "celsius"):
        return f"{_number(value, decimals)} {suffix[unit]}"
    if unit == "short":
        return _scaled(value, SI, decimals).rstrip()
    return _number(value, decimals)


def threshold_color(thresholds: Mapping[str, Any] | None, value: float) -> str | None:
    if not thresholds:
        return None
    chosen = None
    for step in thresholds.get("steps", []):
        if step["value"] is None or value >= step["value"]:
            chosen = step["color"]
    return chosen


def mapped(mappings: Sequence[Mapping[str, Any]] | None, value: float) -> tuple[str | None, str | None]:
    """(text, colour) that a value mapping gives `value`, or (None, None)."""
    for mapping in mappings or []:
        if mapping["type"] == "value":
            key = str(int(value)) if value == int(value) else str(value)
            hit = mapping["options"].get(key)
            if hit:
                return hit.get("text"), hit.get("color")
        elif mapping["type"] == "range":
            opts = mapping["options"]
            if opts["from"] <= value <= opts["to"]:
                return opts["result"].get("text"), opts["result"].get("color")
    return None, None


@dataclass
class FieldConfig:
    """A panel's field settings, with the overrides for one field (column or series) applied."""

    unit: str
    decimals: int | None
    mappings: list[dict[str, Any]]
    thresholds: dict[str, Any] | None
    display: str | None = None
    hidden: bool = False
    cell: str = "auto"
    negative: bool = False
    dashed: bool = False
    fixed_color: str | None = None

    def text(self, value: float) -> tuple[str, str | None]:
        label, col = mapped(self.mappings, value)
        if label is not None:
            return label, col
        return fmt(value, self.unit, self.decimals), threshold_color(self.thresholds, value)


def field_config(panel: Panel, name: str, ref: str | None = None) -> FieldConfig:
    defaults = panel["fieldConfig"]["defaults"]
    config = FieldConfig(
        unit=defaults.get("unit", "none"),
        decimals=defaults.get("decimals"),
        mappings=list(defaults.get("mappings", [])),
        thresholds=defaults.get("thresholds"),
    )
    for override in panel["fieldConfig"].get("overrides", []):
        matcher = override["matcher"]
        hit = (
            (matcher["id"] == "byName" and matcher["options"] == name)
            or (matcher["id"] == "byFrameRefID" and matcher["options"] == ref)
            or (matcher["id"] == "byRegexp" and matcher["options"].strip("/") in name)
        )
        if not hit:
            continue
        for prop in override["properties"]:
            key, value = prop["id"], prop["value"]
            if key == "displayName":
                config.display = value
            elif key == "unit":
                config.unit = value
            elif key == "decimals":
                config.decimals = value
            elif key == "mappings":
                config.mappings = value
            elif key == "thresholds":
                config.thresholds = value
            elif key == "custom.hidden":
                config.hidden = bool(value)
            elif key == "custom.cellOptions":
                config.cell = value["type"]
            elif key == "custom.transform":
                config.negative = value == "negative-Y"
            elif key == "custom.lineStyle":
                config.dashed = value.get("fill") == "dash"
            elif key == "color":
                config.fixed_color = value.get("fixedColor")
    return config


# --- data ----------------------------------------------------------------------------------------------------


@dataclass
class Rendered:
    """What one target returned, with its series' display names."""

    query: Query
    series: list[Series]
    names: list[str]


def fetch(prometheus: str, queries: Sequence[Query], context: Context, window: Window) -> list[Rendered]:
    from tests.dashboards.grafana import legend, run

    out = []
    for q in queries:
        series = run(prometheus, q, context, window)
        names = [legend(q.legend, s["metric"]) if q.legend else "" for s in series]
        out.append(Rendered(q, series, names))
    return out


def table_rows(panel: Panel, results: Sequence[Rendered]) -> tuple[list[str], list[dict[str, Any]]]:
    """Grafana's table: one row per series, labels as columns, `Value` (or `Value #ref`); merged; organized."""
    many = len(results) > 1
    rows: list[dict[str, Any]] = []
    for result in results:
        value_name = f"Value #{result.query.ref}" if many else "Value"
        for s in result.series:
            row = dict(s["metric"]) | {value_name: float(s["value"][1])}
            labels = {k: v for k, v in row.items() if not k.startswith("Value")}
            for existing in rows:
                shared = labels.keys() & {k for k in existing if not k.startswith("Value")}
                if shared and all(existing[k] == labels[k] for k in shared):
                    existing.update(row)
                    break
            else:
                rows.append(row)
    columns: list[str] = []
    for transformation in panel.get("transformations", []):
        if transformation["id"] == "organize":
            index = transformation["options"]["indexByName"]
            columns = sorted(index, key=index.__getitem__)
    columns = [c for c in columns if not field_config(panel, c).hidden]
    sort = panel["options"].get("sortBy")
    if sort:
        key = next((c for c in columns if (field_config(panel, c).display or c) == sort[0]["displayName"]), None)
        if key:
            rows.sort(key=lambda r: (r.get(key) is None, r.get(key, 0)), reverse=sort[0]["desc"])
    return columns, rows


# --- drawing -------------------------------------------------------------------------------------------------


def style(ax: Axes) -> None:
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(colors=MUTED, labelsize=7, length=0)
    ax.grid(True, color=GRIDLINE, linewidth=0.5)


def blank(ax: Axes) -> None:
    ax.set_facecolor(PANEL)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def no_data(ax: Axes) -> None:
    blank(ax)
    ax.text(0.5, 0.5, "No data", color=MUTED, ha="center", va="center", fontsize=11, transform=ax.transAxes)


def day(ts: float) -> float:
    """A Unix time on the time axis (days since the epoch, matplotlib's date numbers)."""
    return ts / 86400


def time_axis(ax: Axes, window: Window) -> None:
    ax.set_xlim(day(window.start), day(window.end))
    pattern = "%H:%M:%S" if window.end - window.start <= 900 else "%H:%M"  # seconds on a range of minutes
    ax.xaxis.set_major_formatter(lambda v, _: time.strftime(pattern, time.gmtime(round(v * 86400))))
    seconds = window.end - window.start
    step = next((t for t in TICK_STEPS if seconds / t <= 7), TICK_STEPS[-1])
    ax.xaxis.set_major_locator(MultipleLocator(step / 86400))


def legend_layout(names: Sequence[str], width_px: float) -> tuple[int, int]:
    """(columns, rows) of a legend of `names` across `width_px`, at the renderer's legend font."""
    if not names:
        return 1, 0
    column_px = 16 + 4.2 * max(len(n) for n in names)
    columns = max(1, min(len(names), int(width_px // column_px)))
    return columns, math.ceil(len(names) / columns)


def times(s: Series) -> list[float]:
    return [day(float(t)) for t, _ in s["values"]]


def numbers(s: Series) -> list[float]:
    return [float(v) for _, v in s["values"]]


def draw_timeseries(
    ax: Axes, panel: Panel, results: Sequence[Rendered], marks: Sequence[float], window: Window
) -> list[tuple[str, str]]:
    """Draws the series; returns the legend: each series' name and colour."""
    style(ax)
    ax.set_axisbelow(True)  # grid lines behind the bars
    entries: list[tuple[str, str]] = []
    custom = panel["fieldConfig"]["defaults"].get("custom", {})
    bars = custom.get("drawStyle") == "bars"
    unit = panel["fieldConfig"]["defaults"].get("unit", "none")
    lines = 0
    for result in results:
        for s, name in zip(result.series, result.names, strict=True):
            config = field_config(panel, name, result.query.ref)
            ys = [-y if config.negative else y for y in numbers(s)]
            xs = times(s)
            c = color(config.fixed_color, PALETTE[lines % len(PALETTE)])
            if bars:
                ax.bar(xs, ys, width=window.step / 86400, color=c, label=name, linewidth=0)
            else:
                ax.plot(xs, ys, color=c, linewidth=1.1, label=name, linestyle="--" if config.dashed else "-")
            entries.append((name, c))
            lines += 1
    for mark in marks:
        ax.axvline(day(mark), color=NAMED["red"], linewidth=0.8, linestyle=":", alpha=0.9)
    defaults = panel["fieldConfig"]["defaults"]
    if "min" in defaults and not any(field_config(panel, n).negative for r in results for n in r.names):
        ax.set_ylim(bottom=defaults["min"])
    if "max" in defaults:
        ax.set_ylim(top=defaults["max"] * 1.02)
    time_axis(ax, window)
    ax.yaxis.set_major_formatter(lambda v, _: fmt(abs(v), unit))
    ax.yaxis.set_major_locator(MaxNLocator(4))
    return entries


def draw_legend(fig: Figure, box: tuple[float, float, float, float], entries: Sequence[tuple[str, str]]) -> None:
    """A Grafana-style list legend under a graph, in `box` (figure coordinates), cut short with '+N more'."""
    x, y, w, h = box
    if not entries or h <= 0:
        return
    width_px, height_px = w * fig.get_figwidth() * fig.dpi, h * fig.get_figheight() * fig.dpi
    columns, rows = legend_layout([n for n, _ in entries], width_px)
    fitting = max(1, int(height_px // LEGEND_ROW_PX))
    shown = list(entries[: columns * min(rows, fitting)])
    if len(shown) < len(entries):
        shown[-1] = (f"+{len(entries) - len(shown) + 1} more", MUTED)
    for i, (name, c) in enumerate(shown):
        col, row = i % columns, i // columns
        left = x + col * w / columns
        top = y + h - (row + 0.5) * LEGEND_ROW_PX / (fig.get_figheight() * fig.dpi)
        fig.patches.append(
            Rectangle(
                (left, top - 0.002),
                10 / (fig.get_figwidth() * fig.dpi),
                0.004,
                color=c,
                transform=fig.transFigure,
                figure=fig,
            )
        )
        fig.text(left + 14 / (fig.get_figwidth() * fig.dpi), top, name, color=TEXT, fontsize=6, va="center")


def draw_state_timeline(
    ax: Axes, panel: Panel, results: Sequence[Rendered], marks: Sequence[float], window: Window
) -> list[tuple[str, str]]:
    """Draws the rows; returns the legend: each state seen and its colour."""
    style(ax)
    ax.grid(False)
    rows = [(name, s, r.query.ref) for r in results for s, name in zip(r.series, r.names, strict=True)]
    rows.sort(key=lambda item: item[0])
    seen: dict[str, str] = {}
    for i, (name, s, ref) in enumerate(rows):
        config = field_config(panel, name, ref)
        xs, ys = [float(t) for t, _ in s["values"]], numbers(s)
        for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
            end = xs[j + 1] if j + 1 < len(xs) and xs[j + 1] - x <= 2 * window.step else x + window.step
            text, col = config.text(y)
            c = color(col, NAMED["green"])
            seen.setdefault(text, c)
            ax.barh(i, day(end) - day(x), left=day(x), height=0.8, color=c, linewidth=0)
    for mark in marks:
        ax.axvline(day(mark), color=NAMED["red"], linewidth=0.8, linestyle=":", alpha=0.9)
    ax.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=6, color=TEXT)
    ax.invert_yaxis()
    time_axis(ax, window)
    return list(seen.items())


def draw_stat(ax: Axes, panel: Panel, results: Sequence[Rendered]) -> None:
    blank(ax)
    items = []
    for r in results:
        for s, name in zip(r.series, r.names, strict=True):
            config = field_config(panel, name, r.query.ref)
            text, col = config.text(float(s["value"][1]))
            items.append((name, text, color(col, NAMED["blue"])))
    if not items:
        no_data(ax)
        return
    mode = panel["options"].get("textMode", "auto")
    background = panel["options"].get("colorMode") == "background"
    n = len(items)
    for i, (name, text, col) in enumerate(items):
        x0, w = i / n, 1 / n
        filled = background and col != PANEL
        if filled:
            box = Rectangle((x0 + 0.01, 0.04), w - 0.02, 0.92, color=col, transform=ax.transAxes, alpha=0.85)
            ax.add_patch(box)
        fg = "#ffffff" if filled else TEXT if col == PANEL else col
        size = 15 if n <= 2 else 12 if n <= 4 else 9
        if mode == "name":
            ax.text(x0 + w / 2, 0.5, name, ha="center", va="center", color=TEXT, fontsize=8, transform=ax.transAxes)
            continue
        ax.text(x0 + w / 2, 0.42, text, ha="center", va="center", color=fg, fontsize=size, weight="bold",
                transform=ax.transAxes)  # fmt: skip
        if mode != "value":
            ax.text(x0 + w / 2, 0.8, name, ha="center", va="center", color=fg if filled else TEXT, fontsize=6.5,
                    transform=ax.transAxes)  # fmt: skip


def draw_bargauge(ax: Axes, panel: Panel, results: Sequence[Rendered], width_px: float) -> None:
    blank(ax)
    items = [
        (name, float(s["value"][1]), r.query.ref) for r in results for s, name in zip(r.series, r.names, strict=True)
    ]
    if not items:
        no_data(ax)
        return
    top = max((v for _, v, _ in items), default=1) or 1
    n = len(items)
    for i, (name, value, ref) in enumerate(items):
        config = field_config(panel, name, ref)
        text, col = config.text(value)
        y = 1 - (i + 0.5) / n
        h = min(0.8 / n, 0.12)
        fits = int(0.42 * width_px / 4.4)  # characters of the 6.5 pt font in the name's share of the width
        shown = name if len(name) <= fits else name[: fits - 1] + "…"
        ax.text(0.0, y, shown, ha="left", va="center", color=TEXT, fontsize=6.5, transform=ax.transAxes)
        left, span = 0.44, 0.36
        ax.add_patch(Rectangle((left, y - h / 2), span, h, color=GRIDLINE, transform=ax.transAxes))
        bar = Rectangle(
            (left, y - h / 2), span * value / top, h, color=color(col, NAMED["blue"]), transform=ax.transAxes
        )
        ax.add_patch(bar)
        ax.text(0.99, y, text, ha="right", va="center", color=color(col, NAMED["blue"]), fontsize=7, weight="bold",
                transform=ax.transAxes)  # fmt: skip


def draw_table(ax: Axes, panel: Panel, results: Sequence[Rendered], height_px: float) -> None:
    blank(ax)
    columns, rows = table_rows(panel, results)
    if not rows:
        no_data(ax)
        return
    configs = {c: field_config(panel, c) for c in columns}
    max_rows = max(1, int(height_px / ROW_PX) - 2)
    header = [configs[c].display or c for c in columns]
    cells, colors = [], []
    for row in rows[:max_rows]:
        texts, tints = [], []
        for c in columns:
            value = row.get(c)
            if isinstance(value, float):
                text, col = configs[c].text(value)
                tint = color(col) if col and configs[c].cell in ("color-background", "color-text") else None
            else:
                text, tint = ("" if value is None else str(value)), None
            texts.append(text if len(text) <= 42 else text[:40] + "…")
            tints.append((tint, configs[c].cell))
        cells.append(texts)
        colors.append(tints)
    used = min(1.0, (len(cells) + 1) * ROW_PX / height_px)  # rows keep their height; the rest stays empty
    table = ax.table(
        cellText=cells, colLabels=header, cellLoc="left", colLoc="left", bbox=Bbox.from_bounds(0.0, 1 - used, 1.0, used)
    )
    table.auto_set_font_size(False)
    table.set_fontsize(6.5)
    widths = [max(len(header[i]), *(len(r[i]) for r in cells)) + 2 for i in range(len(columns))]
    total = sum(widths)
    for (r, i), cell in table.get_celld().items():
        cell.set_edgecolor(GRIDLINE)
        cell.set_width(widths[i] / total)
        if r == 0:
            cell.set_facecolor("#22252b")
            cell.get_text().set_color(MUTED)
            cell.get_text().set_fontweight("bold")
            continue
        tint, kind = colors[r - 1][i]
        cell.set_facecolor(PANEL)
        cell.get_text().set_color(TEXT)
        if tint and kind == "color-background":
            cell.set_facecolor(tint)
            cell.get_text().set_color("#ffffff")
        elif tint and kind == "color-text":
            cell.get_text().set_color(tint)
    if len(rows) > max_rows:
        ax.text(1, 0, f"+{len(rows) - max_rows} more rows", ha="right", va="bottom", color=MUTED, fontsize=6,
                transform=ax.transAxes)  # fmt: skip


class Canvas:
    """A figure laid out in pixels from the top left, as Grafana's grid is."""

    def __init__(self, height_px: float) -> None:
        self.height_px = height_px
        self.fig = plt.figure(figsize=(WIDTH_PX / 100, height_px / 100), dpi=100, facecolor=BG)

    def box(self, left: float, top: float, width: float, height: float) -> tuple[float, float, float, float]:
        """Figure coordinates of a box given in pixels."""
        return (left / WIDTH_PX, 1 - (top + height) / self.height_px, width / WIDTH_PX, height / self.height_px)

    def axes(self, left: float, top: float, width: float, height: float) -> Axes:
        return self.fig.add_axes(self.box(left, top, width, height))

    def text(self, left: float, top: float, text: str, **style: Any) -> None:
        self.fig.text(left / WIDTH_PX, 1 - top / self.height_px, text, **style)


def draw_panel(
    canvas: Canvas, panel: Panel, results: Sequence[Rendered], marks: Sequence[float], window: Window
) -> None:
    g = panel["gridPos"]
    col_px = WIDTH_PX / 24
    left, top = g["x"] * col_px + 3, (g["y"] + 1.5) * PX_PER_ROW + 3  # 1.5 rows: the dashboard's title band
    width, height = g["w"] * col_px - 6, g["h"] * PX_PER_ROW - 6
    if panel["type"] == "row":
        canvas.text(left, top + height / 2, panel["title"], color=TEXT, fontsize=11, weight="bold", va="center")
        return
    blank(canvas.axes(left, top, width, height))
    canvas.text(left + 8, top + 11, panel["title"], color=TEXT, fontsize=8, weight="bold", va="center")
    kind = panel["type"]
    inner_top, inner_height = top + 22, height - 26
    names = [n for r in results for n in r.names]
    legend_px = 0.0
    if kind == "timeseries":
        _, rows = legend_layout(names, width - 16)
        legend_px = min(rows * LEGEND_ROW_PX + 4, inner_height * 0.45)
    elif kind == "state-timeline":
        legend_px = LEGEND_ROW_PX + 4
    axis_left = {"timeseries": 48, "state-timeline": 14 + 4.3 * max((len(n) for n in names), default=4)}.get(kind, 8)
    axis_bottom = 16 if kind in ("timeseries", "state-timeline") else 0
    graph_height = inner_height - legend_px - axis_bottom
    ax = canvas.axes(left + axis_left, inner_top, width - axis_left - 10, graph_height)
    entries: list[tuple[str, str]] = []
    if not any(r.series for r in results):
        no_data(ax)
    elif kind == "timeseries":
        entries = draw_timeseries(ax, panel, results, marks, window)
    elif kind == "state-timeline":
        entries = draw_state_timeline(ax, panel, results, marks, window)
    elif kind == "stat":
        draw_stat(ax, panel, results)
    elif kind == "bargauge":
        draw_bargauge(ax, panel, results, width - axis_left - 10)
    elif kind == "table":
        draw_table(ax, panel, results, graph_height)
    else:
        raise ValueError(f"no renderer for {kind} panels")
    legend_top = inner_top + graph_height + axis_bottom
    draw_legend(canvas.fig, canvas.box(left + 8, legend_top, width - 16, legend_px), entries)


def render(prometheus: str, dashboard: Dashboard, name: str, context: Context, window: Window) -> Figure:
    from tests.dashboards.grafana import panels, queries, run, values

    every = queries(name, dashboard)
    annotations = [s for q in every if q.panel is None for s in run(prometheus, q, context, window)]
    marks = sorted({v / 1000 for s in annotations for v in values(s)})  # the annotation's value is its time
    laid = panels(dashboard, rows=True)
    canvas = Canvas((max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in laid) + 2) * PX_PER_ROW)
    canvas.text(12, PX_PER_ROW * 0.7, dashboard["title"], color=TEXT, fontsize=14, weight="bold", va="center")
    chosen = ", ".join(f"{k}={'|'.join(v) or 'All'}" for k, v in context.values.items())
    span = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(window.start))
    span += time.strftime(" to %H:%M:%S UTC", time.gmtime(window.end))
    canvas.text(WIDTH_PX - 12, PX_PER_ROW * 0.7, f"{chosen} · {span}", color=MUTED, fontsize=8, ha="right", va="center")
    for panel in laid:
        draw_panel(
            canvas, panel, fetch(prometheus, [q for q in every if q.panel is panel], context, window), marks, window
        )
    return canvas.fig


def save(fig: Figure, path: Path) -> int:
    """Write a palette PNG (the pictures are flat colours: 256 of them lose nothing visible, and most bytes)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", facecolor=BG)
    plt.close(fig)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
    return path.stat().st_size


# --- a fleet to draw -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    prometheus: str
    window: Window
    node: str | None  # the instance the node dashboard shows; None: All


@contextlib.contextmanager
def simulated(seconds: float) -> Iterator[Source]:
    """Two simulated nodes (one through faults, one healthy) and a Prometheus, run for `seconds`."""
    from tests.dashboards.grafana import Window
    from tests.e2e.servers import gpu_triage, prometheus, query, wait_for

    with tempfile.TemporaryDirectory(prefix="render-dashboards-") as tmp, contextlib.ExitStack() as stack:
        base = Path(tmp)
        (base / "faulty").mkdir()
        (base / "healthy").mkdir()
        faulty = stack.enter_context(gpu_triage(base / "faulty", scenario="h100-faults"))
        healthy = stack.enter_context(gpu_triage(base / "healthy"))
        targets = [s.url.removeprefix("http://") for s in (faulty, healthy)]
        prom = stack.enter_context(prometheus(base, targets))
        wait_for(lambda: len(query(prom, "up == 1")) == 2, what="both daemons scraped")
        start = time.time()
        for at, fault, scenario_at in SCHEDULE:
            if scenario_at is not None and scenario_at <= seconds:
                continue
            _sleep_until(start + at * seconds, start, seconds)
            httpx.post(f"{faulty.url}/api/v1/sim/faults", json=fault, timeout=5).raise_for_status()
            print(f"  t={time.time() - start:5.0f}s  injected {fault}", file=sys.stderr)
        _sleep_until(start + seconds, start, seconds)
        end = time.time()
        yield Source(prom.url, Window(start, end, step=max(1.0, round((end - start) / 300))), targets[0])


def _sleep_until(when: float, start: float, seconds: float) -> None:
    while (left := when - time.time()) > 0:
        print(f"  t={time.time() - start:5.0f}s of {seconds:.0f}s", file=sys.stderr, end="\r")
        time.sleep(min(left, 5.0))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", help="render from this Prometheus instead of starting a simulated fleet")
    parser.add_argument("--range", type=int, default=3600, help="with --prometheus: seconds up to now to show")
    parser.add_argument("--instance", help="the node the node dashboard shows (default: the faulty simulated node)")
    parser.add_argument("--seconds", type=float, default=150, help="how long the simulated fleet runs")
    parser.add_argument("--out", type=Path, default=OUT, help="where the PNGs go")
    args = parser.parse_args(argv)
    # A plain `kill` must still stop the daemons and Prometheus this started: make it unwind like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tests.dashboards.grafana import FILES, Context, Window, load

    with contextlib.ExitStack() as stack:
        if args.prometheus:
            end = time.time()
            window = Window(end - args.range, end, step=max(1.0, round(args.range / 300)))
            source = Source(args.prometheus.rstrip("/"), window, args.instance)
        else:
            print(f"running two simulated nodes and Prometheus for {args.seconds:.0f}s", file=sys.stderr)
            source = stack.enter_context(simulated(args.seconds))
        node = args.instance or source.node
        for name in FILES:
            dashboard = load(name)
            instance = [node] if node and name == "gpu-triage-node.json" else []
            context = Context(
                values={"job": [], "instance": instance, "gpu": []},
                rate_interval=f"{max(RATE_INTERVAL, 4 * source.window.step):g}s",
                interval=f"{source.window.step:g}s",
                range_seconds=source.window.seconds,
            )
            path = args.out / name.replace(".json", ".png")
            size = save(render(source.prometheus, dashboard, name, context, source.window), path)
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} ({size // 1024} KiB)")
            if size > MAX_PNG_BYTES:
                print(f"  {path.name} is over {MAX_PNG_BYTES // 1000} kB: too big to commit", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
