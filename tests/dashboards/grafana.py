"""The shipped dashboards as data, and what Grafana does with their queries: interpolate, run, name the series.

Used by the dashboard tests and by tools/render_dashboards.py, so that the pictures show exactly what the
tests check. Grafana itself is not packaged for this project's machines; these are the few of its rules the
dashboards rely on, written down.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
FILES = ("gpu-triage-fleet.json", "gpu-triage-node.json")
PROMETHEUS_DS = {"type": "prometheus", "uid": "${datasource}"}
RATE_FUNCTIONS = {"rate", "irate", "increase"}

Dashboard = dict[str, Any]
Panel = dict[str, Any]
Series = dict[str, Any]


def load(name: str) -> Dashboard:
    result: Dashboard = json.loads((DASHBOARDS / name).read_text())
    return result


def all_dashboards() -> dict[str, Dashboard]:
    return {name: load(name) for name in FILES}


def panels(dashboard: Dashboard, *, rows: bool = False) -> list[Panel]:
    """Every panel in layout order, those inside collapsed rows too; rows themselves only when asked."""
    out: list[Panel] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            if rows:
                out.append(panel)
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


@dataclass(frozen=True)
class Query:
    """One PromQL query of a dashboard: a panel's target or an annotation."""

    dashboard: str
    panel: Panel | None  # None for an annotation
    name: str  # what a failure message calls it
    ref: str
    expr: str
    legend: str | None
    instant: bool
    table: bool

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.name} [{self.ref}]"


def queries(name: str, dashboard: Dashboard) -> list[Query]:
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            out.append(
                Query(
                    dashboard=name,
                    panel=panel,
                    name=f"panel {panel['id']} {panel['title']!r}",
                    ref=target["refId"],
                    expr=target["expr"],
                    legend=target.get("legendFormat"),
                    instant=bool(target.get("instant")) and not target.get("range"),
                    table=target.get("format") == "table",
                )
            )
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            out.append(
                Query(
                    name,
                    None,
                    f"annotation {annotation['name']!r}",
                    "annotation",
                    annotation["expr"],
                    None,
                    False,
                    False,
                )
            )
    return out


def all_queries() -> list[Query]:
    return [q for name, dashboard in all_dashboards().items() for q in queries(name, dashboard)]


def walk(node: Any, path: str = "$") -> Iterator[tuple[str, Any]]:
    """Every (path, value) in a JSON document."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


# --- interpolation -----------------------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


def _regex_escape(value: str) -> str:
    # Grafana's prometheusSpecialRegexEscape: the value lands inside a "..." PromQL string used as a regex,
    # so a backslash is doubled once for the regex and once for the string.
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(), value.replace("\\", "\\\\\\\\"))


@dataclass(frozen=True)
class Context:
    """What Grafana knows when it runs a query: variable values and the time range."""

    values: Mapping[str, Sequence[str]]  # variable -> selected values; absent or empty means All
    rate_interval: str = "5m"
    interval: str = "1m"
    range_seconds: int = 3600

    def builtin(self, name: str) -> str | None:
        return {
            "__rate_interval": self.rate_interval,
            "__interval": self.interval,
            "__range": f"{self.range_seconds}s",
            "__range_s": str(self.range_seconds),
            "__range_ms": str(self.range_seconds * 1000),
        }.get(name)


def interpolate(expr: str, context: Context, all_value: str = ".+") -> str:
    """`expr` with its variables replaced the way Grafana's Prometheus data source does for multi-value ones."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(4)
        if name.isdigit():
            return match.group(0)  # label_replace's $1: no variable of the dashboard's, so Grafana leaves it
        builtin = context.builtin(name)
        if builtin is not None:
            return builtin
        values = list(context.values.get(name, ()))
        if not values:
            return all_value
        escaped = [_regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return _VARIABLE.sub(replace, expr)


def legend(template: str, labels: Mapping[str, str]) -> str:
    """A series' name from a legend template; a label the series lacks renders empty, as in Grafana."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def legend_labels(template: str) -> list[str]:
    return re.findall(r"\{\{\s*(\w+)\s*\}\}", template)


# --- running queries ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The dashboard's time range as Grafana would query it."""

    start: float
    end: float
    step: float

    @property
    def seconds(self) -> int:
        return round(self.end - self.start)


def run(
    prometheus: str, query: Query, context: Context, window: Window, client: httpx.Client | None = None
) -> list[Series]:
    """The query's result as Grafana asks for it: instant at the range's end, or over the range."""
    expr = interpolate(query.expr, context)
    get = client.get if client is not None else httpx.get
    if query.instant or query.table:
        answer = get(f"{prometheus}/api/v1/query", params={"query": expr, "time": window.end}, timeout=15)
    else:
        params: dict[str, str | float] = {"query": expr, "start": window.start, "end": window.end, "step": window.step}
        answer = get(f"{prometheus}/api/v1/query_range", params=params, timeout=15)
    body = answer.json()
    if body.get("status") != "success":
        raise AssertionError(f"{query}: Prometheus refused the query: {body.get('error')}\n{expr}")
    result: list[Series] = body["data"]["result"]
    return result


def values(series: Series) -> list[float]:
    """The numbers of a series from an instant or a range query."""
    points = series["values"] if "values" in series else [series["value"]]
    return [float(v) for _, v in points]
