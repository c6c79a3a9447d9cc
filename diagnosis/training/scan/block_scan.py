"""Which lines of a block deserve a closer look: every signature over every line, at about grep's speed.

Two finders (see `literal_search.Finder`) flag candidate lines; Python then matches each candidate against
the rules (rules/model.RuleSet.match) and decides. Both flag every line a signature could match,
so both give the same findings; they differ in speed only:

* `HyperscanFinder` compiles the scan form of every signature (rules/regex.scan_pattern) into one
  Hyperscan database and runs it over whole blocks: the PyPI `hyperscan` wheel (Vectorscan inside),
  where one exists for the platform;
* `LiteralFinder` looks for the literal text each signature requires (rules/regex.required_literals)
  with plain byte searches. It flags more lines (a literal without the rest of the signature), which
  Python then turns down, and it is slower on big inputs.

Kernel-log lines (kernel_log.TRIGGERS) are candidates for both, for the kernel-log parser.

`finder_for` chooses: Hyperscan when it imports, unless the caller asks for `python` (tests and the
bench do, to compare the two; the command line and the daemon pass what GPU_TRIAGE_SCAN says, see
exporter/log_input.py). A line too long or binary to classify is counted as skipped when the literal
search would flag it, whichever finder ran (`skip_test_for`), so the counts agree too.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from gpu_triage.diagnosis.core.data_files import BlobStore
from gpu_triage.diagnosis.core.literal_search import Finder, trigger_lines
from gpu_triage.diagnosis.training.rules.regex import literal_needles
from gpu_triage.diagnosis.xid.kernel_log import TRIGGERS as KERNEL_TRIGGERS

_KERNEL_PATTERNS = tuple(re.escape(t.decode()) for t in KERNEL_TRIGGERS)


def _hyperscan() -> Any | None:
    try:
        import hyperscan
    except ImportError:  # no wheel for this platform, or not installed
        return None
    return hyperscan


class HyperscanFinder:
    """Flags the lines in which any signature's scan form matches. One instance per reader: the
    Hyperscan scratch space it holds must not be shared between threads."""

    def __init__(self, database: Any, parallel: bool = False) -> None:
        hs = _hyperscan()
        assert hs is not None
        self._db = database
        self._scratch = hs.Scratch(database)
        self._matches: list[tuple[int, int]] = []
        self.hits: dict[int, frozenset[int]] = {}  # the last call's: line start -> which patterns matched
        if parallel:  # the scanner searches in `_worker` while it counts the block's newlines itself
            self.submit = self._submit
        self._worker: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[tuple[bytes, int, int] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[dict[int, int] | BaseException] = queue.SimpleQueue()

    def _submit(
        self, data: bytes, start: int, end: int
    ) -> Callable[[], tuple[dict[int, int], dict[int, frozenset[int]]]]:
        """Search in this finder's own thread while the caller goes on (Hyperscan scans without Python's
        lock); the answer, spans and hits, when the returned function is called."""
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="gpu-triage-scan", daemon=True)
            self._worker.start()
        self._jobs.put((data, start, end))

        def answer() -> tuple[dict[int, int], dict[int, frozenset[int]]]:
            result = self._done.get()
            if isinstance(result, BaseException):
                raise result
            return result, self.hits

        return answer

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._done.put(self(*job))
            except BaseException as e:  # handed to the caller, who raises it
                self._done.put(e)

    def close(self) -> None:
        """Stop the thread `submit` started, if any."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join()
            self._worker = None

    def _on_match(self, pattern: int, _start: int, end: int, _flags: int, _context: object) -> None:
        self._matches.append((end, pattern))

    def __call__(self, data: bytes, start: int, end: int) -> dict[int, int]:
        block = data if (start, end) == (0, len(data)) else memoryview(data)[start:end]  # no copy
        matches = self._matches
        matches.clear()
        self._db.scan(block, match_event_handler=self._on_match, scratch=self._scratch)
        spans: dict[int, int] = {}
        hits: dict[int, set[int]] = {}
        # Each pattern ends at the end of its line (`[^\n]*$`), so an end offset names one line.
        for end_in_block, pattern in matches:
            line_end = start + end_in_block
            line_start = data.rfind(b"\n", start, line_end) + 1 or start
            spans[line_start] = line_end
            hits.setdefault(line_start, set()).add(pattern)
        self.hits = {at: frozenset(found) for at, found in hits.items()}
        return spans


