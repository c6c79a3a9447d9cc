"""A process that runs pynvml for a test: one JSON request per stdin line, one JSON answer per stdout line.

pynvml loads libnvidia-ml.so.1 once per process, so each test gets a worker of its own with its
own GPU_TRIAGE_VGPU_STATE. A request is {"call": name, "args": [...], "save": key} (a pynvml
function; {"h": key} in args names a saved object) or {"code": "..."} (statements that set
`result`). The answer is {"ok": value} or {"nvml": code} (an NVMLError), with "elapsed" seconds.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
import traceback
from typing import Any

import pynvml

from tests.vgpu import backend_ops, probe

H: dict[str, Any] = {}  # handles, event sets, samples: whatever a test saved by name


def plain(obj: Any) -> Any:
    """JSON for what pynvml returns: structs as dicts, pointers (handles) as {"ptr": address}."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, bytes):
        return obj.decode(errors="replace")
    if isinstance(obj, list | tuple):
        return [plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, ctypes._Pointer):
        return {"ptr": ctypes.cast(obj, ctypes.c_void_p).value}
    if isinstance(obj, ctypes.Structure | ctypes.Union):
        return {name: plain(getattr(obj, name)) for name, *_ in obj._fields_}
    if isinstance(obj, ctypes.Array):
        return [plain(x) for x in obj]
    if isinstance(obj, ctypes._SimpleCData):
        return plain(obj.value)
    if isinstance(obj, pynvml.nvmlFriendlyObject):
        return plain(vars(obj))
    return repr(obj)


def resolve(arg: Any) -> Any:
    if isinstance(arg, dict) and set(arg) == {"h"}:
        return H[str(arg["h"])]
    if isinstance(arg, list):
        return [resolve(a) for a in arg]
    return arg


def handle(request: dict[str, Any]) -> dict[str, Any]:
    start = time.monotonic()
    try:
        if "code" in request:
            scope: dict[str, Any] = {
                "n": pynvml,
                "H": H,
                "ctypes": ctypes,
                "probe": probe,
                "plain": plain,
                "ops": backend_ops,
            }
            exec(request["code"], scope)
            value = scope.get("result")
        else:
            value = getattr(pynvml, request["call"])(*resolve(request.get("args", [])))
            if request.get("save") is not None:
                H[str(request["save"])] = value
        return {"ok": plain(value), "elapsed": time.monotonic() - start}
    except pynvml.NVMLError as err:
        return {"nvml": err.value, "elapsed": time.monotonic() - start}
    except Exception:
        return {"error": traceback.format_exc(), "elapsed": time.monotonic() - start}


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(handle(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
