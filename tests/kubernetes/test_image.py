"""kubernetes/Containerfile: linted as text, and its build steps (the wheel from the build context
.dockerignore leaves, installed into a fresh virtual environment) run outside a container. The image itself
is built and run in test_image_run.py."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.daemon_proc import free_port, running, state_args
from tests.kubernetes.manifests import container, render

CONTAINERFILE = REPO / "kubernetes/Containerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order, continuation lines joined, comments and directives left out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Containerfile ends inside a continued line"
    return out


def stages(text: str) -> list[list[tuple[str, str]]]:
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def _args(text: str) -> dict[str, str]:
    return dict(a.split("=", 1) for kind, a in instructions(text) if kind == "ARG" and "=" in a)


def test_bases_are_pinned_python_slim() -> None:
    text = CONTAINERFILE.read_text()
    args = _args(text)
    froms = [rest for kind, rest in instructions(text) if kind == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    for line in froms:
        image = line.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        tag = image.partition("@")[0].rpartition(":")[2]
        assert "@sha256:" in image or (tag and tag != "latest" and "/" not in tag), f"unpinned base {image}"
        assert re.search(r"python:3\.(1[1-9])-slim", image), f"not a slim Python 3.11+ base: {image}"


def test_runtime_stage_runs_gpu_triage_as_a_user_without_a_healthcheck() -> None:
    text = CONTAINERFILE.read_text()
    *_, runtime = stages(text)
    kinds = [k for k, _ in runtime]
    assert "HEALTHCHECK" not in [k for k, _ in instructions(text)]
    (user,) = [rest for k, rest in runtime if k == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user, which runAsNonRoot can check"
    (entrypoint,) = [rest for k, rest in runtime if k == "ENTRYPOINT"]
    assert entrypoint == '["gpu-triage"]', "exec form, so signals reach the daemon"
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")
    (expose,) = [rest for k, rest in runtime if k == "EXPOSE"]
    assert int(expose) == 9481 == container(render("base"))["ports"][0]["containerPort"]


def test_the_wheel_is_built_and_installed_and_only_the_venv_reaches_the_runtime() -> None:
    build, runtime = stages(CONTAINERFILE.read_text())[-2:]
    runs = " ".join(rest for k, rest in build if k == "RUN")
    assert re.search(r"pip wheel .*--wheel-dir (\S+) \.", runs)
    assert re.search(r"/opt/gpu-triage/bin/pip install /wheels/\*\.whl", runs)
    copies = [rest for k, rest in runtime if k == "COPY"]
    assert any(c.startswith("--from=build /opt/gpu-triage ") for c in copies)


def dockerignore_patterns() -> list[re.Pattern[str]]:
    """.dockerignore lines as regular expressions (Go filepath.Match plus **, as Docker reads them)."""
    out = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not handled here"
        regex = re.escape(line.strip("/")).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        out.append(re.compile(regex))
    return out


def build_context(dest: Path) -> Path:
    """What `docker build .` sends from the repository root: everything .dockerignore does not exclude."""
    patterns = dockerignore_patterns()
    for root, dirs, files in os.walk(REPO):
        rel = Path(root).relative_to(REPO)
        dirs[:] = [d for d in dirs if not any(p.fullmatch((rel / d).as_posix()) for p in patterns)]
        for name in [d for d in dirs if (REPO / rel / d).is_symlink()]:  # src/gpu_triage's links: COPY keeps them
            (dest / rel).mkdir(parents=True, exist_ok=True)
            (dest / rel / name).symlink_to((REPO / rel / name).readlink())
        for name in files:
            path = (rel / name).as_posix()
            if not any(p.fullmatch(path) for p in patterns):
                (dest / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / path, dest / path)
    return dest


def test_copied_sources_are_in_the_build_context(tmp_path: Path) -> None:
    context = build_context(tmp_path)
    assert not (context / ".venv").exists() and not (context / ".git").exists()
    for kind, rest in instructions(CONTAINERFILE.read_text()):
        if kind != "COPY" or "--from=" in rest:
            continue
        *sources, _ = [w for w in shlex.split(rest) if not w.startswith("--")]
        for source in sources:
            assert source == "." or (context / source).exists(), f"COPY {source}: not in the build context"


@pytest.mark.e2e
def test_the_build_steps_make_a_working_install(tmp_path: Path) -> None:
    """The build stage's commands, here: the wheel from the build context, a fresh venv with it and its
    dependencies; then the node-condition sidecar's command answers, and the daemon from that venv serves its
    runbooks (package data)."""
    context = build_context(tmp_path / "context")
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    pip_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(wheels), "."],
        cwd=context,
        check=True,
        env=pip_env,
        capture_output=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], check=True, env=pip_env, capture_output=True)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    sidecar = subprocess.run(["gpu-triage", "node-condition", "--help"], env=env, check=False, capture_output=True)
    assert sidecar.returncode == 0, sidecar.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(venv / "bin/gpu-triage"), "serve", "--backend=sim", f"--web.listen-address=127.0.0.1:{port}"]
    with running(
        [*cmd, *state_args(tmp_path / "state")], url=url, ready=f"{url}/readyz", log=tmp_path / "log", env=env
    ):
        assert httpx.get(f"{url}/runbooks/xid-79", timeout=5).status_code == 200
        assert httpx.get(f"{url}/api/v1/xid/79", timeout=5).json()["action"] == "REBOOT_NODE"
