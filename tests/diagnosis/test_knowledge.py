"""The knowledge cache (diagnosis/knowledge/cache.py): built once per data version, never trusted otherwise.

Each case runs in a child process: the cache's point is what a fresh process does with it, and a
process that has adopted a snapshot keeps it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

LOAD = """
import sys
from pathlib import Path
from gpu_triage.diagnosis.knowledge import cache as knowledge
from gpu_triage.exporter.cache_store import FileStore
store = FileStore(Path(sys.argv[1]))
knowledge.load(store)
from gpu_triage.diagnosis.xid.catalog_data import load_catalog
from gpu_triage.diagnosis.training.rules.load import load_rules
assert load_catalog().get(79) is not None and load_rules().rule("cuda_oom")
print("parsed" if "yaml" in sys.modules else "cached")
"""


def _run(script: str, cache: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(cache)],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_first_process_builds_and_the_next_ones_read_the_snapshot(tmp_path: Path) -> None:
    assert _run(LOAD, tmp_path) == "parsed"
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["knowledge"]
    assert _run(LOAD, tmp_path) == "cached"


def test_a_snapshot_of_another_version_is_never_found(tmp_path: Path) -> None:
    _run(LOAD, tmp_path)
    [snapshot] = tmp_path.iterdir()
    snapshot.rename(tmp_path / "knowledge-00000000000000000000000000000000.bin")
    assert _run(LOAD, tmp_path) == "parsed"  # the version now on disk is this code's: rebuilt
    assert sorted(p.name for p in tmp_path.iterdir()) == [snapshot.name]  # and the other one is gone


def test_a_snapshot_that_does_not_unpickle_is_rebuilt(tmp_path: Path) -> None:
    """Well sealed (the store's digest is right) but not a snapshot: rebuilt and replaced."""
    _run(LOAD, tmp_path)
    [snapshot] = tmp_path.iterdir()
    forge = f"""
    import sys
    from pathlib import Path
    from gpu_triage.exporter.cache_store import FileStore
    FileStore(Path(sys.argv[1])).put({snapshot.stem!r}, b"not a pickle")
    """
    _run(forge, tmp_path)
    assert _run(LOAD, tmp_path) == "parsed"
    assert _run(LOAD, tmp_path) == "cached"


def test_a_part_that_no_longer_unpickles_is_parsed_from_the_files(tmp_path: Path) -> None:
    """A snapshot whose parts are not what this code pickles (its key is right, its bytes are not): each
    loader that finds its part unusable parses its files, and answers the same."""
    _run(LOAD, tmp_path)
    [snapshot] = tmp_path.iterdir()
    forge = f"""
    import pickle, sys
    from pathlib import Path
    from gpu_triage.exporter.cache_store import FileStore
    parts = dict.fromkeys(("catalog", "conditions", "rules", "playbooks"), b"garbage")
    FileStore(Path(sys.argv[1])).put({snapshot.stem!r}, pickle.dumps({{"key": {snapshot.stem!r}, "parts": parts}}))
    """
    _run(forge, tmp_path)
    assert _run(LOAD, tmp_path) == "parsed"


def test_the_compiled_scan_is_kept_and_a_bad_copy_compiled_again(tmp_path: Path) -> None:
    script = """
    import sys
    from pathlib import Path
    from gpu_triage.diagnosis.training.scan import block_scan
    from gpu_triage.diagnosis.training.rules.load import load_rules
    from gpu_triage.exporter.cache_store import FileStore
    store = FileStore(Path(sys.argv[1]))
    patterns = tuple(s.scan for s in load_rules().signatures())
    db = block_scan._database(patterns, store)
    hits = []
    db.scan(b"RuntimeError: CUDA error: out of memory\\n", match_event_handler=lambda *a: hits.append(a[0]))
    assert hits, "the database finds what it must"
    print(sorted(p.name.split("-")[0] for p in Path(sys.argv[1]).iterdir()))
    """
    if _run("import sys\ntry:\n    import hyperscan\nexcept ImportError:\n    print('no')\n", tmp_path) == "no":
        return  # no Hyperscan wheel here: nothing to keep
    assert _run(script, tmp_path) == "['hyperscan']"
    [db] = tmp_path.iterdir()
    forge = f"""
    import sys
    from pathlib import Path
    from gpu_triage.exporter.cache_store import FileStore
    FileStore(Path(sys.argv[1])).put({db.stem!r}, b"not a database")
    """
    _run(forge, tmp_path)
    assert _run(script, tmp_path) == "['hyperscan']"  # compiled again, and the copy replaced
    assert db.read_bytes()[-14:] != b"not a database"


def test_the_digest_covers_the_code_of_every_sub_package(tmp_path: Path) -> None:
    """A change to any diagnosis module, however deep in the sub-packages, or to a data file, is a new
    version: a cache that other code built is never trusted. Hashed from a copy that can be changed."""
    from gpu_triage.diagnosis.knowledge import cache

    copy = tmp_path / "diagnosis"
    for path in (REPO / "diagnosis").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            target = copy / path.relative_to(REPO / "diagnosis")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    seen = {cache.digest(copy)}
    assert seen == {cache.digest()}  # the copy is the package
    for changed in ("training/findings/kernel.py", "xid/health.py", "__init__.py", "data/xid_policy.yaml"):
        path = copy / changed
        path.write_bytes(path.read_bytes() + b"\n")
        seen.add(cache.digest(copy))
    assert len(seen) == 5
