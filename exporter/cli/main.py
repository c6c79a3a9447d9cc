"""The `gpu-triage` command line."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_triage import __version__
from gpu_triage.exporter.cli.export import CHOICES, WHAT

if TYPE_CHECKING:
    from gpu_triage.exporter.cli.check import DaemonClient

# A one-shot command (a health check, a prolog, `… | gpu-triage diagnose -`) imports only what it runs:
# the daemon's settings (pydantic), its server and its backends load for `serve` alone.


def _daemon_options(p: argparse.ArgumentParser, timeout: float = 5.0) -> None:
    """How to reach the daemon, for the commands that ask it (check, node-condition)."""
    p.add_argument(
        "--url",
        default=os.environ.get("GPU_TRIAGE_URL", "http://127.0.0.1:9481"),
        help="the daemon, http:// assumed when no scheme is given (env GPU_TRIAGE_URL; default %(default)s)",
    )
    p.add_argument(
        "--timeout", type=float, default=timeout, help=f"seconds to wait for the daemon (default {timeout:g})"
    )
    p.add_argument("--ca-file", metavar="FILE", help="CA certificate for a daemon served over TLS")
    p.add_argument("--user", help="basic-auth user, when the daemon's web config asks for one")
    p.add_argument("--password-file", metavar="FILE", help="file holding that user's password")


def _node_condition_parser(sub: Any) -> None:
    p = sub.add_parser(
        "node-condition",
        help="write the node's verdict to its Kubernetes Node as the condition GpuTriageUnhealthy",
        description="Ask the daemon for the node's verdict every --interval seconds and write it to this node's "
        "Node object as the condition GpuTriageUnhealthy (True: unhealthy, the reason is the action; False; "
        "Unknown: no verdict), with the pod's service-account token. It never cordons, drains or evicts. The "
        "sidecar of kubernetes/overlays/node-condition.",
    )
    _daemon_options(p, timeout=10.0)
    p.add_argument("--node", default=os.environ.get("NODE_NAME"), help="this node's name (env NODE_NAME)")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between looks at the daemon (default 15)")
    p.add_argument(
        "--heartbeat", type=float, default=300.0, help="rewrite an unchanged condition this often (default 300)"
    )
    p.add_argument("--api-server", help="the Kubernetes API server (default: the in-cluster one)")
    p.add_argument(
        "--token-file", type=Path, default=Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        help="the service-account token (default: the pod's)",
    )  # fmt: skip
    p.add_argument(
        "--api-ca-file", type=Path, default=Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        help="the API server's CA (default: the pod's)",
    )  # fmt: skip
    p.add_argument("--once", action="store_true", help="write the condition once and exit (1: not written)")
    p.add_argument("--log.level", dest="log_level", choices=("debug", "info", "warn", "error"), default="info")
    p.add_argument("--log.format", dest="log_format", choices=("logfmt", "json"), default="logfmt")


def _node_condition(args: argparse.Namespace) -> int:
    from gpu_triage.exporter.cli.node_condition import Options, in_cluster_api_server, run
    from gpu_triage.exporter.logs import setup_logging

    if not args.node:
        args.usage_parser.error("no node name: give --node or set NODE_NAME (the pod's spec.nodeName)")
    setup_logging(args.log_level, args.log_format)
    options = Options(
        _daemon(args),
        args.node,
        args.interval,
        args.heartbeat,
        args.api_server or in_cluster_api_server(),
        args.token_file,
        args.api_ca_file,
        args.once,
    )
    return run(options)


def _serve_parser(sub: Any, flags: bool) -> argparse.ArgumentParser:
    """`serve`; its flags (the daemon's settings, which import pydantic) only when `flags` (it runs, or
    its help is asked for)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the daemon",
        description="Run the gpu-triage daemon. Every flag can also be set in the --config file "
        "(key = flag name) or by an environment variable (GPU_TRIAGE_ + flag, e.g. GPU_TRIAGE_STATE_DIR).",
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="YAML config file (env GPU_TRIAGE_CONFIG)")
    if not flags:
        return p
    from gpu_triage.exporter.settings import OPTIONS

    for option in OPTIONS:
        kwargs: dict[str, Any] = {"dest": option.field, "default": argparse.SUPPRESS, "help": option.help}
        if option.kind == "switch":
            kwargs["action"] = "store_true"
        elif option.kind == "toggle":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif option.kind == "list":
            kwargs.update(action="append", metavar=option.metavar)
        else:
            kwargs["metavar"] = option.metavar
        p.add_argument(f"--{option.flag}", **kwargs)
    return p


