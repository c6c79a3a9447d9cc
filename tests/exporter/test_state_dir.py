"""Where the journal lives when --state.dir is not given: systemd's StateDirectory=, else /var/lib for root,
else the user's own state directory (XDG Base Directory), and one log line that says which and why."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_triage.exporter.settings import load_settings, state_dir_origin
from tests.daemon_proc import GPU_TRIAGE, free_port, running


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("STATE_DIRECTORY", "XDG_STATE_HOME", "GPU_TRIAGE_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_under_systemd_the_unit_s_state_directory(clean_env: pytest.MonkeyPatch) -> None:
    # systemd sets it to the absolute paths of StateDirectory=, colon-separated (systemd.exec(5)).
    clean_env.setenv("STATE_DIRECTORY", "/var/lib/gpu-triage:/var/lib/other")
    settings = load_settings({}, None)
    assert settings.state_dir == Path("/var/lib/gpu-triage")
    assert "StateDirectory=" in state_dir_origin(settings)


def test_root_keeps_the_system_place(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(os, "geteuid", lambda: 0)
    assert load_settings({}, None).state_dir == Path("/var/lib/gpu-triage")


def test_a_user_gets_their_own_state_directory(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setattr(os, "geteuid", lambda: 1000)
    assert load_settings({}, None).state_dir == tmp_path / "home/.local/state/gpu-triage"
    clean_env.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    settings = load_settings({}, None)
    assert settings.state_dir == tmp_path / "xdg/gpu-triage" and "XDG_STATE_HOME" in state_dir_origin(settings)
    clean_env.setenv("XDG_STATE_HOME", "relative/path")  # the spec: a relative path is invalid, ignore it
    assert load_settings({}, None).state_dir == tmp_path / "home/.local/state/gpu-triage"


def test_what_is_given_wins_and_says_so(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("STATE_DIRECTORY", "/var/lib/gpu-triage")
    given = load_settings({"state_dir": tmp_path / "mine"}, None)
    assert given.state_dir == tmp_path / "mine" and state_dir_origin(given) == "--state.dir"
    clean_env.setenv("GPU_TRIAGE_STATE_DIR", str(tmp_path / "env"))
    from_env = load_settings({}, None)
    assert from_env.state_dir == tmp_path / "env" and state_dir_origin(from_env) == "--state.dir"


@contextlib.contextmanager
def as_a_user() -> Iterator[tuple[list[str], Path]]:
    """The command prefix that runs as a user other than root, and a home directory that user owns."""
    top = Path(tempfile.mkdtemp(prefix="gpu-triage-user-"))
    try:
        top.chmod(0o755)
        home = top / "home"
        home.mkdir()
        if os.geteuid() != 0:
            yield [], home
            return
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is not installed: cannot run as a user other than root")
        os.chown(home, 65534, 65534)
        yield [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"], home
    finally:
        shutil.rmtree(top)


def test_serve_as_a_normal_user_needs_no_setup_and_says_where_its_state_is(tmp_path: Path) -> None:
    """As a newcomer runs it: `gpu-triage serve --backend sim`, no --state.dir, not root, nothing prepared."""
    with as_a_user() as (prefix, home):
        if prefix and (hidden := _not_runnable_by_others(Path(GPU_TRIAGE))):
            pytest.skip(f"a user other than root cannot run {GPU_TRIAGE}: {hidden} is not open to others")
        kmsg = home / "kmsg.log"  # not the host's /dev/kmsg, which a user may not read
        kmsg.touch()
        kmsg.chmod(0o644)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [*prefix, "env", f"HOME={home}", GPU_TRIAGE, "serve", "--backend", "sim", f"--kmsg.path={kmsg}",
               f"--web.listen-address=127.0.0.1:{port}", "--kubernetes.pod-resources-socket=off"]  # fmt: skip
        with running(cmd, url=url, ready=f"{url}/readyz", log=tmp_path / "log") as server:
            state = home / ".local/state/gpu-triage"
            assert (state / "journal.sqlite3").is_file()
            lines = [line for line in server.output().splitlines() if 'msg="state directory"' in line]
            assert len(lines) == 1 and f"path={state} " in lines[0], server.output()
            assert "the default for a user other than root" in lines[0]
        assert server.process.returncode == 0, server.output()


def _not_runnable_by_others(script: Path) -> Path | None:
    """What keeps a user other than root from running `script` and its interpreter (a venv made from a
    Python under /root, say), if anything: a directory others cannot search, or a file they cannot run."""
    interpreter = Path(script.read_text().splitlines()[0].removeprefix("#!").split()[0])
    for path in (script, interpreter, interpreter.resolve()):
        for d in path.parents:
            if not d.stat().st_mode & 0o001:
                return d
        if not path.stat().st_mode & 0o005:
            return path
    return None
