"""The daemon's settings: every flag, also settable in the YAML config file and by environment variable.

Precedence, highest first: command-line flag, environment variable (`GPU_TRIAGE_` + the flag
upper-cased with `.` and `-` as `_`), the YAML file given by `--config` (keys are the flag names
without `--`), the default. Problems are collected and reported together, naming the flag.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_triage.exporter.backends.select import BackendName

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> Any:
    """'500ms', '5s', '1m30s', '2h' or a plain number of seconds -> seconds."""
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    if re.fullmatch(r"-\s*\.?\d.*", text):
        raise ValueError("must be positive")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration (examples: 500ms, 5s, 1m30s, 2h)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}


def parse_size(value: Any) -> Any:
    """'64MiB', '1GiB', '500MB' or a plain number of bytes -> bytes."""
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return value
    m = _SIZE.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"{value!r} is not a size (examples: 64MiB, 1GiB, 500MB, 1048576)")
    return int(m[1]) * _SIZE_UNITS[(m[2] or "b").lower()]


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]
Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
LogLevel = Literal["debug", "info", "warn", "error"]
LogFormat = Literal["logfmt", "json"]


class SettingsError(Exception):
    """Bad flags, environment or config file; `problems` lists every one of them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


DEV_KMSG = Path("/dev/kmsg")


class Settings(BaseModel):
    """What `load_settings` layers (flags, environment, config file) and checks; the defaults are checked too."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    web_listen_address: list[str] = [":9481"]
    web_telemetry_path: str = "/metrics"
    web_config_file: Path | None = None
    web_disable_exporter_metrics: bool = False
    web_read_only: bool = False
    web_allowed_hosts: list[str] = []
    web_read_header_timeout: Duration = 10.0
    web_read_timeout: Duration = 60.0
    web_max_connections: Annotated[int, Field(ge=8, le=1_000_000)] = 512
    backend: BackendName = "auto"
    sim_scenario: str = "h100-training"
    dcgm_address: str | None = None
    dcgm_bindings_dir: Path | None = None
    collector_interval: Duration = 5.0
    collector_slow_interval: Duration = 60.0
    collector_timeout: Duration | None = None
    state_dir: Path = Field(default_factory=lambda: default_state_dir()[0])
    journal_retention: Duration = 30 * 86400.0
    kmsg_path: Path | None = None  # /dev/kmsg; the simulator's node has its own (see daemon.kernel_log)
    source_kmsg: bool = True
    source_events: bool = True
    diagnose_max_bytes: Size = 64 * 1024**2
    diagnose_max_cpu: Duration = 20.0
    kubernetes_pod_resources_socket: str = "auto"
    path_procfs: Path = Path("/proc")
    performance_window: Duration = 300.0
    performance_node_role: Literal["", "training", "inference"] = ""
    log_level: LogLevel = "info"
    log_format: LogFormat = "logfmt"

    @field_validator("web_listen_address", "web_allowed_hosts", mode="before")
    @classmethod
    def _split_addresses(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):  # each flag, env value or config entry may list several
            return [a.strip() for item in value for a in str(item).split(",") if a.strip()]
        return value

    @field_validator("web_listen_address")
    @classmethod
    def _valid_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            parse_listen_address(address)
        return value

    @field_validator("web_allowed_hosts")
    @classmethod
    def _host_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})", name):
                raise ValueError(f"{name!r} is not a host name (example: gpu-node-01.example.com)")
        return value

    @field_validator("dcgm_address")
    @classmethod
    def _host_engine_address(cls, value: str | None) -> str | None:
        from gpu_triage.exporter.backends.dcgm.address import Address

        if value is not None:
            Address.parse(value)
        return value

    @field_validator("kubernetes_pod_resources_socket")
    @classmethod
    def _socket_setting(cls, value: str) -> str:
        if value not in ("auto", "off") and not value.startswith("/"):
            raise ValueError("must be auto, off, or the socket's absolute path")
        return value

    @field_validator("collector_interval", "collector_slow_interval")
    @classmethod
    def _poll_often_enough_not_too_often(cls, value: float) -> float:
        # Below this every read would time out (reads get 80 % of the interval), and a GPM sample pair needs
        # 110 ms: the daemon would only spin.
        if value < 0.5:
            raise ValueError("must be at least 0.5s")
        return value

    @model_validator(mode="after")
    def _slow_not_faster_than_fast(self) -> Settings:
        if self.collector_slow_interval < self.collector_interval:
            raise ValueError("collector.slow-interval must not be shorter than collector.interval")
        return self

    @field_validator("web_telemetry_path")
    @classmethod
    def _absolute_path(cls, value: str) -> str:
        if not value.startswith("/") or value == "/":
            raise ValueError("must start with / and not be / itself (the landing page)")
        return value

    @property
    def read_timeout(self) -> float:
        """How long a driver call may take before it counts as hung."""
        if self.collector_timeout is not None:
            return self.collector_timeout
        return min(0.8 * self.collector_interval, 10.0)


SYSTEM_STATE_DIR = Path("/var/lib/gpu-triage")


def default_state_dir() -> tuple[Path, str]:
    """Where the journal lives when --state.dir is not given, and why there.

    Under systemd, the unit's StateDirectory= (systemd says where in $STATE_DIRECTORY, the first of its
    colon-separated list); else for root the system's place; else the user's own state directory (XDG Base
    Directory), so that `gpu-triage serve` works as a normal user with nothing set up."""
    if given := os.environ.get("STATE_DIRECTORY", "").split(":")[0]:
        return Path(given), "StateDirectory= of the systemd unit ($STATE_DIRECTORY)"
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR, "the default for root"
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if xdg.startswith("/"):  # a relative value is invalid and must be ignored (XDG Base Directory spec)
        return Path(xdg) / "gpu-triage", "the default for a user other than root ($XDG_STATE_HOME)"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no $HOME and no passwd entry (a container's numeric user)
        return SYSTEM_STATE_DIR, "the default when the user has no home directory"
    return home / ".local/state/gpu-triage", "the default for a user other than root"


def state_dir_origin(settings: Settings) -> str:
    """Why the journal is where it is: the setting, or default_state_dir()'s reason."""
    if "state_dir" in settings.model_fields_set:
        return "--state.dir"
    return default_state_dir()[1]


