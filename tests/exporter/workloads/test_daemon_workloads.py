"""Who uses each GPU, through the whole daemon: a real pod-resources server and a fake /proc tree in, the
info series, /api/v1/gpus, the verdict's findings and the pages out; and a kubelet that is slow or missing
never holds the daemon up."""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpu_triage.exporter.backends.readings import Processes
from gpu_triage.exporter.backends.sim import FaultSpec, SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.polling.poller import FAST
from tests.conftest import REPO, FakeClock, settings
from tests.daemon_proc import wait_for
from tests.podresources_server import Container, Pod, PodResourcesServer, pod_resources_server

PROCFS = REPO / "tests/fixtures/procfs/cgroup-v2"


@pytest.fixture
def kubelet() -> Iterator[PodResourcesServer]:
    with pod_resources_server() as server:
        yield server


def start(
    tmp_path: Path, kubelet: PodResourcesServer | None, scenario: str = "h100-training", procfs: Path = PROCFS
) -> Daemon:
    clock = FakeClock()
    sim = SimBackend(load_scenario(scenario), clock=clock)
    clock.advance(120)  # past the scenario's idle start: every GPU runs a process
    socket = str(kubelet.socket) if kubelet else "off"
    config = settings(tmp_path, kubernetes_pod_resources_socket=socket, path_procfs=procfs)
    daemon = Daemon(sim, config, clock=clock, boot_id="boot-1")
    daemon.start()
    return daemon


@pytest.fixture
def running(tmp_path: Path, kubelet: PodResourcesServer) -> Iterator[tuple[Daemon, list[str]]]:
    daemon = start(tmp_path, kubelet)
    uuids = [g.uuid for g in daemon.poller.gpus]
    kubelet.pods = [
        Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": uuids[0:4]})]),
        Pod("ml", "trainer-1", [Container("main", {"nvidia.com/gpu": uuids[4:8]})]),
    ]
    reread(daemon)
    try:
        yield daemon, uuids
    finally:
        daemon.stop()


def reread(daemon: Daemon) -> None:
    """What the background thread does every slow interval, now."""
    assert daemon.workloads.pods is not None
    if daemon.workloads.pods.read_once():
        daemon.refresh()


def series(daemon: Daemon, name: str) -> list[dict[str, str]]:
    families = text_string_to_metric_families(daemon.metrics.text.decode())
    return [dict(s.labels) for f in families for s in f.samples if s.name == name]


def value(daemon: Daemon, name: str, **labels: str) -> float | None:
    for f in text_string_to_metric_families(daemon.metrics.text.decode()):
        for s in f.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return float(s.value)
    return None


def test_pod_and_job_info_series(running: tuple[Daemon, list[str]]) -> None:
    daemon, uuids = running
    pods = series(daemon, "nvidia_gpu_pod_info")
    assert sorted((p["gpu"], p["pod"]) for p in pods) == [(str(g), f"trainer-{g // 4}") for g in range(8)]
    assert all(p["uuid"] == uuids[int(p["gpu"])] and p["namespace"] == "ml" and p["container"] == "main" for p in pods)
    assert all("gpu_instance" not in p for p in pods), "a whole GPU's pod carries no MIG labels"
    jobs = {p["gpu"]: p for p in series(daemon, "nvidia_gpu_job_info")}
    assert set(jobs) == {"0", "1", "2", "3", "4", "5", "7"}  # GPU 6's process is not in a Slurm job
    assert (jobs["0"]["job_id"], jobs["0"]["step"], jobs["0"]["uuid"]) == ("4242", "0", uuids[0])
    assert (jobs["2"]["job_id"], jobs["2"]["step"]) == ("4242", "batch")
    assert (jobs["4"]["job_id"], jobs["4"]["step"]) == ("4244", "extern")
    assert jobs["7"]["job_id"] == "sEKNKTV3WPV500"

    def named() -> bool:
        daemon.refresh()  # the name is looked up off the poll thread, and shows from the next render on
        return value(daemon, "nvidia_gpu_job_info", gpu="0", user="root") == 1.0

    wait_for(named, what="uid 0's name")
    assert value(daemon, "gpu_triage_workload_source_up", source="kubelet") == 1.0


def test_per_gpu_series_keep_their_labels(running: tuple[Daemon, list[str]]) -> None:
    daemon, _ = running
    for name in ("nvidia_gpu_utilization_ratio", "nvidia_gpu_up", "nvidia_gpu_health"):
        for labels in series(daemon, name):
            assert not {"pod", "namespace", "job_id"} & labels.keys(), (name, labels)


def test_pods_coming_and_going(running: tuple[Daemon, list[str]], kubelet: PodResourcesServer) -> None:
    daemon, uuids = running
    kubelet.pods = [Pod("ml", "trainer-2", [Container("main", {"nvidia.com/gpu": [uuids[5]]})])]
    reread(daemon)
    assert [(p["gpu"], p["pod"]) for p in series(daemon, "nvidia_gpu_pod_info")] == [("5", "trainer-2")]
    kubelet.pods = []
    reread(daemon)
    assert series(daemon, "nvidia_gpu_pod_info") == []


