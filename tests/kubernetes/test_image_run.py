"""kubernetes/Containerfile, built and run for real: no registry is reachable, so the base image (the stand-in
for python:3.11-slim) is a minimal Debian with Python made here with mmdebstrap and imported into podman; the
image is built from it, then run as the unprivileged overlay's DaemonSet runs it (its securityContext, args
and volumes, read from the rendered manifest: no network, read-only root, the image's non-root user, the state
volume), on the simulator, and /metrics is scraped from inside its network namespace.

Where the container runtime cannot run on this machine the test is skipped with the runtime's own words
(kubernetes/README.md, "The image, built and run"). podman keeps its images in a store of the test's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, require_tool
from tests.daemon_proc import wait_for
from tests.kubernetes.manifests import container, pod_spec, render

BASE = "localhost/gpu-triage-base:test"
IMAGE = "localhost/gpu-triage:test"
IMAGE_UID = 65532  # the image's USER
SLOW = 900  # seconds: making the base and installing the wheel's dependencies fetch from the package mirrors


class Podman:
    """podman with a store of its own, the OCI runtime that works here, and ulimits this machine allows."""

    def __init__(self, home: Path) -> None:
        self.exe = require_tool("podman")
        self.global_args = [
            f"--root={home / 'storage'}", f"--runroot={home / 'run'}", "--storage-driver=overlay",
            "--cgroup-manager=cgroupfs", "--events-backend=file",
        ]  # fmt: skip
        # podman's default ulimits (1048576 files) are above the hard limits of some machines (this one's,
        # 20000), and a container may not raise them: ask for what the test process itself has.
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        self.limits = [f"--ulimit=nofile={min(nofile, 8192)}", f"--ulimit=nproc={min(nproc, 4096)}"]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.exe, *self.global_args, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])}… failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done

    def pick_runtime(self) -> None:
        """The default OCI runtime (crun), else runc; skip, saying why, when neither runs a container here."""
        problems = []
        for runtime in (None, "runc"):
            if runtime is not None and shutil.which(runtime) is None:
                continue
            chosen = [] if runtime is None else [f"--runtime={runtime}"]
            probe = self(*chosen, "run", "--rm", "--network=none", *self.limits, BASE, "true", check=False)
            if probe.returncode == 0:
                self.global_args += chosen
                return
            problems.append(f"{runtime or 'the default runtime'}: {probe.stderr.strip()[-400:]}")
        pytest.skip("the container runtime cannot run a container on this machine: " + " | ".join(problems))


def _debian_release() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME=") and line.split("=", 1)[1]:
                return line.split("=", 1)[1].strip('"')
    return "bookworm"


def make_base(podman: Podman, home: Path) -> None:
    """A minimal Debian with Python 3 and venv, trusting what this machine trusts (its egress may re-sign
    TLS), as the base image."""
    mmdebstrap = require_tool("mmdebstrap")
    sources = [str(p) for p in sorted(Path("/etc/apt/sources.list.d").glob("debian*.sources"))]
    tarball = home / "base.tar"
    cmd = [
        mmdebstrap, "--quiet", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
        "--customize-hook=[ ! -e /etc/ssl/certs/ca-certificates.crt ] || "
        "cp /etc/ssl/certs/ca-certificates.crt \"$1/etc/ssl/certs/ca-certificates.crt\"",
        _debian_release(), str(tarball), *sources,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=SLOW, check=False)
    if done.returncode != 0:
        why = f"mmdebstrap could not make the base image: {done.stderr.strip()[-600:]}"
        if os.environ.get("GPU_TRIAGE_REQUIRE_TOOLS"):
            pytest.fail(why)
        pytest.skip(why)
    podman("import", "--change=ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt", str(tarball), BASE, timeout=SLOW)
    tarball.unlink()


def run_flags(objects: list[dict[str, Any]], host: dict[str, Path]) -> tuple[list[str], list[str], int]:
    """podman run's flags, the daemon's args and the user it runs as, for the gpu-triage container of the
    rendered DaemonSet, field by field: a field this does not know how to apply fails the test, so the run is
    always what the manifest says. `host`: what stands in for each hostPath volume, by volume name."""
    spec, c = pod_spec(objects), container(objects)
    context = c["securityContext"]
    flags = ["--network=none"] if not spec.get("hostNetwork") else []
    for key, value in context.items():
        if key == "runAsUser":
            flags.append(f"--user={value}:{context.get('runAsGroup', value)}")
        elif key == "readOnlyRootFilesystem":
            flags += ["--read-only"] if value else []
        elif key == "allowPrivilegeEscalation":
            flags += [] if value else ["--security-opt=no-new-privileges"]
        elif key == "capabilities":
            flags += [f"--cap-drop={cap}" for cap in value.get("drop", [])]
            flags += [f"--cap-add={cap}" for cap in value.get("add", [])]
        elif key == "privileged":
            flags += ["--privileged"] if value else []
        elif key == "seccompProfile":
            assert value == {"type": "RuntimeDefault"}, value  # podman's own default profile
        elif key == "runAsNonRoot":
            assert not value or context["runAsUser"] != 0
        elif key != "runAsGroup":
            raise AssertionError(f"securityContext.{key}: this test does not know how to run it")
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in c["volumeMounts"]:
        volume, ro = volumes[mount["name"]], ":ro" if mount.get("readOnly") else ""
        if "hostPath" in volume:
            flags.append(f"--volume={host[mount['name']]}:{mount['mountPath']}{ro}")
        elif "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Mi", "m")
            flags.append(f"--tmpfs={mount['mountPath']}:size={size}")
        else:
            raise AssertionError(f"volume {mount['name']}: this test does not know how to mount it")
    return flags, [*c["args"], "--backend=sim"], int(context["runAsUser"])  # no GPU here: the simulator


def in_container(podman: Podman, name: str, path: str) -> str:
    """GET http://127.0.0.1:9481<path> from inside the container's own network namespace."""
    fetch = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:9481{path}', timeout=5).read().decode())"
    return podman("exec", name, "python3", "-c", fetch).stdout


