"""The daemon under a long, busy run: do its memory, descriptors, threads and journal stay flat? Figures,
not pass/fail; not run in CI.

    .venv/bin/python bench/bench_soak.py                      # an hour, polling every second
    .venv/bin/python bench/bench_soak.py --duration 2m        # a short run

Starts `gpu-triage serve` on the simulator (--collector.interval 1s by default) with its own state
directory and kernel-log file, and keeps it busy for `--duration`:

- the h100-faults scenario's faults, replayed every `--cycle` through the fault API (the scenario itself
  plays once), with its XIDs also written to the kernel log, then every fault cleared and every GPU
  acknowledged;
- `--scrapers` clients reading /metrics every second, and one reading the diagnosis, the events and the
  landing page;
- a training log POSTed to /api/v1/diagnose every `--upload-every`.

It prints the daemon's resident memory, open descriptors, threads and journal size (the database, and its
write-ahead log apart) after a warm-up and
at the end (and every `--report-every` in between), and how many requests failed.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.exporter.backends.sim import FaultKind, SimBackend, load_scenario
from gpu_triage.exporter.settings import parse_duration
from tests.daemon_proc import Daemon, serve

REPO = Path(__file__).resolve().parent.parent
TRAINING_LOG = REPO / "tests/fixtures/training/scenarios/xid79_with_nccl.log"


def kernel_bus_ids() -> dict[int, str]:
    """The simulated GPUs' PCI bus ids as the driver prints them in an Xid line (0000:5d:00.0 -> 5d:00)."""
    sim = SimBackend(load_scenario("h100-faults"))
    try:
        return {g.index: g.pci_bus_id.removeprefix("0000:")[:-2] for g in sim.discover()}
    finally:
        sim.close()


def figures(d: Daemon) -> dict[str, float]:
    pid = d.process.pid
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)

    def kib(name: str) -> float:
        path = d.state / name
        return path.stat().st_size / 1024 if path.exists() else 0.0

    return {
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "fds": len(list(Path(f"/proc/{pid}/fd").iterdir())),
        "threads": int(status["Threads"]),
        "journal_kib": kib("journal.sqlite3"),
        "wal_kib": kib("journal.sqlite3-wal"),  # reused after each checkpoint (SQLite: every 1000 pages)
    }


def show(label: str, f: dict[str, float], elapsed: float) -> None:
    print(
        f"{label:>6} t={elapsed:7.0f}s  RSS {f['rss_mib']:6.1f} MiB  fds {f['fds']:4.0f}  threads {f['threads']:3.0f}"
        f"  journal {f['journal_kib']:8.1f} KiB (+ WAL {f['wal_kib']:7.1f} KiB)",
        flush=True,
    )


class Load:
    """The clients, each on a thread, counting what they were answered."""

    def __init__(self, d: Daemon, args: argparse.Namespace) -> None:
        self.d, self.args = d, args
        self.stop = threading.Event()
        self.answers: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def count(self, what: str, response: httpx.Response | None, error: Exception | None = None) -> None:
        key = f"{what} {response.status_code}" if response is not None else f"{what} {type(error).__name__}"
        with self.lock:
            self.answers[key] += 1

    def every(self, seconds: float, what: str, call: Callable[[httpx.Client], httpx.Response]) -> None:
        with httpx.Client(base_url=self.d.url, timeout=30) as c:
            while not self.stop.wait(seconds):
                try:
                    self.count(what, call(c))
                except httpx.HTTPError as e:
                    self.count(what, None, e)

    def faults(self) -> None:
        """The fault scenario, replayed every cycle, compressed into its first half."""
        scenario = load_scenario("h100-faults").faults
        bus = kernel_bus_ids()
        last = max(f.at_seconds for f in scenario)
        json = {"content-type": "application/json"}
        with httpx.Client(base_url=self.d.url, timeout=60) as c:
            for _ in itertools.count():
                start = time.monotonic()
                for f in sorted(scenario, key=lambda f: f.at_seconds):
                    at = start + f.at_seconds / last * self.args.cycle / 2
                    if self.stop.wait(max(0.0, at - time.monotonic())):
                        return
                    spec = f.model_dump(exclude={"at_seconds"}, exclude_none=True, mode="json")
                    if "duration_seconds" in spec:
                        spec["duration_seconds"] = min(spec["duration_seconds"], self.args.cycle / 4)
                    self.count("inject", c.post("/api/v1/sim/faults", json=spec, headers=json))
                    if f.kind is FaultKind.XID:
                        with self.d.kmsg.open("a") as k:
                            k.write(f"NVRM: Xid (PCI:0000:{bus[f.gpu]}): {f.xid}, pid=1234, name=python, {f.message}\n")
                if self.stop.wait(max(0.0, start + self.args.cycle - time.monotonic())):
                    return
                self.count("clear", c.delete("/api/v1/sim/faults"))
                for gpu in range(8):
                    self.count("acknowledge", c.post(f"/api/v1/gpus/{gpu}/acknowledge", json={"note": "soak"}))

    def start(self) -> list[threading.Thread]:
        log = TRAINING_LOG.read_bytes()
        jobs = [
            *[(1.0, "metrics", lambda c: c.get("/metrics")) for _ in range(self.args.scrapers)],
            (2.0, "diagnosis", lambda c: c.get("/api/v1/diagnosis")),
            (5.0, "events", lambda c: c.get("/api/v1/events", params={"limit": 100})),
            (5.0, "landing", lambda c: c.get("/")),
            (self.args.upload_every, "diagnose", lambda c: c.post("/api/v1/diagnose", content=log)),
        ]
        threads = [threading.Thread(target=self.every, args=job, daemon=True) for job in jobs]
        threads.append(threading.Thread(target=self.faults, daemon=True))
        for t in threads:
            t.start()
        return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=parse_duration, default=3600.0, help="how long (1h, 10m, 90s)")
    parser.add_argument("--interval", default="1s", help="the daemon's --collector.interval")
    parser.add_argument("--cycle", type=parse_duration, default=120.0, help="one replay of the fault scenario")
    parser.add_argument("--scrapers", type=int, default=2)
    parser.add_argument("--upload-every", type=parse_duration, default=5.0)
    parser.add_argument("--warm-up", type=parse_duration, default=30.0, help="before the first figures")
    parser.add_argument("--report-every", type=parse_duration, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        flags = ["--collector.interval", args.interval, "--log.level", "warn"]
        with serve(state, *flags) as d:
            load = Load(d, args)
            threads = load.start()
            t0 = time.monotonic()
            time.sleep(min(args.warm_up, args.duration))
            first = figures(d)
            show("start", first, time.monotonic() - t0)
            next_report = time.monotonic() + args.report_every
            while time.monotonic() - t0 < args.duration:
                time.sleep(min(5.0, max(0.0, args.duration - (time.monotonic() - t0))))
                if time.monotonic() >= next_report:
                    show("", figures(d), time.monotonic() - t0)
                    next_report += args.report_every
            last = figures(d)
            show("end", last, time.monotonic() - t0)
            load.stop.set()
            for t in threads:
                t.join(timeout=60)
            alive = d.process.poll() is None
            errors = [line for line in d.output().splitlines() if "level=error" in line]
        print("change: " + ", ".join(f"{k} {last[k] - first[k]:+.1f}" for k in first))
        print(f"daemon still running at the end: {alive}; error lines in its log: {len(errors)}")
        for line in errors[:5]:
            print("  " + line[:300])
        print("answers:", dict(sorted(load.answers.items())))


if __name__ == "__main__":
    main()