def test_findings_name_the_pod_and_job_that_were_on_the_gpu(running: tuple[Daemon, list[str]]) -> None:
    daemon, _ = running
    client = TestClient(create_app(daemon))
    client.post("/api/v1/sim/faults", json={"gpu": 3, "kind": "xid", "xid": 79}).raise_for_status()
    client.post("/api/v1/sim/faults", json={"gpu": 3, "kind": "gpu_lost"}).raise_for_status()
    wait_for(lambda: client.get("/api/v1/diagnosis").json()["node"]["health"] == "unhealthy", what="the XID")
    daemon.poller.poll(FAST)  # GPU 3 is lost now: no process list, its job is the last one seen
    body = client.get("/api/v1/diagnosis").json()
    three = next(g for g in body["gpus"] if g["gpu"] == 3)
    pod = {"kind": "pod", "namespace": "ml", "pod": "trainer-0", "container": "main"}
    job = {"kind": "slurm_job", "job_id": "4243", "step": "0", "user": "4711"}
    assert three["workloads"] == [pod, job]
    for finding in three["findings"]:
        assert finding["workloads"] == [pod, job], finding["class"]
    assert body["findings"][0]["workloads"] == [pod, job]
    # Other GPUs' findings and GPUs are their own: GPU 0 has its own pod and job.
    zero = next(g for g in body["gpus"] if g["gpu"] == 0)
    assert [w.get("pod") or w.get("job_id") for w in zero["workloads"]] == ["trainer-0", "4242"]
    # The pages show who was on the GPU, next to the finding.
    assert "pod ml/trainer-0" in client.get("/").text
    assert "Slurm job 4243 step 0" in client.get("/runbooks/xid-79").text


def test_a_finding_keeps_the_workload_it_opened_with(
    running: tuple[Daemon, list[str]], kubelet: PodResourcesServer
) -> None:
    daemon, uuids = running
    client = TestClient(create_app(daemon))
    client.post("/api/v1/sim/faults", json={"gpu": 1, "kind": "xid", "xid": 13}).raise_for_status()
    wait_for(lambda: client.get("/api/v1/diagnosis").json()["findings"], what="the XID 13 finding")
    kubelet.pods = [Pod("ml", "next-job", [Container("main", {"nvidia.com/gpu": [uuids[1]]})])]
    reread(daemon)
    one = next(g for g in client.get("/api/v1/diagnosis").json()["gpus"] if g["gpu"] == 1)
    assert [w.get("pod") for w in one["workloads"] if w["kind"] == "pod"] == ["next-job"]  # who is on it now
    (finding,) = one["findings"]
    assert [w.get("pod") for w in finding["workloads"] if w["kind"] == "pod"] == ["trainer-0"]  # who was then


def test_api_gpus_says_who_and_how_each_source_is(running: tuple[Daemon, list[str]]) -> None:
    daemon, _ = running
    body: dict[str, Any] = TestClient(create_app(daemon)).get("/api/v1/gpus").json()
    sources = body["workload_sources"]
    assert sources["kubernetes"]["state"] == "ok" and sources["kubernetes"]["error"] is None
    assert sources["kubernetes"]["containers_with_devices"] == 2
    assert sources["slurm"]["procfs"] == str(PROCFS) and sources["slurm"]["in_slurm_jobs"] == 7
    gpu5 = body["gpus"][5]
    assert gpu5["workloads"][0] == {"kind": "pod", "namespace": "ml", "pod": "trainer-1", "container": "main"}
    assert TestClient(create_app(daemon)).get("/api/v1/gpus/5").json()["workloads"] == gpu5["workloads"]


def test_a_slow_kubelet_never_holds_up_the_daemon(tmp_path: Path, kubelet: PodResourcesServer) -> None:
    kubelet.delay = 60.0  # far past the deadline (--collector.timeout, 0.5 s here)
    daemon = start(tmp_path, kubelet)
    try:
        assert daemon.workloads.pods is not None
        wait_for(lambda: daemon.workloads.pods and daemon.workloads.pods.state == "failing", what="the deadline")
        before = daemon.poller.last_poll_monotonic
        daemon.poller.poll(FAST)
        assert daemon.poller.last_poll_monotonic != before and daemon.readiness() is None
        assert value(daemon, "gpu_triage_workload_source_up", source="kubelet") == 0.0
        status = TestClient(create_app(daemon)).get("/api/v1/gpus").json()["workload_sources"]["kubernetes"]
        assert status["state"] == "failing" and "did not answer within 0.5s" in status["error"]
        assert series(daemon, "nvidia_gpu_pod_info") == []
    finally:
        daemon.stop()