def _parser(serve_flags: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-triage",
        description="GPU fault diagnosis for NVIDIA nodes: telemetry for Prometheus, XID and "
        "training-log diagnosis, remediation playbooks.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-triage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(sub, serve_flags)
    xid = sub.add_parser("xid", help="explain an XID code", description="What an XID code means and what to do.")
    xid.add_argument("code", type=int, help="the XID code, e.g. 79")
    xid.add_argument("--json", action="store_true", help="print JSON")
    check = sub.add_parser(
        "check",
        help="the node verdict, for health-check hooks",
        description="Ask the local daemon for the node verdict. Exit status: 0 healthy, 1 degraded (warning), "
        "2 unhealthy (critical), 3 unknown (including: the daemon does not answer).",
    )
    _daemon_options(check)
    check.add_argument(
        "--format",
        choices=("text", "json", "reason"),
        default="text",
        help="text (default); json: the diagnosis, also when there is no verdict; reason: one line such as "
        "'REBOOT_NODE: GPU 3 Xid 79 job 4242', for a drain reason",
    )
    check.add_argument("--json", action="store_true", help="the same as --format json")
    check.add_argument(
        "--gpus",
        metavar="LIST",
        help="only these GPUs, by NVML index or UUID, comma-separated (0,3): their verdict and exit status",
    )
    check.add_argument(
        "--performance",
        action="store_true",
        help="text: also why jobs are slow and which GPUs are held idle (the performance findings); the exit "
        "status stays the health verdict's",
    )
    _node_condition_parser(sub)
    diagnose = sub.add_parser(
        "diagnose",
        help="diagnose kernel and training logs, Flight Recorder dumps and NCCL RAS output offline",
        description="Find what went wrong in kernel logs (XIDs) and training logs (NCCL, PyTorch distributed), "
        "and which rank hung a job (PyTorch Flight Recorder dumps, NCCL RAS output, told by their content): "
        "root cause first, where (host, rank, GPU), what to do. Files may be gzipped; a folder is read "
        "whole, a tar or zip member by member; - reads stdin. Exit status: 0 nothing found (or only "
        "ignorable events), 1 findings, 2 an input could not be read or was empty.",
    )
    diagnose.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="log files (one per rank or interleaved), dumps, folders or archives of them (default -)",
    )
    diagnose.add_argument(
        "--json", action="store_true", help="print the diagnosis JSON (same as POST /api/v1/diagnose)"
    )
    vgpu = sub.add_parser(
        "vgpu",
        help="drive the virtual GPU (vgpu/) from a simulator scenario or a real node's nvidia-smi -q capture",
        description="Write a simulator scenario's GPUs to the virtual libnvidia-ml.so.1's state file every second, "
        "and serve POST/GET/DELETE /api/v1/sim/faults to inject faults; or, with --capture, write the GPUs of an "
        "`nvidia-smi -q -x` or `nvidia-smi -q` capture once and exit (vgpu/README.md).",
    )
    source = vgpu.add_mutually_exclusive_group()
    source.add_argument("--scenario", default="h100-training", help="built-in scenario name or file")
    source.add_argument("--capture", type=Path, help="a real node's nvidia-smi -q -x (XML) or -q (text) output")
    vgpu.add_argument("--state", type=Path, required=True, help="the state file (GPU_TRIAGE_VGPU_STATE of readers)")
    vgpu.add_argument("--web.listen-address", dest="listen", default="127.0.0.1:9482", help="the fault API")
    hold = sub.add_parser(
        "release",
        help="let the daemon on this node let go of NVML for a while, so that nvidia-smi -r can reset a GPU",
        description="nvidia-smi -r refuses to reset a GPU that a process holds, gpu-triage's NVML session included, "
        "and NVML cannot let go of one GPU alone: the daemon lets go of all of them, reports itself down, and takes "
        "NVML back when the hold ends or on --resume. Asked through the daemon's state directory (root or its user).",
    )
    hold.add_argument("--seconds", type=float, default=300.0, help="how long at most (10-900; default %(default)g)")
    hold.add_argument("--resume", action="store_true", help="take NVML back now")
    hold.add_argument(
        "--state.dir",
        dest="state_dir",
        type=Path,
        default=Path(os.environ.get("GPU_TRIAGE_STATE_DIR", "/var/lib/gpu-triage")),
        help="the daemon's --state.dir (env GPU_TRIAGE_STATE_DIR; default %(default)s)",
    )
    hold.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the daemon (default %(default)g)")
    alerts = sub.add_parser("alerts", help="the Prometheus alert rules")
    alert_commands = alerts.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)
    render = alert_commands.add_parser(
        "render",
        help="rewrite the rules' runbook (and dashboard) links for a published copy",
        description="Print the alert rules with every runbook_url pointing at BASE/<playbook id> instead of the "
        "daemon on the alerting node, e.g. --runbook-base https://wiki.example.com/gpu-runbooks.",
    )
    render.add_argument("file", nargs="?", help="a rules file to render instead of the shipped one (- reads stdin)")
    render.add_argument("--runbook-base", metavar="URL", help="where the playbooks are published (http or https)")
    render.add_argument("--dashboard-base", metavar="URL", help="the Grafana URL, for absolute dashboard links")
    export = sub.add_parser(
        "export",
        help="write the shipped alert rules, dashboards, systemd, Slurm or Kubernetes files or the runbooks into a "
        "directory",
        description="Write the files gpu-triage ships for one KIND into DIR (created if missing), one line per "
        "file: " + "; ".join(f"{kind}: {what}" for kind, what in WHAT.items()) + ". A file that exists with "
        "other content is left alone, and nothing is written, unless --force is given.",
    )
    export.add_argument("kind", choices=CHOICES, metavar="KIND", help=", ".join(CHOICES))
    export.add_argument("dir", type=Path, metavar="DIR", help="where to write them")
    export.add_argument("--force", action="store_true", help="replace files that differ from the shipped ones")
    for name, command in sub.choices.items():
        command.set_defaults(usage_parser=command)
        if name == "alerts":
            for inner in alert_commands.choices.values():
                inner.set_defaults(usage_parser=inner)
    return parser


