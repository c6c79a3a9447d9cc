"""Every panel of the shipped dashboards has data, against a real Prometheus scraping real daemons.

Three simulated nodes are scraped once for the module: one healthy (h100-training), one put through every
kind of fault the panels show (thermal slowdown, ECC, XIDs, an NVLink link down, a pending row remap, a lost
GPU), injected at once instead of waiting for the scenario's schedule, whose GPUs two Kubernetes pods hold (a
pod-resources server the test runs), and one with MIG devices (h100-mig) running Slurm jobs (a fake /proc).
Each query is then run the way Grafana runs it (variables interpolated, instant or over the range) for each
node and for all of them, and must return series with values whose legends name them apart. The panels that show faults are also
checked for the fault they must show, so that a panel of zeros cannot pass for one that works.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from gpu_triage.diagnosis.core.actions import Action
from gpu_triage.diagnosis.core.playbooks import action_playbook, load_playbooks
from tests.conftest import REPO
from tests.dashboards.grafana import (
    Context,
    Query,
    Series,
    Window,
    all_dashboards,
    all_queries,
    legend,
    legend_labels,
    load,
    queries,
    run,
    values,
)
from tests.e2e.servers import Server, gpu_triage, prometheus, query, wait_for
from tests.podresources_server import Container, Pod, pod_resources_server

pytestmark = pytest.mark.e2e

FAULTS = [
    {"gpu": 2, "kind": "thermal_slowdown"},
    {"gpu": 5, "kind": "ecc_correctable", "count": 3},
    {"gpu": 1, "kind": "xid", "xid": 13},
    {"gpu": 4, "kind": "nvlink_down", "link": 7},
    {"gpu": 6, "kind": "ecc_uncorrectable"},
    {"gpu": 6, "kind": "xid", "xid": 48},
    {"gpu": 6, "kind": "row_remap_pending"},
    {"gpu": 3, "kind": "xid", "xid": 79},
    {"gpu": 3, "kind": "gpu_lost"},
]
# What Prometheus must hold before the panels are read: each fault has reached it.
FAULTS_SEEN = [
    'nvidia_gpu_clock_event_reason_active{gpu="2",reason="hw_thermal_slowdown"} == 1',
    'nvidia_gpu_ecc_errors_total{gpu="5",error="corrected"} > 0',
    'nvidia_gpu_ecc_errors_total{gpu="6",error="uncorrected"} > 0',
    'nvidia_gpu_nvlink_up{gpu="4",link="7"} == 0',
    'nvidia_gpu_row_remap_pending{gpu="6"} == 1',
    "count(nvidia_gpu_xid_errors_total) == 3",
    'nvidia_gpu_up{gpu="3"} == 0',
    "count(nvidia_gpu_pod_info) == 8",
    "count(nvidia_gpu_job_info) == 7",  # the MIG node: GPU 0's two MIG devices, GPUs 2 to 7 but 6
]
RATE_INTERVAL = 5  # seconds: Grafana's $__rate_interval is at least 4 scrape intervals (1 s here)


@dataclass(frozen=True)
class Fleet:
    prom: Server
    faulty: str  # instance label
    healthy: str
    mig: str
    window: Window

    def context(self, who: str) -> Context:
        instances = {"faulty": [self.faulty], "healthy": [self.healthy], "mig": [self.mig], "both": []}[who]
        return Context(
            values={"instance": instances},
            rate_interval=f"{RATE_INTERVAL}s",
            interval=f"{self.window.step:g}s",
            range_seconds=self.window.seconds,
        )


def _instance(server: Server) -> str:
    return server.url.removeprefix("http://")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        kubelet = stack.enter_context(pod_resources_server())
        pods = ["--kubernetes.pod-resources-socket", str(kubelet.socket)]
        faulty = stack.enter_context(gpu_triage(tmp_path_factory.mktemp("faulty"), *pods, scenario="h100-faults"))
        healthy = stack.enter_context(gpu_triage(tmp_path_factory.mktemp("healthy")))
        slurm = ["--path.procfs", str(REPO / "tests/fixtures/procfs/cgroup-v2")]
        mig = stack.enter_context(gpu_triage(tmp_path_factory.mktemp("mig"), *slurm, scenario="h100-mig"))
        uuids = [g["uuid"] for g in httpx.get(f"{faulty.url}/api/v1/gpus", timeout=5).json()["gpus"]]
        kubelet.pods = [
            Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": uuids[:4]})]),
            Pod("ml", "trainer-1", [Container("main", {"nvidia.com/gpu": uuids[4:]})]),
        ]
        targets = [_instance(faulty), _instance(healthy), _instance(mig)]
        prom = stack.enter_context(prometheus(tmp_path_factory.mktemp("prom"), targets))
        start = time.time()
        # A few clean scrapes first, so that counters have a zero before the faults move them.
        wait_for(lambda: len(query(prom, "count_over_time(up[1m]) >= 3")) == 3, what="3 scrapes of every daemon")
        for fault in FAULTS:
            httpx.post(f"{faulty.url}/api/v1/sim/faults", json=fault, timeout=5).raise_for_status()
        injected = time.time()
        for expr in FAULTS_SEEN:
            wait_for(functools.partial(query, prom, expr), what=expr)
        # Let a rate window pass over the faults, as it would before anyone looks at the dashboard: real time is
        # what the rate() panels are about, and Prometheus's clock is not the test's to move.
        time.sleep(max(0.0, injected + RATE_INTERVAL - time.time()))
        end = time.time()
        yield Fleet(prom, _instance(faulty), _instance(healthy), _instance(mig), Window(start, end, 1.0))


WHO = ["healthy", "faulty", "mig", "both"]


def _legend_check(q: Query, result: list[Series]) -> None:
    if q.table or q.legend is None:
        return
    names = [legend(q.legend, s["metric"]) for s in result]
    for s in result:
        missing = [label for label in legend_labels(q.legend) if label not in s["metric"]]
        assert not missing, f"{q}: legend {q.legend!r} names labels {missing} the series lacks: {s['metric']}"
    assert len(set(names)) == len(names), f"{q}: legend {q.legend!r} names two series alike: {sorted(names)}"


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("q", [q for q in all_queries() if q.panel is not None], ids=str)
def test_every_panel_query_returns_data(fleet: Fleet, q: Query, who: str) -> None:
    result = run(fleet.prom.url, q, fleet.context(who), fleet.window)
    assert result, f"{q} is empty for the {who} node(s)"
    assert any(not math.isnan(v) for s in result for v in values(s)), f"{q} has only NaN for the {who} node(s)"
    _legend_check(q, result)
    if q.table and q.panel is not None and len(q.panel["targets"]) > 1:
        # Grafana's merge joins rows on every column they share: a __name__ column would keep them apart.
        assert all("__name__" not in s["metric"] for s in result), f"{q}: keeps __name__, the rows will not merge"
    instances = {s["metric"].get("instance") for s in result} - {None}
    if who != "both" and instances:
        assert instances == {getattr(fleet, who)}, f"{q} leaks other nodes: {instances}"


def test_variables_list_the_nodes_and_gpus(fleet: Fleet) -> None:
    for dashboard in all_dashboards().values():
        found = {}
        for v in dashboard["templating"]["list"]:
            if v["type"] != "query":
                continue
            selector, label = v["definition"].removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
            match = Query("", None, v["name"], "var", selector, None, True, False)
            expr = run(fleet.prom.url, match, fleet.context("both"), fleet.window)
            found[v["name"]] = {s["metric"][label] for s in expr}
        assert found == {
            "job": {"gpu-triage"},
            "instance": {fleet.faulty, fleet.healthy, fleet.mig},
            "gpu": {str(i) for i in range(8)},
        }


def _panel(dashboard: str, panel_id: int, ref: str = "A") -> Query:
    (q,) = [q for q in queries(dashboard, load(dashboard)) if q.panel and q.panel["id"] == panel_id and q.ref == ref]
    return q


def _series(fleet: Fleet, who: str, dashboard: str, panel_id: int, ref: str = "A") -> list[Series]:
    return run(fleet.prom.url, _panel(dashboard, panel_id, ref), fleet.context(who), fleet.window)


def _peak(result: list[Series], **labels: str) -> float:
    """The highest value of the series that carry `labels`."""
    chosen = [s for s in result if all(s["metric"].get(k) == v for k, v in labels.items())]
    assert chosen, f"no series with {labels} in {[s['metric'] for s in result]}"
    return max(v for s in chosen for v in values(s))


FLEET, NODE = "gpu-triage-fleet.json", "gpu-triage-node.json"


def test_fleet_shows_the_faulty_node_and_what_to_do(fleet: Fleet) -> None:
    assert _peak(_series(fleet, "both", FLEET, 2, "C"), status="unhealthy") == 1  # nodes by health
    assert _peak(_series(fleet, "both", FLEET, 2, "A"), status="healthy") == 2  # the healthy and the MIG node
    assert _peak(_series(fleet, "both", FLEET, 4, "B")) == 1  # GPUs lost
    assert _peak(_series(fleet, "both", FLEET, 27), instance=fleet.faulty) >= 1  # throttled by heat
    rows = [s["metric"] | {"value": values(s)[0]} for s in _series(fleet, "both", FLEET, 6)]
    served = set(load_playbooks())
    for row in rows:
        assert row["playbook"] == action_playbook(Action(row["action"])) and row["playbook"] in served, row
    healthy = [r for r in rows if r["instance"] == fleet.healthy]
    assert [(r["gpu"], r["action"], r["playbook"], r["value"]) for r in healthy] == [("all", "IGNORE", "no-action", 0)]
    faulty = {r["gpu"]: r for r in rows if r["instance"] == fleet.faulty}
    assert {"2", "3", "4", "6"} <= set(faulty), faulty
    assert faulty["3"]["value"] == 3 and faulty["3"]["action"] != "IGNORE"  # XID 79: off the bus, unhealthy


def test_xid_panels_count_the_first_xid_of_each_code(fleet: Fleet) -> None:
    # A counter born at 1 is invisible to increase(); these panels must still count it.
    by_node = _series(fleet, "both", FLEET, 11)
    for xid in ("13", "48", "79"):
        assert _peak(by_node, instance=fleet.faulty, xid=xid) >= 1
    assert _peak(by_node, instance=fleet.healthy, xid="none") == 0
    in_range = _series(fleet, "faulty", FLEET, 12)
    assert {s["metric"]["xid"]: values(s)[0] for s in in_range} == {"13": 1, "48": 1, "79": 1}
    by_gpu = _series(fleet, "faulty", NODE, 71)
    for gpu, xid in (("1", "13"), ("6", "48"), ("3", "79")):
        assert _peak(by_gpu, gpu=gpu, xid=xid) >= 1
    seen = _series(fleet, "faulty", NODE, 72, "B")
    assert {(s["metric"]["gpu"], s["metric"]["xid"]): values(s)[0] for s in seen} == {
        ("1", "13"): 1,
        ("6", "48"): 1,
        ("3", "79"): 1,
    }


def test_xid_annotations_mark_when_each_xid_happened(fleet: Fleet) -> None:
    (annotation,) = [q for q in queries(NODE, load(NODE)) if q.panel is None]
    marks = run(fleet.prom.url, annotation, fleet.context("faulty"), fleet.window)
    assert {s["metric"]["xid"] for s in marks} == {"13", "48", "79"}
    for s in marks:
        assert fleet.window.start * 1000 <= values(s)[-1] <= fleet.window.end * 1000
    assert run(fleet.prom.url, annotation, fleet.context("healthy"), fleet.window) == []


def test_node_panels_show_each_fault(fleet: Fleet) -> None:
    def peak(panel_id: int, ref: str = "A", **labels: str) -> float:
        return _peak(_series(fleet, "faulty", NODE, panel_id, ref), **labels)

    assert peak(2) == 3  # node health: unhealthy
    assert peak(4) == 1  # one GPU lost
    assert peak(8, gpu="3") == 3  # GPU 3's health over time reaches unhealthy
    assert peak(32, gpu="2") == 6  # the worst clock-event reason of GPU 2: HW thermal slowdown
    assert peak(33, reason="hw_thermal_slowdown") == 1
    assert peak(41, gpu="5", error="corrected") >= 1
    assert peak(41, gpu="6", error="uncorrected") >= 1
    assert peak(42, "B", gpu="6") >= 1  # uncorrected in range (increase() extrapolates)
    assert peak(42, "E", gpu="6") == 1  # remap pending
    assert peak(61, gpu="4") == 1  # one NVLink link down
    assert peak(62, gpu="4", error="replay") > 0
    assert peak(63, gpu="4", link="7") == 0  # the table names the link that is down
    assert peak(63, gpu="0", link="all") == 1


def test_healthy_node_shows_zeros_and_none_rather_than_no_data(fleet: Fleet) -> None:
    def rows(panel_id: int, ref: str = "A") -> list[dict[str, str]]:
        return [s["metric"] for s in _series(fleet, "healthy", NODE, panel_id, ref)]

    assert {(r["gpu"], r["xid"]) for r in rows(72, "A")} == {("any", "none")}
    assert {r["link"] for r in rows(63)} == {"all"}
    assert len(rows(7)) == 8 and {r["action"] for r in rows(7)} == {"IGNORE"}
    assert _peak(_series(fleet, "healthy", NODE, 2)) == 0  # node health: healthy


def test_the_gpu_table_says_who_uses_each_gpu(fleet: Fleet) -> None:
    def used_by(who: str) -> list[tuple[str, str]]:
        return sorted((s["metric"]["gpu"], s["metric"]["used_by"]) for s in _series(fleet, who, NODE, 7, "D"))

    assert used_by("faulty") == [(str(g), f"pod ml/trainer-{g // 4}") for g in range(8)]  # GPU 3 lost: still theirs
    assert used_by("healthy") == [(str(g), "-") for g in range(8)]
    assert used_by("mig") == [
        ("0", "Slurm job 5001.0"), ("0", "Slurm job 5002.0"),  # one job on each MIG device
        ("1", "-"),
        ("2", "Slurm job 4242.batch"), ("3", "Slurm job 4243.0"), ("4", "Slurm job 4244.extern"),
        ("5", "Slurm job 4245.interactive"), ("6", "-"), ("7", "Slurm job sEKNKTV3WPV500.0"),
    ]  # fmt: skip


def test_runbook_and_node_links_resolve(fleet: Fleet) -> None:
    # The runbook link is http://<instance>/runbooks/<playbook>: the instance label must be the daemon's
    # address (it is, for a plain static or service-discovery scrape) and the playbook one it serves.
    served = set(load_playbooks())
    for row in _series(fleet, "both", NODE, 7):
        labels = row["metric"]
        assert labels["instance"] in (fleet.faulty, fleet.healthy, fleet.mig)
        assert labels["playbook"] in served
    answer = httpx.get(f"http://{fleet.faulty}/api/v1/xid/79", timeout=5)
    assert answer.status_code == 200 and answer.json()["playbook"] in served


def test_profiling_row_shows_every_gpu(fleet: Fleet) -> None:
    for who in ("healthy", "mig"):
        for panel_id in (101, 102, 103):  # SM, tensor, DRAM: whole GPUs only, MIG devices are the MIG row's
            assert {s["metric"]["gpu"] for s in _series(fleet, who, NODE, panel_id)} == {str(g) for g in range(8)}
        nvlink = _series(fleet, who, NODE, 104, "B")
        assert {(s["metric"]["gpu"], s["metric"]["direction"]) for s in nvlink} == {
            (str(g), d) for g in range(8) for d in ("tx", "rx")
        }
    assert _peak(_series(fleet, "mig", NODE, 101)) > 0.2  # the MIG node serves from the start


def test_mig_panels_show_each_mig_device(fleet: Fleet) -> None:
    rows = [s["metric"] | {"value": values(s)[0]} for s in _series(fleet, "mig", NODE, 111)]
    devices = sorted((r["gpu"], r["gpu_instance"], r["mig_profile"]) for r in rows if r["mig_profile"] != "(MIG off)")
    assert devices == [("0", "1", "3g.40gb"), ("0", "2", "4g.40gb"), ("1", "1", "3g.40gb"), ("1", "2", "4g.40gb")]
    assert all(r["mig_uuid"].startswith("MIG-") and r["value"] > 0 for r in rows if r["mig_profile"] != "(MIG off)")
    assert sorted(r["gpu"] for r in rows if r["mig_profile"] == "(MIG off)") == [str(g) for g in range(2, 8)]
    lines = _series(fleet, "mig", NODE, 112)
    assert sorted((s["metric"]["gpu"], s["metric"]["mig_profile"]) for s in lines) == [
        ("0", "3g.40gb"), ("0", "4g.40gb"), ("1", "3g.40gb"), ("1", "4g.40gb"),
    ]  # fmt: skip
    assert [s["metric"]["mig_profile"] for s in _series(fleet, "healthy", NODE, 112)] == ["no MIG"]
    # Whole-GPU panels stay one series per GPU on a MIG node.
    assert {s["metric"]["gpu"] for s in _series(fleet, "mig", NODE, 13)} == {str(g) for g in range(8)}
    assert len(_series(fleet, "mig", NODE, 82)) == 8