def test_a_cgroup_file_that_blocks_holds_up_nothing(tmp_path: Path) -> None:
    """A FIFO where GPU 0's process has its cgroup file: the daemon starts, answers, and names the other jobs."""
    procfs = tmp_path / "proc"
    shutil.copytree(PROCFS, procfs)
    (procfs / "41000/cgroup").unlink()
    os.mkfifo(procfs / "41000/cgroup")
    started: list[Daemon] = []
    thread = threading.Thread(target=lambda: started.append(start(tmp_path, None, procfs=procfs)))
    thread.start()
    thread.join(30)
    try:
        assert started, "the daemon did not start: a read of the FIFO holds it"
        daemon = started[0]
        assert TestClient(create_app(daemon)).get("/healthz").status_code == 200
        jobs = {s["job_id"] for s in series(daemon, "nvidia_gpu_job_info")}
        assert "4243" in jobs and {s["gpu"] for s in series(daemon, "nvidia_gpu_job_info")} >= {"1", "2"}
    finally:
        os.close(os.open(procfs / "41000/cgroup", os.O_RDWR | os.O_NONBLOCK))  # lets any reader go
        thread.join(10)
        for daemon in started:
            daemon.stop()


def test_no_kubelet_and_no_slurm(tmp_path: Path) -> None:
    daemon = start(tmp_path, None, procfs=tmp_path / "empty")
    try:
        assert series(daemon, "nvidia_gpu_pod_info") == series(daemon, "nvidia_gpu_job_info") == []
        page = daemon.metrics.text.decode()
        assert "# TYPE nvidia_gpu_pod_info gauge" in page  # the family is there to join on, empty
        assert not re.search(r"^gpu_triage_workload_source_up\{", page, re.M), "an absent source reports nothing"
    finally:
        daemon.stop()


def test_a_mig_device_s_pod_and_job_carry_its_labels(tmp_path: Path, kubelet: PodResourcesServer) -> None:
    daemon = start(tmp_path, kubelet, scenario="h100-mig")
    try:
        processes = daemon.snapshot.gpus[0].get(Processes)
        assert processes is not None
        small, large = sorted(processes.instances, key=lambda m: m.gpu_instance)
        kubelet.pods = [Pod("serve", "llm-0", [Container("server", {"nvidia.com/mig-3g.40gb": [small.uuid]})])]
        reread(daemon)
        (pod,) = series(daemon, "nvidia_gpu_pod_info")
        assert pod == {
            "gpu": "0",
            "uuid": daemon.snapshot.gpus[0].identity.uuid,
            "namespace": "serve",
            "pod": "llm-0",
            "container": "server",
            "gpu_instance": "1",
            "compute_instance": "0",
            "mig_profile": "3g.40gb",
            "mig_uuid": small.uuid,
        }
        jobs = {j["mig_uuid"]: j["job_id"] for j in series(daemon, "nvidia_gpu_job_info") if j["gpu"] == "0"}
        assert jobs == {small.uuid: "5001", large.uuid: "5002"}  # one job on each MIG device
        zero = daemon.diagnosis().body()["gpus"][0]["workloads"]
        assert {
            "kind": "pod",
            "namespace": "serve",
            "pod": "llm-0",
            "container": "server",
            "mig_uuid": small.uuid,
            "gpu_instance": 1,
        } in zero
    finally:
        daemon.stop()


def test_an_xid_in_a_mig_instance_names_that_instance_and_its_workload(tmp_path: Path) -> None:
    """NVML puts an XID in the MIG instance it hit (gpuInstanceId); the driver's event says so, the finding
    keeps it, and it names the job in that instance, not its neighbour's, unless what it calls for (a reset)
    takes the whole GPU and every instance with it."""
    daemon = start(tmp_path, None, scenario="h100-mig")
    try:
        processes = daemon.snapshot.gpus[0].get(Processes)
        assert processes is not None
        small, large = sorted(processes.instances, key=lambda m: m.gpu_instance)
        sim = daemon.backend
        assert isinstance(sim, SimBackend)
        sim.inject(FaultSpec(gpu=0, kind="xid", xid=13, gpu_instance=large.gpu_instance))
        wait_for(daemon.journal.events, what="the XID in the journal")
        daemon.refresh()
        [event] = daemon.journal.events()
        assert (event.details["gpu_instance"], event.details["compute_instance"]) == (str(large.gpu_instance), "0")
        body = daemon.diagnosis().body()
        [finding] = body["gpus"][0]["findings"]
        assert finding["details"]["gpu_instance"] == str(large.gpu_instance)
        assert [w["job_id"] for w in finding["workloads"]] == ["5002"], "the job of that instance, not of its neighbour"
        [place] = body["node"]["affected"]
        assert place["where"] == f"GPU 0 instance {large.gpu_instance}"

        sim.inject(FaultSpec(gpu=0, kind="xid", xid=48, gpu_instance=small.gpu_instance))
        wait_for(lambda: len(daemon.journal.events()) == 2, what="the second XID")
        daemon.refresh()
        reset = next(f for f in daemon.diagnosis().body()["gpus"][0]["findings"] if f["class"] == "xid_48")
        assert reset["action"] == "RESET_GPU", "a reset takes the whole GPU: every instance's work is named"
        assert sorted(w["job_id"] for w in reset["workloads"]) == ["5001", "5002"]
    finally:
        daemon.stop()
