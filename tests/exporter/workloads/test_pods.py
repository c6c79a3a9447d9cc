"""The pod-resources source against a real gRPC server on a Unix socket (tests/podresources_server.py): what it
maps to which GPU, and what it does when the kubelet is missing, slow, or restarts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from gpu_triage.diagnosis.core.findings import Workload
from gpu_triage.exporter.backends.base import GpuIdentity
from gpu_triage.exporter.backends.collectors import Collector
from gpu_triage.exporter.backends.readings import MigInstance, Processes
from gpu_triage.exporter.polling.snapshot import GpuState, Snapshot
from gpu_triage.exporter.workloads.placement import Assignment, DeviceIndex
from gpu_triage.exporter.workloads.pods import MAX_PODS_PER_GPU, PodSource, State, assign
from tests.daemon_proc import wait_for
from tests.podresources_server import Container, Pod, PodResourcesServer, pod_resources_server

GPU = [f"GPU-0000000{i}-1111-2222-3333-444444444444" for i in range(4)]
MIG_A = MigInstance(1, 0, "3g.40gb", "MIG-aaaaaaaa-1111-2222-3333-444444444444")
MIG_B = MigInstance(2, 0, "4g.40gb", "MIG-bbbbbbbb-1111-2222-3333-444444444444")


def node() -> Snapshot:
    """Four GPUs; GPU 1 split into two MIG devices."""
    gpus = []
    for i, uuid in enumerate(GPU):
        instances = (MIG_A, MIG_B) if i == 1 else ()
        readings = MappingProxyType({Collector.PROCESSES: Processes((), instances)})
        gpus.append(GpuState(GpuIdentity(i, uuid, f"0000:{i + 0x18:02x}:00.0"), readings))
    return Snapshot(1.0, "sim", tuple(gpus))


def pod(namespace: str, name: str, container: str = "main", mig: MigInstance | None = None) -> Assignment:
    return Assignment(
        Workload(
            "pod",
            name,
            namespace=namespace,
            container=container,
            mig_uuid=mig.uuid if mig else "",
            gpu_instance=mig.gpu_instance if mig else None,
        ),
        mig,
    )


@pytest.fixture
def kubelet() -> Iterator[PodResourcesServer]:
    with pod_resources_server() as server:
        yield server


def source(server: PodResourcesServer, deadline: float = 2.0) -> PodSource:
    return PodSource(str(server.socket), interval=3600, deadline=deadline)


def mapped(src: PodSource) -> dict[str, tuple[Assignment, ...]]:
    assert src.answer is not None
    return assign(src.answer, DeviceIndex(node())).assignments


def test_a_pod_with_several_gpus_a_mig_device_and_time_sliced_replicas(kubelet: PodResourcesServer) -> None:
    kubelet.pods = [
        Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0], GPU[2]]})]),
        Pod("serve", "llm-0", [Container("server", {"nvidia.com/mig-3g.40gb": [MIG_A.uuid]})]),
        # time-slicing: replicas 0 and 3 of GPU 3 to two pods, and a pod given two replicas of the same GPU
        Pod("dev", "notebook-a", [Container("jupyter", {"nvidia.com/gpu": [f"{GPU[3]}::0"]})]),
        Pod("dev", "notebook-b", [Container("jupyter", {"nvidia.com/gpu.shared": [f"{GPU[3]}::3", f"{GPU[3]}::5"]})]),
    ]
    src = source(kubelet)
    assert src.read_once() is True
    assert src.state == State.OK and src.up is True and src.error is None
    assert mapped(src) == {
        GPU[0]: (pod("ml", "trainer-0"),),
        GPU[2]: (pod("ml", "trainer-0"),),
        GPU[1]: (pod("serve", "llm-0", "server", MIG_A),),
        GPU[3]: (pod("dev", "notebook-a", "jupyter"), pod("dev", "notebook-b", "jupyter")),
    }
    assert kubelet.calls == ["List", "GetAllocatableResources"]


def test_old_style_mig_ids_name_their_gpu_instance(kubelet: PodResourcesServer) -> None:
    # Drivers before R470 named MIG devices MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>.
    kubelet.pods = [Pod("serve", "old", [Container("c", {"nvidia.com/mig-4g.40gb": [f"MIG-{GPU[1]}/2/0"]})])]
    src = source(kubelet)
    src.read_once()
    assert mapped(src) == {GPU[1]: (pod("serve", "old", "c", MIG_B),)}


def test_devices_that_are_none_of_this_node_s_gpus_are_reported_not_mapped(kubelet: PodResourcesServer) -> None:
    kubelet.pods = [Pod("a", "b", [Container("c", {"nvidia.com/gpu": ["nvidia0"], "example.com/nic": ["mlx5_0"]})])]
    kubelet.allocatable = {"nvidia.com/gpu": ["nvidia0", "nvidia1", GPU[0]], "example.com/nic": ["mlx5_0"]}
    src = source(kubelet)
    src.read_once()
    assert src.answer is not None
    result = assign(src.answer, DeviceIndex(node()))
    assert result.assignments == {}
    assert result.unmatched == {"nvidia.com/gpu": ["nvidia0", "nvidia1"]}  # other vendors' devices are not GPUs


def test_pods_coming_and_going(kubelet: PodResourcesServer) -> None:
    src = source(kubelet)
    assert src.read_once() is True  # the first answer, even an empty one, is news
    assert mapped(src) == {}
    first = src.answer
    assert src.read_once() is False  # the same answer again: nothing to redraw
    assert src.answer is first, "an unchanged answer is kept as it was: the daemon places its pods once"
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    assert src.read_once() is True
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}
    kubelet.pods = [Pod("ml", "trainer-1", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    assert src.read_once() is True
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-1"),)}
    kubelet.pods = []
    assert src.read_once() is True
    assert mapped(src) == {}


def test_a_kubelet_without_get_allocatable_still_maps(kubelet: PodResourcesServer) -> None:
    kubelet.allocatable_implemented = False
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = source(kubelet)
    src.read_once()
    assert src.state == State.OK
    assert src.answer is not None and src.answer.allocatable is None
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}


def test_an_answer_that_is_not_the_api_s_is_named_as_such(
    kubelet: PodResourcesServer, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = source(kubelet)
    src.read_once()
    kubelet.garbage = b"\x0a\xff\xff\xff\xff\x0f"  # a field whose length runs past the message
    assert src.read_once() is True
    assert src.state == State.FAILING
    assert src.error is not None and src.error.startswith("the kubelet's answer is not what the API says")
    assert "Exception deserializing" not in caplog.text
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}, "what was known is still the best answer"


def test_a_slow_kubelet_hits_the_deadline_and_the_last_answer_stays(kubelet: PodResourcesServer) -> None:
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = source(kubelet, deadline=0.3)
    src.read_once()
    kubelet.delay = 30.0
    started = time.monotonic()
    assert src.read_once() is True  # the state changed
    assert time.monotonic() - started < 10, "the call must end at its deadline, not when the kubelet answers"
    assert src.state == State.FAILING and src.up is False
    assert src.error is not None and "did not answer within 0.3s" in src.error
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}, "what was known is still the best answer"


def replicas(n: int, gpu: str = GPU[0]) -> list[Pod]:
    """`n` pods, each on a time-sliced replica of `gpu`: about 130 bytes each in List's answer."""
    return [
        Pod(f"ns{i % 50}", f"pod-{i:06d}", [Container("main", {"nvidia.com/gpu": [f"{gpu}::{i}"]})]) for i in range(n)
    ]


