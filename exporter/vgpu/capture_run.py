"""`gpu-triage vgpu --capture FILE`: the virtual GPU set from a real node's `nvidia-smi -q` output.

The GPUs of the capture (capture.py reads it, capture_image.py writes each in NVML's units) go into the
state file once; the file stays for readers after the command exits, and an NVML client started with
GPU_TRIAGE_VGPU_STATE pointing at it sees that node as it was when the capture was taken.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_triage.exporter.vgpu import capture_image
from gpu_triage.exporter.vgpu import state as vs
from gpu_triage.exporter.vgpu.capture import MAX_BYTES, CaptureError, parse_capture


def load(path: Path) -> capture_image.Node:
    """The capture's node, or CaptureError (OSError when the file cannot be read)."""
    with path.open("rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise CaptureError(f"larger than {MAX_BYTES // 2**20} MiB: not one node's nvidia-smi -q")
    node = capture_image.node(parse_capture(raw.decode(errors="replace")))
    if len(node.gpus) > vs.MAX_GPUS:
        raise CaptureError(f"{len(node.gpus)} GPUs; the vGPU state file holds at most {vs.MAX_GPUS}")
    return node


def run_capture(path: Path, state: Path) -> int:
    try:
        node = load(path)
        driver = node.driver_version or vs.DRIVER_VERSION
        cuda = node.cuda_driver_version or vs.CUDA_DRIVER_VERSION
        with vs.StateWriter(
            state, node.gpus, driver_version=driver, nvml_version=f"{cuda // 1000}.{driver}", cuda_driver_version=cuda
        ):
            pass
    except (CaptureError, OSError, ValueError, RuntimeError) as e:
        print(f"gpu-triage vgpu: {path}: {e}", file=sys.stderr)
        return 2
    names = sorted({str(g.name) for g in node.gpus})
    print(f"{state}: {len(node.gpus)} GPU(s) from {path} ({', '.join(names)}; driver {node.driver_version or '?'})")
    return 0
