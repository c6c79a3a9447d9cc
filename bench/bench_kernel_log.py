"""Throughput of `diagnosis.xid.kernel_parser.scan` against `grep -c 'NVRM: Xid'` on the same big kernel log.

    .venv/bin/python bench/bench_kernel_log.py              # 1 GB, generated once under bench/out/
    .venv/bin/python bench/bench_kernel_log.py --size-mb 64

Prints figures only; there is no pass/fail. The log is mostly ordinary kernel chatter with, every few
thousand lines, one line of each shape the parser accepts. grep runs with LC_ALL=C, its fastest mode.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_triage.diagnosis.xid.kernel_parser import ScanStats, scan

OUT = Path(__file__).resolve().parent / "out"
CHUNK = 8 << 20

_CHATTER = (
    "eth{n}: Link is Up - 100Gbps/Full - flow control rx/tx",
    "mlx5_core 0000:{b:02x}:00.0: mlx5_fw_tracer_handle_traces:{n}: FWTracer: Event 0x{h:08x}",
    'audit: type=1400 audit({t}.{n}:{h}): apparmor="DENIED" operation="open" profile="snap.lxd"',
    "EXT4-fs (nvme{n}n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib{n}: link becomes ready",
    "kvm: emulating exception {n} in guest vcpu {b}",
    "Out of memory: Killed process {n} (python3) total-vm:{h}kB, anon-rss:{t}kB",
    "nvme nvme{n}: I/O {h} QID {b} timeout, completion polled",
    "systemd[1]: Started Session {n} of User slurm.",
    "pcieport 0000:{b:02x}:01.0: AER: Corrected error received: 0000:{b:02x}:00.0",
    "CPU{n}: Core temperature above threshold, cpu clock throttled (total events = {h})",
    "XFS (md{n}): Metadata CRC error detected at xfs_buf_ioend+0x{h:x}/0x{b:x}, block 0x{t:x}",
)
_NVIDIA = (
    "NVRM: Xid (PCI:0000:{b:02x}:00): 79, pid={n}, name=python3, GPU has fallen off the bus.",
    "NVRM: Xid ({b:04x}:03:00): 14, Channel 00000001",
    "NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={n}, name=pt_main_thread, Graphics SM Warp Exception on "
    "(GPC 1, TPC 0, SM 1): Out Of Range Address",
    "NVRM: Xid (PCI:0018:01:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from "
    "0x0 (None) to 0x2 (Node Reboot Required)",
    "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000000 "
    "0x00000000 0x00000000 0x00000000)",
    "NVRM: Xid (PCI:...): 45, pid={n}, name=nvc:[driver], Ch 00000010, caused by previous Xid 149",
    "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error",
    "NVRM: GPU at PCI:0000:{b:02x}:00: GPU-0b11d014-a2a8-aa5e-ab77-7a1e0e2b0a79",
    "NVRM: GPU 0000:{b:02x}:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:{b:02x}:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)


def _lines(rng: random.Random, count: int) -> Iterator[str]:
    clock = 1000.0
    for i in range(count):
        clock += rng.random() / 50
        fields = {"n": rng.randrange(1000), "b": rng.randrange(256), "h": rng.getrandbits(32), "t": i}
        if i % 10_000 == 9_999:
            for shape in _NVIDIA:
                yield f"[{clock:12.6f}] {shape.format(**fields)}\n"
        else:
            yield f"[{clock:12.6f}] {rng.choice(_CHATTER).format(**fields)}\n"


def ensure_log(size_mb: int) -> Path:
    path = OUT / f"kernel-{size_mb}mb.log"
    target = size_mb << 20
    if path.exists() and path.stat().st_size >= target:
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    # A 32 MB body of varied lines, repeated: enough variety for the searches, quick to write.
    body = "".join(_lines(random.Random(42), 400_000)).encode()[: min(target, 32 << 20)]
    body = body[: body.rfind(b"\n") + 1]
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for _ in range(target // len(body)):
            out.write(body)
    tmp.replace(path)
    return path


def time_scan(path: Path) -> tuple[float, Counter[str], ScanStats]:
    stats = ScanStats()
    kinds: Counter[str] = Counter()
    start = time.perf_counter()
    with path.open("rb") as f:
        for event in scan(iter(partial(f.read, CHUNK), b""), stats):
            kinds[f"{event.kind}:{event.code}" if event.code == 79 else str(event.kind)] += 1
    return time.perf_counter() - start, kinds, stats


def time_grep(path: Path) -> tuple[float, int]:
    grep = shutil.which("grep")
    if grep is None:
        raise SystemExit("grep not found")
    env = {**os.environ, "LC_ALL": "C"}
    start = time.perf_counter()
    done = subprocess.run([grep, "-c", "NVRM: Xid", str(path)], capture_output=True, text=True, env=env, check=False)
    return time.perf_counter() - start, int(done.stdout.strip() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (default 1024)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is reported")
    args = parser.parse_args()

    path = ensure_log(args.size_mb)
    mb = path.stat().st_size / 1e6
    with path.open("rb") as f:  # warm the page cache so both sides read from memory
        while f.read(CHUNK):
            pass
    scan_s, kinds, stats = min((time_scan(path) for _ in range(args.repeat)), key=lambda r: r[0])
    grep_s, grep_count = min(time_grep(path) for _ in range(args.repeat))

    print(f"file        {path} ({mb:,.0f} MB, {stats.lines:,} lines)")
    print(f"scan        {scan_s:7.3f} s  {mb / scan_s:8,.0f} MB/s  events {dict(sorted(kinds.items()))}")
    print(f"grep -c     {grep_s:7.3f} s  {mb / grep_s:8,.0f} MB/s  'NVRM: Xid' lines {grep_count:,}")
    print(f"ratio       {scan_s / grep_s:7.2f} x  (scan / grep)")
    print(f"stats       {stats}")


if __name__ == "__main__":
    main()
