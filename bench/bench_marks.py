"""What a pile of acknowledgements costs: figures, not pass/fail.

    .venv/bin/python bench/bench_marks.py [--marks 300000]

Journals `--marks` acknowledgement marks spread over the simulated node's GPUs (what a script
acknowledging in a loop leaves behind), starts a daemon on that journal, then times a render (what every
poll does) and an acknowledgement through the HTTP API.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.exporter.backends.sim import SimBackend, load_scenario
from gpu_triage.exporter.daemon import Daemon
from gpu_triage.exporter.http.app import create_app
from gpu_triage.exporter.settings import load_settings
from gpu_triage.exporter.sources.journal import Journal, Mark


def ms(samples: list[float]) -> str:
    return f"median {1000 * statistics.median(samples):.2f} ms, max {1000 * max(samples):.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--marks", type=int, default=300_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / "kmsg.log").touch()
        settings = load_settings(
            {"backend": "sim", "state_dir": state, "kmsg_path": state / "kmsg.log", "collector_interval": 3600}, None
        )
        sim = SimBackend(load_scenario("h100-training"))
        uuids = [g.uuid for g in sim.discover()]
        now = time.time()
        journal = Journal(state / "journal.sqlite3")
        marks = [Mark(now - args.marks + i, uuids[i % len(uuids)], "acknowledged", "") for i in range(args.marks)]
        journal.record([], None, marks)
        journal.close()
        t0 = time.perf_counter()
        daemon = Daemon(sim, settings)
        daemon.start()
        print(f"{args.marks} marks journaled; start (loading them once): {time.perf_counter() - t0:.2f} s")
        try:
            renders = []
            for _ in range(20):
                t0 = time.perf_counter()
                daemon.refresh()
                renders.append(time.perf_counter() - t0)
            print(f"render (every poll): {ms(renders)}")
            acks = []
            with TestClient(create_app(daemon)) as client:
                for i in range(20):
                    t0 = time.perf_counter()
                    assert client.post(f"/api/v1/gpus/{i % 8}/acknowledge").status_code == 200
                    acks.append(time.perf_counter() - t0)
            print(f"POST /api/v1/gpus/N/acknowledge: {ms(acks)}")
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
