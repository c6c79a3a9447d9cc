"""`gpu-triage release`: ask the daemon on this node to let go of NVML, so that `nvidia-smi -r` can reset a GPU.

The request goes through the daemon's state directory (exporter/backends/nvml/release.py), so only who
may write there, root or the daemon's own user, can blind the daemon, and never from the network. The
hold is bounded; the daemon takes NVML back by itself when it ends, or at once on `--resume`.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpu_triage.exporter.backends.nvml.release import ANSWER, MAX_HOLD_SECONDS, REQUEST, write_json

MIN_HOLD_SECONDS = 10.0
_POLL = 0.2


def release(state_dir: Path, seconds: float, resume: bool, wait: float) -> int:
    request, answer = state_dir / REQUEST, state_dir / ANSWER
    if resume:
        request.unlink(missing_ok=True)
        if _until(lambda: not answer.exists(), wait):
            print("NVML is taken back: the daemon reads the GPUs again.")
            return 0
        print(f"the daemon has not said it took NVML back within {wait:g}s (is it running?)", file=sys.stderr)
        return 1
    if not MIN_HOLD_SECONDS <= seconds <= MAX_HOLD_SECONDS:
        print(f"--seconds: between {MIN_HOLD_SECONDS:g} and {MAX_HOLD_SECONDS:g}, not {seconds:g}", file=sys.stderr)
        return 2
    now = time.time()
    try:
        write_json(request, {"until": now + seconds, "requested_at": now, "by": getpass.getuser()})
    except OSError as e:
        print(f"cannot write {request}: {e} (run as root or as the daemon's user)", file=sys.stderr)
        return 2
    if not _until(lambda: _answered(answer, now), wait):
        print(
            f"the daemon did not let go of NVML within {wait:g}s: is it running with --backend nvml and "
            f"--state.dir {state_dir}? (With --backend dcgm, nv-hostengine holds the GPUs: stop it instead.)",
            file=sys.stderr,
        )
        return 1
    until = time.strftime("%H:%M:%S", time.localtime(now + seconds))
    print(
        f"NVML is let go of until {until}; gpu-triage reports itself down meanwhile.\n"
        "Reset the GPU now, with no job on it:  nvidia-smi -r -i <GPU index or bus id>\n"
        "(nvidia-smi --query-compute-apps=pid,name --format=csv and fuser -v /dev/nvidia* show what else holds it.)\n"
        "Then take NVML back at once:  gpu-triage release --resume"
    )
    return 0


def _answered(answer: Path, since: float) -> bool:
    try:
        return float(json.loads(answer.read_text())["released_at"]) >= since - 1.0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _until(done: Callable[[], bool], wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
