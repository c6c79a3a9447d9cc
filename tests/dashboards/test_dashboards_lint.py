"""Structure lint for the shipped dashboards: the grafana/dashboard-linter rules that matter, and this project's.

The linter itself ships as GitHub release binaries that CI cannot fetch, so its rules that catch real breakage
are here: the datasource variable on every panel and target (a hard-coded uid or a `${DS_…}` input breaks file
provisioning), job/instance/gpu variables and matchers, units, legends, and counters only under
rate/increase with `$__rate_interval` windows.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.diagnosis.core.playbooks import action_playbook, load_playbooks
from tests.conftest import REPO
from tests.dashboards import promql
from tests.dashboards.grafana import (
    DASHBOARDS,
    FILES,
    PROMETHEUS_DS,
    RATE_FUNCTIONS,
    Dashboard,
    Query,
    all_dashboards,
    all_queries,
    legend_labels,
    load,
    panels,
    walk,
)

UIDS = {"gpu-triage-fleet.json": "gpu-triage-fleet", "gpu-triage-node.json": "gpu-triage-node"}
# Grafana unit ids the dashboards may use (a typo'd unit silently shows raw numbers).
UNITS = {
    "none", "short", "percent", "percentunit", "bytes", "decbytes", "watt", "kwatth", "joule", "celsius", "hertz",
    "Bps", "binBps", "cps", "ops", "s", "ms", "dtdurations", "dateTimeAsIso", "dateTimeFromNow",
}  # fmt: skip
GOLDEN = REPO / "tests" / "golden" / "metrics-sim.prom"
# Series Prometheus makes itself for every target; the daemon does not export them.
PROMETHEUS_SERIES = {"up"}
# `C unless C offset W`: the counter series that are newer than W. PromQL's increase() cannot see the step
# from "no series" to the first value, and an XID counter is born at 1 with its first XID, so the XID panels
# count new series in full; this is the one place a counter may stand outside rate()/increase().
NEW_SERIES = re.compile(r"\((\w+\{[^{}]*\}) unless \1 offset (\$__rate_interval|\$__range)\)")

DASHBOARD_NAMES = pytest.mark.parametrize("name", FILES)
QUERIES = all_queries()
BY_QUERY = pytest.mark.parametrize("query", QUERIES, ids=str)


def golden_metrics() -> set[str]:
    return set(re.findall(r"^# TYPE (\w+) ", GOLDEN.read_text(), re.MULTILINE))


def variables(dashboard: Dashboard) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def test_both_dashboards_are_shipped() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(FILES)


@DASHBOARD_NAMES
def test_identity_and_no_import_inputs(name: str) -> None:
    dashboard = load(name)
    text = (DASHBOARDS / name).read_text()
    assert dashboard["uid"] == UIDS[name]
    assert dashboard["title"].startswith("gpu-triage / ")
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert "gpu-triage" in dashboard["tags"]
    # An "export for sharing externally" leaves __inputs and ${DS_…}: only the import UI resolves those.
    assert "__inputs" not in dashboard
    assert "__requires" not in dashboard
    assert "${DS_" not in text and "$DS_" not in text


@DASHBOARD_NAMES
def test_panel_ids_are_unique_and_panels_do_not_overlap(name: str) -> None:
    every = panels(load(name), rows=True)
    ids = Counter(p["id"] for p in every)
    assert [i for i, n in ids.items() if n > 1] == []
    cells: dict[tuple[int, int], int] = {}
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap at {(x, y)}"


@DASHBOARD_NAMES
def test_datasource_variable(name: str) -> None:
    kinds = [v for v in load(name)["templating"]["list"] if v["type"] == "datasource"]
    assert len(kinds) == 1
    (ds,) = kinds
    assert (ds["name"], ds["query"], ds["label"]) == ("datasource", "prometheus", "Data Source")
    assert ds.get("current") in ({}, None), "a saved current value pins one Grafana's datasource uid"


@DASHBOARD_NAMES
@pytest.mark.parametrize("var", ["job", "instance", "gpu"])
def test_query_variables(name: str, var: str) -> None:
    v = variables(load(name))[var]
    assert v["type"] == "query"
    assert v["datasource"] == PROMETHEUS_DS
    assert (v["multi"], v["includeAll"], v["allValue"]) == (True, True, ".+")
    assert v["refresh"] == 2, "refresh on time range change, so a new node shows up"
    query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
    assert query == v["definition"]
    assert query.startswith("label_values(") and query.endswith(f", {var})")
    needs = {"job": [], "instance": ["$job"], "gpu": ["$job", "$instance"]}[var]
    for dependency in needs:
        assert dependency in query


@DASHBOARD_NAMES
def test_every_datasource_reference_is_the_variable(name: str) -> None:
    dashboard = load(name)
    for path, value in walk(dashboard):
        if not path.endswith(".datasource"):
            continue
        if path.startswith("$.annotations.list") and isinstance(value, dict) and value.get("type") == "grafana":
            continue  # Grafana's built-in "Annotations & Alerts" query
        assert value == PROMETHEUS_DS, f"{path} = {value!r}"
    for panel in panels(dashboard):
        assert panel["datasource"] == PROMETHEUS_DS, panel["title"]
        assert panel["targets"], f"{panel['title']} has no queries"
        for target in panel["targets"]:
            assert target["datasource"] == PROMETHEUS_DS, (panel["title"], target["refId"])


@DASHBOARD_NAMES
def test_panels_have_titles_descriptions_and_units(name: str) -> None:
    for panel in panels(load(name)):
        assert panel["title"].strip() and panel["description"].strip(), panel["id"]
        assert panel["fieldConfig"]["defaults"].get("unit") in UNITS, panel["title"]
        for override in panel["fieldConfig"]["overrides"]:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    assert prop["value"] in UNITS, panel["title"]


@DASHBOARD_NAMES
def test_query_kinds_fit_the_panels(name: str) -> None:
    for panel in panels(load(name)):
        for target in panel["targets"]:
            where = (panel["title"], target["refId"])
            if panel["type"] == "table":
                assert target.get("format") == "table" and target.get("instant") is True, where
            elif panel["type"] in ("stat", "bargauge"):
                assert target.get("instant") is True and target.get("range") is False, where
            else:
                assert target.get("range") is True and target.get("instant") is False, where


@DASHBOARD_NAMES
def test_legends_name_their_series(name: str) -> None:
    for panel in panels(load(name)):
        for target in panel["targets"]:
            if target.get("format") == "table":
                continue  # tables show labels as columns
            template = target.get("legendFormat", "")
            assert template and template != "__auto", (panel["title"], target["refId"])
            assert legend_labels(template), f"{panel['title']}: legend {template!r} has no {{{{label}}}}"


@BY_QUERY
def test_rate_windows_use_rate_interval(query: Query) -> None:
    found = promql.selectors(query.expr)
    under_rate = [s for s in found if s.function in RATE_FUNCTIONS]
    # Every rate()/increase() takes a range selector directly (no subqueries, which hide their window).
    assert len(under_rate) == len(promql.calls(query.expr, RATE_FUNCTIONS)), query.expr
    for s in under_rate:
        allowed = {"$__rate_interval", "$__range"} if s.function == "increase" else {"$__rate_interval"}
        assert s.range in allowed, f"{query}: {s.function}() over [{s.range}]"


@BY_QUERY
def test_counters_only_under_rate_and_increase(query: Query) -> None:
    idioms = [(m.start(), m.end()) for m in NEW_SERIES.finditer(query.expr)]
    for s in promql.selectors(query.expr):
        assert s.metric is not None, f"{query}: a selector without a metric name"
        counter = s.metric.endswith("_total")
        if s.function in RATE_FUNCTIONS:
            assert counter, f"{query}: {s.function}() over the gauge {s.metric}"
        elif counter:
            assert any(a <= s.start and s.end <= b for a, b in idioms), f"{query}: counter {s.metric} used raw"


@BY_QUERY
def test_selectors_filter_by_job_instance_and_gpu(query: Query) -> None:
    for s in promql.selectors(query.expr):
        assert s.matches("job", "=~", "$job"), f'{query}: {s.metric} without job=~"$job"'
        assert s.matches("instance", "=~", "$instance"), f'{query}: {s.metric} without instance=~"$instance"'
        if s.metric and s.metric.startswith("nvidia_gpu_"):
            # XIDs the kernel log could not tie to a GPU carry gpu="": the XID panels keep them ($gpu|).
            gpu = s.matches("gpu", "=~", "$gpu") or (
                s.metric.startswith("nvidia_gpu_xid_") and s.matches("gpu", "=~", "$gpu|")
            )
            assert gpu, f'{query}: {s.metric} without gpu=~"$gpu"'


def test_every_metric_exists_on_the_daemons_metrics_page() -> None:
    known = golden_metrics() | PROMETHEUS_SERIES
    used = {s.metric for q in QUERIES for s in promql.selectors(q.expr)}
    for dashboard in all_dashboards().values():
        for v in dashboard["templating"]["list"]:
            if v["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), \w+\)", v["definition"])
                assert match, v["definition"]
                used |= {s.metric for s in promql.selectors(match.group(1))}
    assert used - known == set()
    assert len(used) > 40  # the panels cover most of /metrics, not a handful


def test_runbook_links_map_every_action_to_its_playbook() -> None:
    expected = {(a.value, action_playbook(a)) for a in Action}
    served = set(load_playbooks())
    mapped = [q for q in QUERIES if '"playbook"' in q.expr]
    assert {q.name for q in mapped} >= {"panel 6 'GPUs needing action now'", "panel 7 'GPUs: health, action, identity'"}
    for query in mapped:
        pairs = set(re.findall(r'"playbook", "([\w-]+)", "action", "(\w+)"\)', query.expr))
        assert {(action, playbook) for playbook, action in pairs} == expected, query
        assert {playbook for playbook, _ in pairs} <= served


@DASHBOARD_NAMES
def test_links_point_at_shipped_dashboards_and_shown_fields(name: str) -> None:
    dashboard = load(name)
    uids = set(UIDS.values())
    for path, value in walk(dashboard):
        if isinstance(value, str) and "/d/" in value:
            uid = value.split("/d/", 1)[1].split("/", 1)[0].split("?", 1)[0]
            assert uid in uids, f"{path} links to unknown dashboard {uid}"
    for panel in panels(dashboard):
        columns = set()
        for t in panel.get("transformations", []):
            if t["id"] == "organize":
                columns = set(t["options"]["indexByName"])
        for path, value in walk(panel):
            if isinstance(value, str):
                for field in re.findall(r"\$\{__data\.fields\.(\w+)\}", value):
                    assert field in columns, f"{panel['title']}: {path} uses field {field!r} the table drops"


def test_node_dashboard_marks_xids_on_every_panel() -> None:
    annotations = [a for a in load("gpu-triage-node.json")["annotations"]["list"] if "expr" in a]
    assert [a["name"] for a in annotations] == ["XIDs"]
    (xids,) = annotations
    assert xids["enable"] and xids["useValueForTime"]
    assert "nvidia_gpu_xid_last_seen_timestamp_seconds" in xids["expr"]


def test_provisioning_examples() -> None:
    base = DASHBOARDS / "provisioning"
    provider = yaml.safe_load((base / "dashboards" / "gpu-triage.yaml").read_text())
    assert provider["apiVersion"] == 1
    (p,) = provider["providers"]
    assert p["type"] == "file" and p["options"]["path"]
    datasources = yaml.safe_load((base / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] and ds["url"].startswith("http")
    # The dashboards must not depend on that uid: it is an example, the variable picks any Prometheus.
    for name in FILES:
        assert ds["uid"] not in (DASHBOARDS / name).read_text()


def test_readme_shows_every_dashboard_picture() -> None:
    readme = (DASHBOARDS / "README.md").read_text()
    for name in FILES:
        picture = Path("images") / name.replace(".json", ".png")
        assert f"]({picture})" in readme
        assert (DASHBOARDS / picture).stat().st_size < 1_000_000
