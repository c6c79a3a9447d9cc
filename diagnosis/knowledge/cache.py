"""The validated knowledge, once per data version rather than once per process.

Parsing and checking the data files (the XID catalog, the training-log rules with every example run
against every rule, the playbooks) takes most of a second; a one-shot command (`gpu-triage xid 79`, a
Slurm health check, `kubectl logs … | gpu-triage diagnose -`) would pay it every time. So the checked
objects are kept as one snapshot in a `BlobStore` the caller provides (the exporter's is a file in the
user's cache directory, exporter/cache_store.py), under a key that is the digest of everything they are
built from: the data files, the diagnosis code that reads them, and the Python that pickles them. A
snapshot of other files, or of another version of the code, is never found; one that does not unpickle
into what this code expects is rebuilt; a store that fails is a store that is not there.

The store does the I/O; this module only decides what goes in and what is trusted to come out.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_triage.diagnosis.core.data_files import BlobStore, adopt

PARTS = ("catalog", "conditions", "rules", "playbooks")  # the loaders' names (data_files.adopted)


def digest(package: Path | None = None) -> str:
    """What the knowledge is built from, hashed: the data files, the diagnosis code of every sub-package,
    the Python version. (The package's version adds nothing: code that changed is in the hash already.)
    `package`: a diagnosis/ folder to hash instead of this one."""
    h = hashlib.sha256(importlib.util.MAGIC_NUMBER)  # the interpreter's bytecode version: its pickles too
    here = package or Path(__file__).parent.parent
    # The package on disk (a wheel's or a checkout's) read directly; importlib.resources otherwise.
    root: Any = here if (here / "data").is_dir() else resources.files("gpu_triage.diagnosis")
    entries = [(name, e) for name, e in _walk(root, "") if name.endswith(".py")]
    for folder in ("data", "playbooks"):
        entries += [(f"{folder}/{e.name}", e) for e in root.joinpath(folder).iterdir()]
    for name, entry in sorted(entries, key=lambda e: e[0]):
        if entry.is_file():
            data = entry.read_bytes()
            h.update(f"{name}:{len(data)}:".encode())
            h.update(data)
    return h.hexdigest()[:32]


def _walk(folder: Any, prefix: str) -> list[tuple[str, Any]]:
    """Every file of the code's folders (not the data's), named by its path under diagnosis/."""
    found: list[tuple[str, Any]] = []
    for entry in folder.iterdir():
        name = f"{prefix}{entry.name}"
        if entry.is_file():
            found.append((name, entry))
        elif entry.name not in ("data", "playbooks", "__pycache__"):
            found += _walk(entry, f"{name}/")
    return found


def key() -> str:
    return f"knowledge-{digest()}"


def snapshot(name: str) -> bytes:
    """The checked knowledge, as snapshot `name`: each part pickled on its own, so that a command unpickles
    only what it uses. Raises DataError (check_data's) when the data is not sound."""
    from gpu_triage.diagnosis.core.playbooks import load_playbooks
    from gpu_triage.diagnosis.knowledge.check import check_data
    from gpu_triage.diagnosis.training.rules.load import load_rules
    from gpu_triage.diagnosis.xid.catalog_data import load_catalog
    from gpu_triage.diagnosis.xid.conditions import load_conditions

    check_data()
    values = {
        "catalog": load_catalog(),
        "conditions": dict(load_conditions()),
        "rules": load_rules(),
        "playbooks": dict(load_playbooks()),
    }
    parts = {kind: pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) for kind, value in values.items()}
    return pickle.dumps({"key": name, "parts": parts}, protocol=pickle.HIGHEST_PROTOCOL)


def restore(blob: bytes, name: str) -> bool:
    """Make the loaders answer from snapshot `blob` when it is snapshot `name` of every part. A part that
    will not unpickle (data_files.adopted) is parsed from the files instead, with nothing lost."""
    try:
        outer = pickle.loads(blob)
    except Exception:
        return False
    parts = outer.get("parts") if isinstance(outer, Mapping) and outer.get("key") == name else None
    if not isinstance(parts, Mapping) or not all(isinstance(parts.get(kind), bytes) for kind in PARTS):
        return False
    adopt({**{kind: parts[kind] for kind in PARTS}, "checked": True})
    return True


def load(store: BlobStore | None) -> None:
    """The knowledge checked (`check_data`), from `store`'s snapshot of this version when it has one,
    built and put there otherwise. Raises DataError, as check_data does, when the data is not sound."""
    if store is None:  # nothing to keep: check the data and pickle nothing
        from gpu_triage.diagnosis.knowledge.check import check_data

        check_data()
        return
    name = key()
    if (blob := store.get(name)) is not None and restore(blob, name):
        return
    store.put(name, snapshot(name))
