"""The command line as a user runs it: `gpu-triage serve` in a real process, good and bad."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pynvml
import pytest

from tests.conftest import REPO
from tests.daemon_proc import GPU_TRIAGE, free_port, serve, state_args, wait_for


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPU_TRIAGE, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    with serve(tmp_path, "--collector.interval", "1s") as daemon:
        yield daemon.url
    assert daemon.process.returncode == 0, f"SIGTERM should be a clean stop: {daemon.output()}"
    assert "stopping" in daemon.output()
    # uvicorn's start and stop lines are ours to name (and debug): no logger=uvicorn.error in normal operation.
    assert "uvicorn" not in daemon.output() and "msg=listening address=127.0.0.1:" in daemon.output()


def nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0 and result.stdout.startswith("gpu-triage ")


def test_serve_on_the_simulator(served: str) -> None:
    lines = httpx.get(f"{served}/metrics").text.splitlines()
    assert sum(line.startswith("nvidia_gpu_up{") for line in lines) == 8
    assert httpx.post(f"{served}/api/v1/sim/faults", json={"gpu": 5, "kind": "gpu_lost"}).status_code == 201

    def gpu_5_down() -> list[str] | None:
        lines = httpx.get(f"{served}/metrics").text.splitlines()
        down = any(line.startswith('nvidia_gpu_up{gpu="5"') and line.endswith(" 0.0") for line in lines)
        return lines if down else None

    lines = wait_for(gpu_5_down, 10, interval=0.2, what="the lost GPU to show as down")
    assert sum(line.startswith("nvidia_gpu_power_watts{") for line in lines) == 7


def test_bad_flags_are_all_reported_at_once(tmp_path: Path) -> None:
    result = run(
        "serve",
        *state_args(tmp_path),
        "--backend",
        "cuda",
        "--collector.interval",
        "soon",
        "--no-such-flag",
        "--web.listen-address",
        "x",
    )
    assert result.returncode == 2
    for expected in (
        "unknown flag '--no-such-flag'",
        "--backend",
        "--collector.interval",
        "--web.listen-address",
    ):
        assert expected in result.stderr
    assert result.stderr.count("  - ") == 4


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{port}", *state_args(tmp_path))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "already in use" in result.stderr


def test_unreadable_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworkload: nope\n")
    result = run(
        "serve",
        "--backend",
        "sim",
        "--sim.scenario",
        str(bad),
        f"--web.listen-address=127.0.0.1:{free_port()}",
        *state_args(tmp_path / "state"),
    )
    assert result.returncode == 1
    assert f"scenario file {bad} is invalid: workload" in result.stderr


def test_auto_without_a_gpu_says_how_to_run_on_the_simulator(tmp_path: Path) -> None:
    if nvml_works():
        pytest.skip("this machine has a working NVIDIA driver: `serve` would start on it")
    result = run("serve", f"--web.listen-address=127.0.0.1:{free_port()}", *state_args(tmp_path))
    assert result.returncode == 1
    assert "NVML was not found" in result.stderr and "--backend sim" in result.stderr


def test_no_command_prints_help() -> None:
    result = run()
    assert result.returncode == 2 and "serve" in result.stderr


def test_xid_explains_a_code() -> None:
    result = run("xid", "79")
    assert result.returncode == 0
    assert result.stdout.startswith("Xid 79  ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS\n")
    assert "action: REBOOT_NODE" in result.stdout and "/runbooks/xid-79" in result.stdout
    as_json = json.loads(run("xid", "48", "--json").stdout)
    assert as_json["xid"] == 48 and as_json["playbook"] == "xid-48"
    unknown = run("xid", "999")
    assert unknown.returncode == 1 and "not in NVIDIA's catalog" in unknown.stderr
    assert run("xid", "seventy-nine").returncode == 2


@pytest.mark.parametrize("argv", [["xid", "79"], ["diagnose", "-"], ["alerts", "render"]])
def test_one_shot_commands_do_not_load_the_web_server(argv: list[str]) -> None:
    """`gpu-triage xid 79` at 3 a.m. should answer at once: FastAPI is for `serve`."""
    probe = (
        "import sys; from gpu_triage.exporter.cli.main import main; main(sys.argv[1:]); "
        "sys.stderr.write('LOADED' if 'fastapi' in sys.modules else 'CLEAN')"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *argv], input=b"epoch 1\n", capture_output=True, timeout=60, check=False
    )
    assert result.stderr.decode().endswith("CLEAN"), result.stderr.decode()[-500:]


def test_a_plain_log_does_not_load_what_dumps_and_archives_need(tmp_path: Path) -> None:
    """Flight Recorder dumps, archives and multipart bodies bring their own modules; a log alone does without.

    Measured with the knowledge cache warm, as every run after the first is: a cold cache reads the data files
    through importlib.resources, whose own reader imports zipfile whatever the input."""
    heavy = ("tarfile", "zipfile", "email.parser", "subprocess", "gpu_triage.diagnosis.training.hang.classify")
    probe = (
        "import sys; from gpu_triage.exporter.cli.main import main; main(['diagnose', '-']); "
        f"sys.stderr.write(repr([m for m in {heavy!r} if m in sys.modules]))"
    )
    env = {**os.environ, "GPU_TRIAGE_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # the first run fills the cache
        result = subprocess.run(
            [sys.executable, "-c", probe],
            input=b"epoch 1 loss 2.0\n",
            capture_output=True,
            timeout=60,
            check=False,
            env=env,
        )
    assert any(tmp_path.iterdir()), "the knowledge cache was not written"
    assert result.stderr.decode().endswith("[]"), result.stderr.decode()[-500:]


def test_check_exit_codes_follow_the_node_verdict(served: str) -> None:
    healthy = run("check", "--url", served)
    assert (healthy.returncode, healthy.stdout) == (0, "OK - 8 GPUs, 8 up; node healthy\n")
    assert httpx.post(f"{served}/api/v1/sim/faults", json={"gpu": 2, "kind": "xid", "xid": 79}).status_code == 201

    def critical() -> subprocess.CompletedProcess[str] | None:
        result = run("check", "--url", served)
        return result if result.returncode == 2 else None

    sick = wait_for(critical, 10, interval=0.2, what="`gpu-triage check` to say CRITICAL")
    # The simulated GPU falls off the bus as a real one does after Xid 79: lost, and one finding for it.
    assert sick.stdout.startswith("CRITICAL - 8 GPUs, 7 up; node unhealthy: REBOOT_NODE: GPU 2 Xid 79\n")
    assert "GPU 2: The GPU fell off the PCIe bus" in sick.stdout and f"{served}/runbooks/xid-79" in sick.stdout
    # As one types it for curl: no scheme.
    bare = run("check", "--url", served.removeprefix("http://"))
    assert (bare.returncode, bare.stdout) == (2, sick.stdout)
    assert json.loads(run("check", "--url", served, "--json").stdout)["diagnosis"]["node"]["action"] == "REBOOT_NODE"


def test_check_without_a_daemon_is_unknown() -> None:
    result = run("check", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "1")
    assert result.returncode == 3 and result.stdout.startswith("UNKNOWN - cannot get a verdict")


def test_alerts_render_points_runbooks_at_a_published_copy(tmp_path: Path) -> None:
    rules = REPO / "alerts" / "gpu-triage.rules.yml"
    result = run("alerts", "render", "--runbook-base", "https://wiki.example.com/gpu/", str(rules))
    assert result.returncode == 0
    urls = [
        line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if line.strip().startswith("runbook_url:")
    ]
    assert urls and all(url.startswith('"https://wiki.example.com/gpu/') for url in urls)
    assert result.stdout.count("runbook_url:") == rules.read_text().count("runbook_url:")
    missing = run("alerts", "render", "--runbook-base", "https://x", str(tmp_path / "nope.yml"))
    assert missing.returncode == 2 and "gpu-triage alerts render:" in missing.stderr


def test_alerts_render_without_a_file_renders_the_shipped_rules() -> None:
    result = run("alerts", "render")
    assert (result.returncode, result.stdout) == (0, (REPO / "alerts" / "gpu-triage.rules.yml").read_text())


def test_an_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run(
        "serve",
        "--backend",
        "sim",
        f"--web.listen-address=127.0.0.1:{free_port()}",
        "--state.dir",
        str(blocker / "state"),
        "--kmsg.path",
        str(blocker),
    )
    assert result.returncode == 1
    assert "--state.dir must name a directory the daemon can write" in result.stderr
    assert "Traceback" not in result.stderr


class Recorded:
    """What exporter.http.server.bind asked of the sockets it made: the family, options set, and address bound."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, ipv6: bool) -> None:
        self.families: list[int] = []
        self.options: dict[tuple[int, int], int] = {}
        self.bound: list[object] = []
        real, recorded = socket.socket, self

        class Socket(real):  # type: ignore[misc, valid-type]
            def __init__(self, family: int = socket.AF_INET, *args: object, **kwargs: object) -> None:
                recorded.families.append(family)
                if family == socket.AF_INET6 and not ipv6:
                    raise OSError(97, "Address family not supported by protocol")
                super().__init__(family, *args, **kwargs)

            def setsockopt(self, level: int, option: int, value: int) -> None:
                recorded.options[(level, option)] = value
                super().setsockopt(level, option, value)

            def bind(self, address: object) -> None:
                # Record the address, but listen on loopback only: a test never listens on every interface.
                # On a dual-stack socket an IPv4-mapped loopback address also takes plain IPv4 connections.
                recorded.bound.append(address)
                super().bind(("::ffff:127.0.0.1", 0) if self.family == socket.AF_INET6 else ("127.0.0.1", 0))

        monkeypatch.setattr(socket, "socket", Socket)


def test_every_address_means_ipv6_and_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_triage.exporter.http.server import bind

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::ffff:127.0.0.1", 0))
    except OSError as e:
        pytest.skip(f"no dual-stack IPv6 on this host: {e}")
    recorded = Recorded(monkeypatch, ipv6=True)
    with bind(":0") as sock:
        assert sock.family == socket.AF_INET6
        assert recorded.bound == [("::", 0)]
        assert recorded.options[(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)] == 0
        # V6ONLY off took effect: the IPv6 socket takes an IPv4 connection.
        with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=2):
            pass


def test_every_address_without_ipv6_is_every_ipv4_address(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_triage.exporter.http.server import bind

    recorded = Recorded(monkeypatch, ipv6=False)
    with bind(":0") as sock:
        assert recorded.families == [socket.AF_INET6, socket.AF_INET]
        assert sock.family == socket.AF_INET
        assert recorded.bound == [("0.0.0.0", 0)]
        with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=2):
            pass
