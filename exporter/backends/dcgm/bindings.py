"""DCGM's Python bindings, found where DCGM installs them and imported at run time.

The bindings are not on PyPI: they ship with DCGM, under
/usr/share/datacenter-gpu-manager-4/bindings/python3 (DCGM 4) or /usr/local/dcgm/bindings/python3
(DCGM 3), and they must match the installed libdcgm. So gpu-triage never carries a copy: it puts the
installed directory on `sys.path` (its modules import each other by their bare names) and imports
`dcgm_structs`, `dcgm_agent` and `dcgm_fields` from there. Only functions present in both DCGM 3
and 4 are used, and fields by numeric id (fields.py).
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_triage.exporter.backends.base import BackendError

INSTALLED = (
    Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"),
    Path("/usr/local/dcgm/bindings/python3"),
)
_lock = threading.Lock()
_loaded: dict[str, Bindings] = {}  # the one set of bindings this process imported


@dataclass(frozen=True)
class Bindings:
    path: Path
    structs: ModuleType  # dcgm_structs: return codes, DCGMError, structures, library loading
    agent: ModuleType  # dcgm_agent: the C API, one function each

    def code(self, err: BaseException) -> int | None:
        """The DCGM_ST_* code of a DCGMError, None for any other exception."""
        if isinstance(err, self.structs.DCGMError):
            return int(getattr(err, "value", 0))
        return None

    def describe(self, err: BaseException) -> str:
        """A DCGMError in DCGM's words, with its code."""
        try:
            text = str(err)
        except Exception:  # str() of a DCGMError asks the library, which may be gone
            text = type(err).__name__
        return f"{text} ({self.code(err)})" if self.code(err) is not None else text

    def connect_params(self, *, timeout_ms: int, unix_socket: bool) -> Any:
        params = self.structs.c_dcgmConnectV2Params_v2()
        params.persistAfterDisconnect = 0  # the host engine drops our groups and watches when we go
        params.timeoutMs = timeout_ms
        params.addressIsUnixSocket = int(unix_socket)
        return params


def find(directory: Path | None = None) -> Path | None:
    """The bindings directory: `directory` if given, else the first installed one."""
    for candidate in (directory,) if directory is not None else INSTALLED:
        if candidate is not None and (candidate / "dcgm_agent.py").is_file():
            return candidate
    return None


def load(directory: Path | None = None) -> Bindings:
    """Import the bindings (once per process: they are modules with bare names). BackendError if absent."""
    path = find(directory)
    if path is None:
        where = directory if directory is not None else " or ".join(map(str, INSTALLED))
        raise BackendError(
            f"DCGM's Python bindings are not installed (no dcgm_agent.py in {where}); they come with DCGM "
            "(datacenter-gpu-manager-4), or point --dcgm.bindings-dir at them"
        )
    with _lock:
        if (done := _loaded.get("bindings")) is not None:
            if done.path != path:
                raise BackendError(f"DCGM bindings are already loaded from {done.path}, not {path}")
            return done
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
        try:
            structs = importlib.import_module("dcgm_structs")
            agent = importlib.import_module("dcgm_agent")
        except Exception as e:  # a broken install: say so, do not crash the daemon
            raise BackendError(f"cannot import DCGM's bindings from {path}: {e!r}") from e
        _loaded["bindings"] = done = Bindings(path, structs, agent)
        return done