class LiteralFinder:
    """Flags the lines holding any literal a signature requires (a superset of the Hyperscan lines)."""

    def __init__(self, literals: Sequence[str], needles: Sequence[str] | None = None) -> None:
        found = needles if needles is not None else literal_needles(literals)
        self._needles = tuple(lit.encode() for lit in found)

    def __call__(self, data: bytes, start: int, end: int) -> dict[int, int]:
        return trigger_lines(data, start, end, self._needles)


@cache
def _literal_finder(literals: tuple[str, ...], needles: tuple[str, ...] | None) -> LiteralFinder:
    return LiteralFinder(literals, needles)


def skip_test_for(literals: Sequence[str], needles: Sequence[str] | None = None) -> Finder:
    """The finder that decides whether an unreadable line counts as skipped: the literal search, for
    either engine. The same object `finder_for` gives for "python" (a scanner then needs no second look).
    `needles`: `literal_needles(literals)` when the caller has it already."""
    return _literal_finder(tuple(literals), tuple(needles) if needles is not None else None)


_DATABASES: dict[tuple[str, ...], Any] = {}  # compiled once per process, and per data version in the store


def _database(patterns: tuple[str, ...], store: BlobStore | None = None) -> Any:
    """The Hyperscan database of `patterns`: this process's, else the store's serialized copy of the same
    patterns (built by the same Hyperscan), else compiled (and serialized into the store)."""
    known = _DATABASES.get(patterns)
    if known is not None:
        return known
    hs = _hyperscan()
    assert hs is not None
    expressions = [f"(?:{p})[^\\n]*$".encode() for p in (*patterns, *_KERNEL_PATTERNS)]
    version = getattr(hs, "__version__", "?")
    key = "hyperscan-" + hashlib.sha256(b"\0".join([version.encode(), *expressions])).hexdigest()[:32]
    db = None
    if store is not None and (blob := store.get(key)) is not None:
        try:
            db = hs.loadb(blob, hs.HS_MODE_BLOCK)
        except Exception:  # another platform's database, or not one: compile it again
            db = None
    if db is None:
        db = hs.Database(mode=hs.HS_MODE_BLOCK)
        db.compile(
            expressions=expressions,
            ids=list(range(len(expressions))),
            elements=len(expressions),
            flags=[hs.HS_FLAG_MULTILINE] * len(expressions),
        )
        if store is not None:
            store.put(key, bytes(hs.dumpb(db)))
    _DATABASES[patterns] = db
    return db


def _choice(prefer: str | None) -> str:
    return (prefer or "").strip().lower()


def engine_name(prefer: str | None = None) -> str:
    """ "hyperscan" or "python": what `finder_for` will use given the preference (None or "": the best)."""
    choice = _choice(prefer)
    if choice == "python":
        return "python"
    if _hyperscan() is None:
        if choice == "hyperscan":
            raise RuntimeError("the hyperscan scan was asked for, but the hyperscan module cannot be imported")
        return "python"
    return "hyperscan"


def finder_for(
    patterns: Sequence[str],
    literals: Sequence[str],
    prefer: str | None = None,
    store: BlobStore | None = None,
    needles: Sequence[str] | None = None,
    parallel: bool = False,
) -> Finder:
    """A fresh finder for one reader: Hyperscan over `patterns`, or literal search for `literals`.

    Should Hyperscan refuse to run here (a CPU without the instructions it needs), the literal
    search gives the same findings, unless Hyperscan was asked for by name. `store` keeps the compiled
    database between processes (diagnosis/knowledge/cache.py). `parallel`: Hyperscan searches each block in a
    thread of its own while the line scanner counts its newlines (the two cost about the same), for a
    caller that may use two CPUs."""
    if engine_name(prefer) == "hyperscan":
        try:
            return HyperscanFinder(_database(tuple(patterns), store), parallel)
        except Exception:
            if _choice(prefer) == "hyperscan":
                raise
    return skip_test_for(literals, needles)