def parse_listen_address(address: str) -> tuple[str, int]:
    """':9481' -> ('', 9481) (every address); '127.0.0.1:0'; '[::1]:9481'."""
    m = re.fullmatch(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", address)
    if m is None or int(m["port"]) > 65535:
        raise ValueError(f"{address!r} is not host:port (examples: :9481, 127.0.0.1:9481, [::1]:9481)")
    return m["v6"] or m["host"] or "", int(m["port"])


@dataclass(frozen=True)
class Option:
    flag: str  # without the leading --
    field: str
    help: str
    metavar: str | None = None
    kind: Literal["value", "list", "switch", "toggle"] = "value"  # switch: --x; toggle: --x / --no-x


OPTIONS = (
    Option(
        "web.listen-address",
        "web_listen_address",
        "address to serve on; repeat or comma-separate for several (default :9481)",
        "ADDR",
        "list",
    ),
    Option("web.telemetry-path", "web_telemetry_path", "path of the metrics endpoint (default /metrics)", "PATH"),
    Option(
        "web.config.file",
        "web_config_file",
        "TLS and basic-auth configuration, in the exporter-toolkit format (default: plain HTTP, no auth)",
        "FILE",
    ),
    Option(
        "web.disable-exporter-metrics",
        "web_disable_exporter_metrics",
        "leave out the daemon's own process_* and python_* metrics",
        kind="switch",
    ),
    Option(
        "web.read-only",
        "web_read_only",
        "refuse every request that changes state (acknowledgements, simulator faults) with 403",
        kind="switch",
    ),
    Option(
        "web.allowed-hosts",
        "web_allowed_hosts",
        "more names requests that change state may give as Host, besides IP addresses, localhost and this "
        "machine's name (against DNS rebinding); repeat or comma-separate",
        "NAME",
        "list",
    ),
    Option(
        "web.read-header-timeout",
        "web_read_header_timeout",
        "a connection must send a request's headers within this, or is closed (default 10s)",
        "DURATION",
    ),
    Option(
        "web.read-timeout",
        "web_read_timeout",
        "a request's body must arrive within this, or is refused with 408 (default 1m)",
        "DURATION",
    ),
    Option(
        "web.max-connections",
        "web_max_connections",
        "open HTTP connections at most, also kept below the file-descriptor limit (default 512)",
        "N",
    ),
    Option(
        "backend",
        "backend",
        "GPU backend: auto (DCGM when a host engine answers, else NVML), nvml, dcgm, sim (default auto)",
        "NAME",
    ),
    Option(
        "sim.scenario",
        "sim_scenario",
        "simulator scenario: a built-in name or a YAML file (default h100-training)",
        "NAME|FILE",
    ),
    Option(
        "dcgm.address",
        "dcgm_address",
        "the DCGM host engine: host:port or unix:///path (default localhost:5555, then unix:///tmp/nv-hostengine)",
        "ADDR",
    ),
    Option(
        "dcgm.bindings-dir",
        "dcgm_bindings_dir",
        "DCGM's Python bindings (default: where DCGM 4, then DCGM 3, installs them)",
        "DIR",
    ),
    Option(
        "collector.interval",
        "collector_interval",
        "how often to read fast-changing fields (default 5s)",
        "DURATION",
    ),
    Option(
        "collector.slow-interval",
        "collector_slow_interval",
        "how often to read inventory, ECC, remapped rows and profiling (default 1m)",
        "DURATION",
    ),
    Option(
        "collector.timeout",
        "collector_timeout",
        "a driver call taking longer counts as hung (default 0.8 x interval, at most 10s)",
        "DURATION",
    ),
    Option(
        "state.dir",
        "state_dir",
        "where the event journal lives (default: $STATE_DIRECTORY under systemd, /var/lib/gpu-triage for root, "
        "else $XDG_STATE_HOME/gpu-triage or ~/.local/state/gpu-triage)",
        "DIR",
    ),
    Option(
        "journal.retention",
        "journal_retention",
        "how long journaled events are kept (default 30d)",
        "DURATION",
    ),
    Option(
        "kmsg.path",
        "kmsg_path",
        "kernel log to follow: /dev/kmsg, or a file (default /dev/kmsg; with --backend sim, kmsg.log in --state.dir)",
        "PATH",
    ),
    Option("source.kmsg", "source_kmsg", "read XIDs from the kernel log (default on)", kind="toggle"),
    Option(
        "source.events",
        "source_events",
        "read XIDs from the driver's event API, NVML or the simulator (default on)",
        kind="toggle",
    ),
    Option(
        "diagnose.max-bytes",
        "diagnose_max_bytes",
        "largest log POST /api/v1/diagnose accepts, compressed and decompressed (default 64MiB)",
        "SIZE",
    ),
    Option(
        "diagnose.max-cpu",
        "diagnose_max_cpu",
        "CPU time one POST /api/v1/diagnose may take before it is refused with 413 (default 20s)",
        "DURATION",
    ),
    Option(
        "kubernetes.pod-resources-socket",
        "kubernetes_pod_resources_socket",
        "the kubelet's pod-resources socket, to name the pod on each GPU: auto (the kubelet's default path when "
        "it is there), off, or a path (default auto)",
        "auto|off|PATH",
    ),
    Option(
        "path.procfs",
        "path_procfs",
        "where /proc is, to name the Slurm job of each GPU process from its cgroup (default /proc)",
        "DIR",
    ),
    Option(
        "performance.window",
        "performance_window",
        "the base window of the performance findings; each class judges a multiple of it (idle GPUs three) "
        "(default 5m)",
        "DURATION",
    ),
    Option(
        "performance.node-role",
        "performance_node_role",
        "training or inference: what MIG mode the node's GPUs should be in (mig_policy finding); empty: not "
        "judged (default empty)",
        "ROLE",
    ),
    Option("log.level", "log_level", "debug, info, warn or error (default info)", "LEVEL"),
    Option("log.format", "log_format", "logfmt or json (default logfmt)", "FORMAT"),
)
_BY_FIELD = {o.field: o for o in OPTIONS}
_BY_FLAG = {o.flag: o for o in OPTIONS}


ENV_PREFIX = "GPU_TRIAGE_"


def env_name(flag: str) -> str:
    return ENV_PREFIX + re.sub(r"[.-]", "_", flag).upper()


def _read_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        return {}, [f"config file {path}: cannot read it: {e}"]
    except yaml.YAMLError as e:
        return {}, [f"config file {path}: not valid YAML: {e}"]
    if doc is None:
        return {}, []
    if not isinstance(doc, dict):
        return {}, [f"config file {path}: must be a mapping of flag names to values"]
    values, problems = {}, []
    for key, value in doc.items():
        option = _BY_FLAG.get(str(key))
        if option is None:
            problems.append(
                f"config file {path}: unknown key {key!r} (keys are the flag names, e.g. web.listen-address)"
            )
        else:
            values[option.field] = value
    return values, problems


def _read_env() -> dict[str, Any]:
    """The settings given by environment variable, by field name: GPU_TRIAGE_ + the field, in any case, each
    value as it is (a list's comma-separated)."""
    fields = {name.upper(): name for name in Settings.model_fields}
    values = {}
    for name, value in os.environ.items():
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and (field := fields.get(upper.removeprefix(ENV_PREFIX))) is not None:
            values[field] = value
    return values


def load_settings(cli: dict[str, Any], config: Path | None) -> Settings:
    """Settings from explicit flags (`cli`, by field name), the environment and the config file."""
    file_values, problems = _read_config(config) if config is not None else ({}, [])
    try:
        settings = Settings(**{**file_values, **_read_env(), **cli})
    except ValidationError as e:
        problems += [_describe(err) for err in e.errors()]
    if problems:
        raise SettingsError(problems)
    return settings


def _describe(err: Any) -> str:
    field = str(err["loc"][0]) if err["loc"] else ""
    option = _BY_FIELD.get(field)
    where = f"--{option.flag} (or {env_name(option.flag)})" if option else field or "settings"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err.get("type") == "greater_than" and err.get("ctx", {}).get("gt") == 0:
        message = "must be positive"
    value = err.get("input")
    shown = f" (got {value!r})" if isinstance(value, str | int | float) else ""
    return f"{where}: {message}{shown}"
