"""The `gpu-triage` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gpu_triage import __version__
from gpu_triage.exporter.logs import setup_logging
from gpu_triage.exporter.settings import OPTIONS, SettingsError, load_settings


def _serve_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run the daemon",
        description="Run the gpu-triage daemon. Every flag can also be set in the --config file "
        "(key = flag name) or by an environment variable (GPU_TRIAGE_ + flag, e.g. GPU_TRIAGE_STATE_DIR).",
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="YAML config file (env GPU_TRIAGE_CONFIG)")
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-triage",
        description="GPU fault diagnosis for NVIDIA nodes: telemetry for Prometheus, XID and "
        "training-log diagnosis, remediation playbooks.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-triage {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(sub)
    xid = sub.add_parser("xid", help="explain an XID code", description="What an XID code means and what to do.")
    xid.add_argument("code", type=int, help="the XID code, e.g. 79")
    xid.add_argument("--json", action="store_true", help="print JSON")
    check = sub.add_parser(
        "check",
        help="the node verdict, for health-check hooks",
        description="Ask the local daemon for the node verdict. Exit status: 0 healthy, 1 degraded (warning), "
        "2 unhealthy (critical), 3 unknown (including: the daemon does not answer).",
    )
    check.add_argument(
        "--url",
        default=os.environ.get("GPU_TRIAGE_URL", "http://127.0.0.1:9481"),
        help="the daemon (env GPU_TRIAGE_URL)",
    )
    check.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the daemon (default 5)")
    check.add_argument("--json", action="store_true", help="print the whole diagnosis as JSON")
    check.add_argument("--ca-file", metavar="FILE", help="CA certificate for a daemon served over TLS")
    check.add_argument("--user", help="basic-auth user, when the daemon's web config asks for one")
    check.add_argument("--password-file", metavar="FILE", help="file holding that user's password")
    diagnose = sub.add_parser(
        "diagnose",
        help="diagnose kernel and training logs offline",
        description="Find what went wrong in kernel logs (XIDs) and training logs (NCCL, PyTorch distributed): "
        "root cause first, where (host, rank, GPU), what to do. Files may be gzipped; - reads stdin. "
        "Exit status: 0 nothing found, 1 findings, 2 an input could not be read.",
    )
    diagnose.add_argument("files", nargs="*", metavar="FILE", help="log files, one per rank or interleaved (default -)")
    diagnose.add_argument(
        "--json", action="store_true", help="print the diagnosis JSON (same as POST /api/v1/diagnose)"
    )
    vgpu = sub.add_parser(
        "vgpu",
        help="drive the virtual GPU (vgpu/) from a simulator scenario",
        description="Write a simulator scenario's GPUs to the virtual libnvidia-ml.so.1's state file every second, "
        "and serve POST/GET/DELETE /api/v1/sim/faults to inject faults (vgpu/README.md).",
    )
    vgpu.add_argument("--scenario", default="h100-training", help="built-in scenario name or file")
    vgpu.add_argument("--state", type=Path, required=True, help="the state file (GPU_TRIAGE_VGPU_STATE of readers)")
    vgpu.add_argument("--web.listen-address", dest="listen", default="127.0.0.1:9482", help="the fault API")
    alerts = sub.add_parser("alerts", help="the Prometheus alert rules")
    alert_commands = alerts.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)
    render = alert_commands.add_parser(
        "render",
        help="rewrite the rules' runbook (and dashboard) links for a published copy",
        description="Print the alert rules with every runbook_url pointing at BASE/<playbook id> instead of the "
        "daemon on the alerting node, e.g. --runbook-base https://wiki.example.com/gpu-runbooks.",
    )
    render.add_argument("file", nargs="?", default="-", help="the rules file (alerts/gpu-triage.rules.yml; - stdin)")
    render.add_argument("--runbook-base", metavar="URL", help="where the playbooks are published")
    render.add_argument("--dashboard-base", metavar="URL", help="the Grafana URL, for absolute dashboard links")
    return parser


def _serve(args: argparse.Namespace, unknown: list[str]) -> int:
    cli = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
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


def _data_ok() -> bool:
    """Whether the diagnosis data is sound; says what is wrong with it, all at once, when it is not."""
    from gpu_triage.diagnosis.data_check import check_data
    from gpu_triage.diagnosis.data_files import DataError

    try:
        check_data()
    except DataError as e:
        print(f"gpu-triage: {e}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "serve":
        return _serve(args, unknown)
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    if args.command in ("xid", "diagnose") and not _data_ok():
        return 2
    if args.command == "xid":
        from gpu_triage.exporter.cli.commands import explain_xid

        return explain_xid(args.code, args.json)
    if args.command == "check":
        from gpu_triage.exporter.cli.commands import check

        return check(
            args.url, args.timeout, args.json, ca_file=args.ca_file, user=args.user, password_file=args.password_file
        )
    if args.command == "diagnose":
        from gpu_triage.exporter.cli.commands import diagnose_files

        return diagnose_files(args.files, args.json)
    if args.command == "vgpu":
        from gpu_triage.exporter.backends.sim.vgpu_driver import run

        setup_logging("info", "logfmt")
        return run(args.scenario, args.state, args.listen)
    if args.command == "alerts":
        from gpu_triage.exporter.cli.commands import render_alerts

        return render_alerts(args.file, args.runbook_base, args.dashboard_base)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