@pytest.fixture(scope="module")
def image() -> Iterator[Podman]:
    """podman, with the image built from the Containerfile on a base made here."""
    if os.geteuid() != 0:
        pytest.skip("making the base with mmdebstrap and running podman on a store of its own needs root here")
    home = Path(tempfile.mkdtemp(prefix="gpu-triage-podman-"))  # short: podman takes 50 characters of runroot
    podman = Podman(home)
    try:
        started = time.monotonic()
        make_base(podman, home)
        podman.pick_runtime()
        based = time.monotonic()
        podman(
            "build", "--network=host", *podman.limits, "--file", str(REPO / "kubernetes/Containerfile"),
            f"--build-arg=PYTHON_IMAGE={BASE}", f"--tag={IMAGE}", str(REPO), timeout=SLOW,
        )  # fmt: skip
        print(f"\nimage: base made in {based - started:.0f}s, built in {time.monotonic() - based:.0f}s")
        yield podman
    finally:
        podman("system", "reset", "--force", timeout=300, check=False)  # containers, images and their mounts
        shutil.rmtree(home, ignore_errors=True)


def test_the_image_runs_gpu_triage_as_its_own_user(image: Podman) -> None:
    config = json.loads(image("image", "inspect", IMAGE).stdout)[0]["Config"]
    assert config["User"] == f"{IMAGE_UID}:{IMAGE_UID}" and config["Entrypoint"] == ["gpu-triage"]
    assert config["Cmd"] == ["serve"] and "9481/tcp" in config["ExposedPorts"]


# A record as /dev/kmsg gives it (priority 4 of facility 0, the kernel; sequence number; microseconds since
# boot), on GPU 1's bus id.
XID_79 = "4,1234,5678901,-;NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"


@pytest.mark.e2e
@pytest.mark.parametrize("kustomization", ["overlays/unprivileged", "base"])
def test_the_image_runs_as_the_daemonset_runs_it(image: Podman, kustomization: str, tmp_path: Path) -> None:
    """The unprivileged overlay (user 65532, no capabilities, no kernel log) and the base (privileged root,
    for the kernel log: a file here stands in for the node's /dev/kmsg, and gets an XID 79)."""
    state, kmsg, sockets = tmp_path / "state", tmp_path / "kmsg", tmp_path / "pod-resources"
    state.mkdir()
    sockets.mkdir()
    kmsg.touch()
    objects = render(kustomization)
    flags, args, uid = run_flags(objects, {"state": state, "kmsg": kmsg, "pod-resources": sockets})
    os.chown(state, uid, uid)  # the overlay's init container does this for its user; root owns it anyway
    name = f"gpu-triage-{kustomization.replace('/', '-')}"
    image("run", "--detach", f"--name={name}", *image.limits, *flags, IMAGE, *args)
    try:
        try:
            wait_for(
                lambda: image("exec", name, "python3", "-c", READY, check=False).returncode == 0,
                timeout=60,
                interval=0.5,
                what="the container ready",
            )
        except AssertionError as e:
            logs = image("logs", name, check=False)
            raise AssertionError(f"{e}:\n{logs.stdout}{logs.stderr}") from None
        with kmsg.open("a") as log:  # the kernel logs a fault: a log followed from its end, as tail -F does
            log.write(XID_79)
        expected = {("1", "79"): 1.0} if "--no-source.kmsg" not in args else {}

        def scraped() -> list[Any] | None:
            samples = [
                s for f in text_string_to_metric_families(in_container(image, name, "/metrics")) for s in f.samples
            ]
            xids = {
                (s.labels["gpu"], s.labels["xid"]): s.value for s in samples if s.name == "nvidia_gpu_xid_errors_total"
            }
            return samples if xids == expected else None

        logs = image("logs", name, check=False)
        samples = wait_for(scraped, timeout=30, what=f"XIDs {expected}:\n{logs.stdout}{logs.stderr}")
        up = [s for s in samples if s.name == "nvidia_gpu_up"]
        assert len(up) == 8 and all(s.value == 1 for s in up)
        assert image("exec", name, "id", "-u").stdout.strip() == str(uid)
        assert image("exec", name, "touch", "/opt/gpu-triage/x", check=False).returncode != 0, "the root is read-only"
        assert (state / "journal.sqlite3").stat().st_uid == uid, "the journal is on the state volume"
        logs = image("logs", name)
        assert 'msg="state directory" path=/var/lib/gpu-triage why=--state.dir' in logs.stdout + logs.stderr
    finally:
        image("rm", "--force", name, check=False)


READY = "import urllib.request as u; u.urlopen('http://127.0.0.1:9481/readyz', timeout=2)"
