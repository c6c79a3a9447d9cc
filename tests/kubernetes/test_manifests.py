"""What an operator relies on in the rendered manifests: they agree with the daemon and with each other."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE, free_port, running, wait_for
from tests.kubernetes.manifests import (
    KUSTOMIZATIONS,
    Obj,
    all_containers,
    by_kind,
    container,
    flag,
    one,
    pod_spec,
    render,
)
from tests.podresources_server import pod_resources_server

STATE_DIR = "/var/lib/gpu-triage"


def _mounts(c: Obj) -> dict[str, Obj]:
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def _volumes(objects: list[Obj]) -> dict[str, Obj]:
    return {v["name"]: v for v in pod_spec(objects).get("volumes", [])}


def _port(c: Obj, name: str) -> int:
    (port,) = [p["containerPort"] for p in c.get("ports", []) if p["name"] == name]
    return int(port)


def _default_port() -> int:
    """The port `gpu-triage serve` listens on when not told, as its own --help says."""
    help_text = subprocess.run([GPU_TRIAGE, "serve", "--help"], check=True, capture_output=True, text=True).stdout
    match = re.search(r"\(default :(\d+)\)", " ".join(help_text.split()))
    assert match, "gpu-triage serve --help no longer states the default listen address"
    return int(match.group(1))


@pytest.fixture(params=KUSTOMIZATIONS)
def objects(request: pytest.FixtureRequest) -> list[Obj]:
    return render(request.param)


def test_ports_agree_end_to_end(objects: list[Obj]) -> None:
    daemon = container(objects)
    port = _port(daemon, "metrics")
    assert port == _default_port() == 9481
    assert flag(daemon["args"], "web.listen-address") in (None, f":{port}")
    service = one(objects, "Service")
    (service_port,) = service["spec"]["ports"]
    assert service_port["name"] == "metrics" and service_port["port"] == port
    assert service_port["targetPort"] in ("metrics", port)
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    assert endpoint["path"] == "/metrics"


def test_selectors_reach_the_pods(objects: list[Obj]) -> None:
    daemonset = one(objects, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]  # no namespaceSelector needed


def test_the_down_alert_selects_the_scrape_job(objects: list[Obj]) -> None:
    # prometheus-operator names the job after the Service; GpuTriageDown must see it.
    service_name = one(objects, "Service")["metadata"]["name"]
    rules = [r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    (down,) = [r for r in rules if r.get("alert") == "GpuTriageDown"]
    selector = re.search(r'up\{[^}]*job=~"([^"]+)"', down["expr"])
    assert selector, down["expr"]
    assert re.fullmatch(selector.group(1), service_name)


def test_state_dir_is_the_node_directory_the_daemon_is_told(objects: list[Obj]) -> None:
    daemon = container(objects)
    state = flag(daemon["args"], "state.dir")
    assert state == STATE_DIR
    mount = _mounts(daemon)[state]
    assert not mount.get("readOnly")
    volume = _volumes(objects)[mount["name"]]
    assert volume["hostPath"] == {"path": STATE_DIR, "type": "DirectoryOrCreate"}


def test_kernel_log_source_and_mount_agree(objects: list[Obj]) -> None:
    daemon = container(objects)
    args = daemon["args"]
    if "--no-source.kmsg" in args:
        assert "/dev/kmsg" not in _mounts(daemon) and flag(args, "kmsg.path") is None
        return
    kmsg = flag(args, "kmsg.path")
    assert kmsg == "/dev/kmsg"
    mount = _mounts(daemon)[kmsg]
    assert mount.get("readOnly") is True
    assert _volumes(objects)[mount["name"]]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    # The device cgroup of an unprivileged container refuses /dev/kmsg; with dmesg_restrict, only root
    # gets CAP_SYSLOG in Kubernetes.
    assert daemon["securityContext"]["privileged"] is True
    assert daemon["securityContext"]["runAsUser"] == 0


def test_pod_resources_socket_and_mount_agree(objects: list[Obj]) -> None:
    daemon = container(objects)
    socket = flag(daemon["args"], "kubernetes.pod-resources-socket")
    if socket == "off":
        assert "/var/lib/kubelet/pod-resources" not in _mounts(daemon)
        return
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    mount = _mounts(daemon)[str(Path(socket).parent)]
    assert mount.get("readOnly") is True
    volume = _volumes(objects)[mount["name"]]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"}
    assert daemon["securityContext"]["runAsUser"] == 0  # the kubelet's socket is root's


def test_the_pod_is_placed_on_gpu_nodes_with_nvml(objects: list[Obj]) -> None:
    spec = pod_spec(objects)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    gpu_present = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    assert terms and all(gpu_present in t["matchExpressions"] for t in terms)
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in container(objects)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert spec.get("hostPID") is not True and spec.get("hostNetwork") is not True
    # Only the daemon sees the GPUs: no other container asks the NVIDIA runtime for them.
    others = [c for c in all_containers(objects) if c["name"] != "gpu-triage"]
    assert all("NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c.get("env", [])} for c in others)


def test_every_container_runs_the_released_image() -> None:
    version = importlib.metadata.version("gpu-triage")
    for kustomization in KUSTOMIZATIONS:
        images = {c["image"] for c in all_containers(render(kustomization))}
        assert len(images) == 1, f"{kustomization}: {images}"
        (image,) = images
        assert image.rsplit(":", 1)[1] == version, f"{kustomization}: image {image}, package {version}"


def test_containers_hold_no_more_privilege_than_they_need(objects: list[Obj]) -> None:
    for c in all_containers(objects):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]
        if sc.get("privileged"):
            continue  # the daemon, for the kernel log (test_kernel_log_source_and_mount_agree)
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert set(sc["capabilities"].get("add", [])) <= {"CHOWN"}, c["name"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
        if sc.get("runAsUser") != 0:
            assert sc["runAsNonRoot"] is True, c["name"]


def test_no_api_access_except_the_node_condition() -> None:
    for kustomization in KUSTOMIZATIONS:
        objects = render(kustomization)
        spec = pod_spec(objects)
        assert spec["automountServiceAccountToken"] is False
        account = one(objects, "ServiceAccount")
        assert account["automountServiceAccountToken"] is False
        roles = by_kind(objects, "Role") + by_kind(objects, "ClusterRole")
        if kustomization != "overlays/node-condition":
            assert roles == [] and by_kind(objects, "RoleBinding") + by_kind(objects, "ClusterRoleBinding") == []
            assert all("projected" not in v for v in spec["volumes"])


def test_node_condition_may_write_node_status_and_nothing_else() -> None:
    objects = render("overlays/node-condition")
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch"]}]
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(objects, "ServiceAccount")
    daemonset = one(objects, "DaemonSet")
    assert pod_spec(objects)["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": daemonset["metadata"]["namespace"]}
    ]
    # The token goes to the sidecar alone; the daemon, which serves HTTP, gets none.
    token_volumes = {v["name"] for v in pod_spec(objects)["volumes"] if "projected" in v}
    holders = [
        c["name"] for c in all_containers(objects) if token_volumes & {m["name"] for m in c.get("volumeMounts", [])}
    ]
    assert holders == ["node-condition"]
    sidecar = container(objects, "node-condition")
    assert flag(sidecar["args"], "url") == f"http://127.0.0.1:{_port(container(objects), 'metrics')}"
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in sidecar["env"]


def test_gpu_operator_overlay_leaves_nodes_the_operator_is_working_on() -> None:
    terms = pod_spec(render("overlays/gpu-operator"))["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    client = [e for t in terms for e in t["matchExpressions"] if e["key"] == "nvidia.com/gpu.deploy.client"]
    assert {"key": "nvidia.com/gpu.deploy.client", "operator": "In", "values": ["true"]} in client
    assert {"key": "nvidia.com/gpu.deploy.client", "operator": "DoesNotExist"} in client


def test_everything_lands_in_one_namespace(objects: list[Obj]) -> None:
    (namespace,) = by_kind(objects, "Namespace")
    name = namespace["metadata"]["name"]
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for obj in objects:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace") == name, f"{obj['kind']}/{obj['metadata']['name']}"


def test_prometheus_rule_groups_are_the_alert_rules(objects: list[Obj]) -> None:
    rules = yaml.safe_load((REPO / "alerts/gpu-triage.rules.yml").read_text())
    assert one(objects, "PrometheusRule")["spec"]["groups"] == rules["groups"]


def test_dashboards_ship_unchanged_for_the_grafana_sidecar(objects: list[Obj]) -> None:
    maps = [m for m in by_kind(objects, "ConfigMap") if m["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {key: text for m in maps for key, text in m["data"].items()}
    expected = {p.name: p.read_text() for p in sorted((REPO / "dashboards").glob("*.json"))}
    assert shipped == expected


@pytest.mark.e2e
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_daemon_accepts_the_args_and_serves_the_probes(kustomization: str, tmp_path: Path) -> None:
    """The container's own args, with the node's paths and address swapped for test ones, start the real
    daemon; every probe path answers 200 there."""
    daemon = container(render(kustomization))
    host_only = {"state.dir", "kmsg.path", "web.listen-address", "kubernetes.pod-resources-socket"}
    args = [a for a in daemon["args"] if a.lstrip("-").split("=", 1)[0] not in host_only]
    assert args[0] == "serve"
    port = free_port()
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    cmd = [GPU_TRIAGE, *args, "--backend=sim", f"--web.listen-address=127.0.0.1:{port}", f"--state.dir={tmp_path}"]
    if flag(daemon["args"], "kmsg.path"):
        cmd.append(f"--kmsg.path={kmsg}")
    pods = flag(daemon["args"], "kubernetes.pod-resources-socket") != "off"
    url = f"http://127.0.0.1:{port}"
    probes = {name: daemon[name]["httpGet"] for name in ("startupProbe", "livenessProbe", "readinessProbe")}
    with pod_resources_server() as kubelet:
        cmd.append(f"--kubernetes.pod-resources-socket={kubelet.socket if pods else 'off'}")
        with running(cmd, url=url, ready=f"{url}/readyz", log=tmp_path / "daemon.log"):
            for name, probe in probes.items():
                assert probe["port"] in ("metrics", _port(daemon, "metrics")), name
                answer = httpx.get(f"{url}{probe['path']}", timeout=5)
                assert answer.status_code == 200, f"{name} {probe['path']}: {answer.status_code}"
            kubelet_up = 'gpu_triage_workload_source_up{source="kubelet"} 1'

            def page() -> str | None:
                text = httpx.get(f"{url}/metrics", timeout=5).text
                return text if kubelet_up in text or not pods else None

            metrics = wait_for(page, what="the kubelet's pod-resources API read")
    kmsg_up = 'gpu_triage_event_source_up{source="kmsg"} 1' in metrics
    assert kmsg_up is ("--no-source.kmsg" not in args)
    assert (kubelet_up in metrics) is pods and ("gpu_triage_workload_source_up{" in metrics) is pods
