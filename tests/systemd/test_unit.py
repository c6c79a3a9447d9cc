"""The shipped systemd unit, sysusers file and example config: they load, they agree with the daemon,
`systemd-analyze verify` accepts the unit and `systemd-analyze security` rates it well."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from gpu_triage.exporter.settings import OPTIONS, load_settings, parse_duration
from tests.conftest import REPO, require_tool
from tests.daemon_proc import GPU_TRIAGE

SYSTEMD = REPO / "systemd"
UNIT = SYSTEMD / "gpu-triage.service"
MAX_EXPOSURE = 2.5


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as (key, value) pairs in order: keys such as DeviceAllow= repeat."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {raw!r}"
        assert not value.endswith("\\"), "continuation lines are not expected in this unit"
        current.append((key.strip(), value.strip()))
    return sections


UNIT_SECTIONS = parse_unit(UNIT.read_text())
SERVICE = UNIT_SECTIONS["Service"]


def values(key: str, section: list[tuple[str, str]] = SERVICE) -> list[str]:
    return [v for k, v in section if k == key]


def value(key: str, section: list[tuple[str, str]] = SERVICE) -> str | None:
    found = values(key, section)
    return found[-1] if found else None  # as systemd: the last assignment wins


def test_way_it_runs_the_daemon() -> None:
    argv = shlex.split(value("ExecStart") or "")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert Path(argv[0]).is_absolute() and Path(argv[0]).name in scripts
    assert argv[1:] == ["serve", "--config", f"/etc/{value('ConfigurationDirectory')}/config.yaml"]
    # The journal lives in the default --state.dir, which StateDirectory= creates and keeps writable.
    assert Path("/var/lib") / (value("StateDirectory") or "") == load_settings({}, None).state_dir


def test_readiness_watchdog_and_restarts() -> None:
    assert value("Type") == "notify" and value("NotifyAccess") == "main"
    assert parse_duration(value("WatchdogSec")) >= 10, "pings every WatchdogSec/2 must survive a busy node"
    assert value("Restart") == "on-failure", "a watchdog timeout is a failure: it must restart the daemon"
    assert parse_duration(value("TimeoutStopSec")) <= 30
    assert value("StartLimitBurst", UNIT_SECTIONS["Unit"]) and value("StartLimitIntervalSec", UNIT_SECTIONS["Unit"])


def test_least_privilege_that_still_reads_the_gpus_and_the_kernel_log() -> None:
    assert value("User") == value("Group") == "gpu-triage"
    assert value("DevicePolicy") == "closed"
    assert {"char-nvidia* rw", "/dev/kmsg r"} <= set(values("DeviceAllow"))
    # /dev/kmsg under kernel.dmesg_restrict=1 needs CAP_SYSLOG, and nothing else is granted.
    assert value("AmbientCapabilities") == value("CapabilityBoundingSet") == "CAP_SYSLOG"
    # These would hide /dev/nvidia* or the kernel log; PrivateUsers= would make CAP_SYSLOG useless.
    for key in ("PrivateDevices", "ProtectKernelLogs", "PrivateUsers"):
        assert value(key) in (None, "no"), key
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelTunables", "RestrictSUIDSGID"):
        assert value(key) == "yes", key
    assert value("ProtectSystem") == "strict"


def unit_for_tools(tmp_path: Path) -> Path:
    """The unit as `gpu-triage export systemd` writes it: starting the gpu-triage that ran the export (this
    test's), which systemd-analyze checks exists."""
    done = subprocess.run([GPU_TRIAGE, "export", "systemd", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return tmp_path / UNIT.name


def test_the_exported_unit_differs_from_the_shipped_one_in_exec_start_only(tmp_path: Path) -> None:
    exported = parse_unit(unit_for_tools(tmp_path).read_text())
    assert [kv for kv in exported["Service"] if kv[0] != "ExecStart"] == [kv for kv in SERVICE if kv[0] != "ExecStart"]
    assert shlex.split(value("ExecStart", exported["Service"]) or "")[0] == GPU_TRIAGE


def test_systemd_analyze_verify_accepts_an_odd_command_path(tmp_path: Path) -> None:
    """A venv in a folder with a space and a % in its name: quoted, and the % not taken for a specifier."""
    odd = tmp_path / "gpu triage 100%"
    odd.mkdir()
    (odd / "gpu-triage").symlink_to(GPU_TRIAGE)
    done = subprocess.run(
        [str(odd / "gpu-triage"), "export", "systemd", str(tmp_path / "unit")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = verify(tmp_path / "unit" / UNIT.name)
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    tool = require_tool("systemd-analyze")
    # --recursive-errors=no: unknown keys and sections fail the check instead of only being warned about.
    cmd = [tool, "verify", "--recursive-errors=no", str(unit)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    result = verify(unit_for_tools(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == "", "verify should have nothing to say about the unit"


def test_systemd_analyze_verify_would_catch_a_misspelt_key(tmp_path: Path) -> None:
    unit = unit_for_tools(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectHome=yes", "ProtectHome=yes\nProtectHomes=yes"))
    result = verify(unit)
    assert result.returncode != 0 and "Unknown key" in result.stderr, result.stderr


def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    cmd = [tool, "security", "--offline=true", "--no-pager", str(unit_for_tools(tmp_path))]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"Overall exposure level for gpu-triage\.service: (\d+\.\d+) (\w+)", result.stdout)
    assert found, result.stdout + result.stderr
    score = float(found[1])
    print(f"systemd-analyze security: gpu-triage.service exposure {score} {found[2]}")
    assert score <= MAX_EXPOSURE, f"exposure {score} {found[2]} is above {MAX_EXPOSURE}:\n{result.stdout}"


def test_sysusers_creates_the_user_the_unit_runs_as(tmp_path: Path) -> None:
    tool = require_tool("systemd-sysusers")
    conf = (SYSTEMD / "gpu-triage.sysusers.conf").read_text()
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [tool, f"--root={tmp_path}", "-"], input=conf, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    users = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0] for line in (tmp_path / "etc/group").read_text().splitlines()}
    user = users[value("User") or ""]
    assert value("Group") in groups
    assert 0 < int(user[2]) < 1000, "a system user"
    assert user[5] == str(load_settings({}, None).state_dir) and user[6].endswith("nologin")


# --- the example config -------------------------------------------------------------------------------

EXAMPLE = (SYSTEMD / "config.yaml").read_text()
COMMENTED_KEY = re.compile(r"^# ([a-z][a-z.-]*): (.*)$", re.M)


def test_example_config_shows_every_flag_once() -> None:
    keys = [m[1] for m in COMMENTED_KEY.finditer(EXAMPLE)]
    assert sorted(keys) == sorted(o.flag for o in OPTIONS)


def test_example_config_loads_as_shipped_and_uncommented(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text(EXAMPLE)
    defaults = load_settings({}, None)
    assert load_settings({}, shipped).model_dump() == defaults.model_dump()
    uncommented = tmp_path / "uncommented.yaml"
    uncommented.write_text(COMMENTED_KEY.sub(r"\1: \2", EXAMPLE))
    assert set(yaml.safe_load(uncommented.read_text())) == {o.flag for o in OPTIONS}
    settings = load_settings({}, uncommented)
    # The values shown are the defaults (collector.timeout and kmsg.path show what their computed defaults come
    # to on a GPU node).
    computed = {"collector_timeout", "kmsg_path"}
    assert settings.model_dump(exclude=computed) == defaults.model_dump(exclude=computed)
    assert settings.read_timeout == defaults.read_timeout
    assert (settings.kmsg_path, defaults.kmsg_path) == (Path("/dev/kmsg"), None)


@pytest.mark.parametrize("name", ["gpu-triage.service", "gpu-triage.sysusers.conf", "config.yaml", "README.md"])
def test_shipped_files_exist(name: str) -> None:
    assert (SYSTEMD / name).is_file()
