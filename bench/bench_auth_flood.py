"""Correct scrapes under a flood of wrong basic-auth passwords: figures, not pass/fail.

    .venv/bin/python bench/bench_auth_flood.py [--attackers 40] [--seconds 15] [--cost 10] [--fresh]

Starts `gpu-triage serve` on the simulator with a web config holding one bcrypt user, scrapes once with
the right password (Prometheus was scraping before; with --fresh it was not: right after a restart), then
runs `--attackers` threads that each send a new wrong password as fast as they are answered, from other
loopback addresses (127.0.0.2 and up, one per four threads), while one scraper with the right password, from
127.0.0.1, measures how long /metrics takes. Prints the scraper's first scrape and its latency after, and
what the attackers were answered.
"""

from __future__ import annotations

import argparse
import collections
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import bcrypt
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_proc import serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attackers", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--cost", type=int, default=10, help="bcrypt cost of the user's hash")
    parser.add_argument("--fresh", action="store_true", help="the scraper was not seen before the flood")
    parser.add_argument("--wait", type=float, default=1.0, help="seconds of flood before the scraper starts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=args.cost)).decode()
        config = home / "web.yml"
        config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        with serve(home / "state", "--web.config.file", str(config)) as d:
            good = ("prometheus", "s3cret")
            if not args.fresh:
                t0 = time.perf_counter()
                first = httpx.get(f"{d.url}/metrics", auth=good, timeout=30)
                print(
                    f"first scrape (a bcrypt round, cost {args.cost}): {1000 * (time.perf_counter() - t0):.0f} ms,"
                    f" status {first.status_code}"
                )
            stop = threading.Event()
            answers: collections.Counter[str] = collections.Counter()

            def attack(source: str) -> None:
                with httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address=source)) as c:
                    while not stop.is_set():
                        try:
                            status = c.get(f"{d.url}/metrics", auth=("prometheus", secrets.token_hex(8))).status_code
                            answers[str(status)] += 1
                        except httpx.TransportError as e:
                            answers[type(e).__name__] += 1

            threads = [threading.Thread(target=attack, args=(f"127.0.0.{2 + i // 4}",)) for i in range(args.attackers)]
            for t in threads:
                t.start()
            latencies, failures, first_ok = [], 0, None
            time.sleep(args.wait)  # the flood is under way
            with httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.1")) as scraper:
                began = time.perf_counter()
                deadline = time.monotonic() + args.seconds
                while time.monotonic() < deadline:
                    t0 = time.perf_counter()
                    ok = scraper.get(f"{d.url}/metrics", auth=good).status_code == 200
                    latencies.append(1000 * (time.perf_counter() - t0))
                    failures += not ok
                    if ok and first_ok is None:
                        first_ok = 1000 * (time.perf_counter() - began)
                    time.sleep(0.05)
            stop.set()
            for t in threads:
                t.join()
        q = statistics.quantiles(latencies, n=100)
        seen = "not seen before the flood" if args.fresh else "seen before the flood"
        print(f"scraper ({seen}), after {args.wait:g}s of flood: first answer {latencies[0]:.0f} ms, first 200 after "
              f"{first_ok:.0f} ms" if first_ok is not None else "never answered 200")  # fmt: skip
        print(
            f"{args.attackers} attackers for {args.seconds:g}s; correct scrapes: {len(latencies)}, "
            f"failed {failures}; latency p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, max {max(latencies):.1f} ms"
        )
        print("attackers were answered:", dict(answers))


if __name__ == "__main__":
    main()