def _serve(args: argparse.Namespace, unknown: list[str]) -> int:
    from gpu_triage.exporter.logs import setup_logging
    from gpu_triage.exporter.settings import SettingsError, load_settings

    cli = {k: v for k, v in vars(args).items() if k not in ("command", "config", "usage_parser")}
    config = args.config
    if config is None and (env_config := os.environ.get("GPU_TRIAGE_CONFIG")):
        config = Path(env_config)
    problems = [f"unknown flag {flag!r} (see gpu-triage serve --help)" for flag in unknown if flag.startswith("-")]
    problems += [f"unexpected argument {arg!r}" for arg in unknown if not arg.startswith("-")]
    try:
        settings = load_settings(cli, config)
    except SettingsError as e:
        problems += e.problems
    if problems:
        print("gpu-triage: cannot start, fix these first:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    from gpu_triage.exporter.http.server import StartupError, serve  # the server stack loads only when serving

    try:
        serve(settings)
    except StartupError as e:
        print(f"gpu-triage: {e}", file=sys.stderr)
        return 1
    return 0


def _daemon(args: argparse.Namespace) -> DaemonClient:
    from gpu_triage.exporter.cli.check import DaemonClient

    return DaemonClient(args.url, args.timeout, args.ca_file, args.user, args.password_file)


def _data_ok() -> bool:
    """Whether the diagnosis data is sound; says what is wrong with it, all at once, when it is not. The
    checked knowledge comes from the cache when it holds this data version's (diagnosis/knowledge/cache.py)."""
    from gpu_triage.diagnosis.core.data_files import DataError
    from gpu_triage.diagnosis.knowledge import cache as knowledge
    from gpu_triage.exporter.cache_store import store_from_env

    try:
        knowledge.load(store_from_env())
    except DataError as e:
        print(f"gpu-triage: {e}", file=sys.stderr)
        return False
    return True


_NEGATIVE = re.compile(r"-\.?\d")


def _value_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option, of every command, that takes a value."""
    flags: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _value_flags(sub)
        elif action.nargs != 0:
            flags.update(s for s in action.option_strings if s.startswith("--"))
    return flags


def _glue_negative_values(argv: list[str], value_flags: set[str]) -> list[str]:
    """`--collector.interval -1s` as `--collector.interval=-1s`: argparse takes '-1s' for an option and
    would complain of a missing value, where the user needs to hear that the value must be positive."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in value_flags and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    args, unknown = parser.parse_known_args(_glue_negative_values(argv, _value_flags(parser)))
    if args.command == "serve":
        return _serve(args, unknown)
    if unknown:
        usage: argparse.ArgumentParser = getattr(args, "usage_parser", parser)
        usage.error(f"unrecognised arguments: {' '.join(unknown)}")
    if args.command in ("xid", "diagnose") and not _data_ok():
        return 2
    if args.command == "xid":
        from gpu_triage.exporter.cli.commands import explain_xid

        return explain_xid(args.code, args.json)
    if args.command == "check":
        from gpu_triage.exporter.cli.check import check

        return check(_daemon(args), "json" if args.json else args.format, args.gpus, performance=args.performance)
    if args.command == "node-condition":
        return _node_condition(args)
    if args.command == "diagnose":
        from gpu_triage.exporter.cli.commands import diagnose_files

        return diagnose_files(args.files, args.json)
    if args.command == "vgpu":
        if args.capture is not None:
            from gpu_triage.exporter.vgpu.capture_run import run_capture

            return run_capture(args.capture, args.state)
        from gpu_triage.exporter.http.vgpu_app import run
        from gpu_triage.exporter.logs import setup_logging

        setup_logging("info", "logfmt")
        return run(args.scenario, args.state, args.listen)
    if args.command == "release":
        from gpu_triage.exporter.cli.release import release

        return release(args.state_dir, args.seconds, args.resume, args.wait)
    if args.command == "alerts":
        from gpu_triage.exporter.cli.commands import render_alerts

        return render_alerts(args.file, args.runbook_base, args.dashboard_base)
    if args.command == "export":
        from gpu_triage.exporter.cli.commands import export_files

        return export_files(args.kind, args.dir, args.force)
    parser.print_help(sys.stderr)
    return 2


def _command(argv: list[str]) -> str | None:
    """The command `argv` names: its first word that is no option (the top level's take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Every error a user can cause ends in one line on stderr and a non-zero status, never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    try:
        return _run(_parser(serve_flags=_command(args) == "serve"), args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (`| head`) went away: say nothing, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        print(f"gpu-triage: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