def test_an_answer_too_large_for_any_node_is_a_failure_and_the_last_answer_stays(kubelet: PodResourcesServer) -> None:
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = source(kubelet)
    src.read_once()
    kubelet.pods = replicas(40_000)  # 5 MB
    assert src.read_once() is True
    assert src.state == State.FAILING and src.error is not None and "over 4 MiB" in src.error, src.error
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}, "what was known is still the best answer"


def test_decoding_is_within_the_deadline_too(kubelet: PodResourcesServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer that arrives in time but takes longer to decode than the deadline leaves (a big answer on a
    busy node: here each container's devices take a millisecond) is a failure, not a late success."""
    from gpu_triage.exporter.workloads import podresources

    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = source(kubelet, deadline=1.0)
    src.read_once()
    kubelet.pods = replicas(3000)
    real = podresources._devices

    def slow(buf: bytes) -> podresources.Devices:
        time.sleep(0.001)  # the behaviour under test: decoding that really takes time, against a real deadline
        return real(buf)

    monkeypatch.setattr(podresources, "_devices", slow)
    src.read_once()
    assert src.state == State.FAILING and src.error is not None, src.state
    assert src.error.startswith("the kubelet's answer could not be read within 1s"), src.error
    assert mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}


def test_at_most_so_many_pods_are_named_on_one_gpu() -> None:
    """/metrics and every render stay small whatever the kubelet says: past what sharing a GPU can mean, the
    rest are counted in the status, not shown."""
    from gpu_triage.exporter.workloads.podresources import Answer, ContainerDevices, Devices

    containers = [
        ContainerDevices("ns", f"p{i}", "main", (Devices("nvidia.com/gpu", (f"{GPU[0]}::{i}",)),)) for i in range(300)
    ]
    placed = assign(Answer(containers, None), DeviceIndex(node()))
    assert len(placed.assignments[GPU[0]]) == MAX_PODS_PER_GPU and placed.not_shown == 300 - MAX_PODS_PER_GPU
    assert placed.assignments[GPU[0]][0] == pod("ns", "p0"), "the first ones listed are kept"


def test_explicit_socket_missing_is_a_failure(tmp_path: Path) -> None:
    src = PodSource(str(tmp_path / "kubelet.sock"), interval=3600, deadline=1.0)
    src.read_once()
    assert src.state == State.FAILING and src.up is False
    assert src.error is not None and "cannot reach the kubelet" in src.error and "kubelet.sock" in src.error


def test_auto_without_a_socket_is_quiet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("gpu_triage.exporter.workloads.pods.DEFAULT_SOCKET", str(tmp_path / "kubelet.sock"))
    src = PodSource("auto", interval=3600, deadline=1.0)
    assert src.state == State.STARTING
    src.read_once()
    assert src.state == State.ABSENT and src.up is None  # nothing to report as failing: not Kubernetes
    assert src.answer is None


def test_auto_finds_the_socket_when_the_kubelet_makes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    server = PodResourcesServer(Path("/tmp") / f"kubelet-auto-{threading.get_ident()}.sock")
    monkeypatch.setattr("gpu_triage.exporter.workloads.pods.DEFAULT_SOCKET", str(server.socket))
    src = PodSource("auto", interval=3600, deadline=2.0)
    src.read_once()
    assert src.state == State.ABSENT
    server.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    server.start()
    try:
        src.read_once()
        assert src.state == State.OK and mapped(src) == {GPU[0]: (pod("ml", "trainer-0"),)}
    finally:
        server.stop()


def test_a_kubelet_restart_is_a_failure_then_recovers(kubelet: PodResourcesServer) -> None:
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = source(kubelet)
    src.read_once()
    kubelet.stop()
    src.read_once()
    assert src.state == State.FAILING
    kubelet.pods = [Pod("ml", "trainer-1", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    kubelet.start()
    src.read_once()
    assert src.state == State.OK and mapped(src) == {GPU[0]: (pod("ml", "trainer-1"),)}


def test_the_background_thread_reads_and_tells_then_stops(kubelet: PodResourcesServer) -> None:
    told = threading.Event()
    kubelet.pods = [Pod("ml", "trainer-0", [Container("main", {"nvidia.com/gpu": [GPU[0]]})])]
    src = PodSource(str(kubelet.socket), interval=0.05, deadline=1.0, on_change=told.set)
    src.start()
    try:
        assert told.wait(10), "the first read is reported"
        told.clear()
        kubelet.pods = []
        assert told.wait(10), "a change is reported"
        wait_for(lambda: kubelet.calls.count("List") >= 4, what="reads every interval")
    finally:
        src.stop()
    # stop() joins the thread: gone, it asks nothing more, so there is nothing to wait and see.
    assert not src.running, "stopped"
