"""The two block scans: Hyperscan and the pure-Python literal scan give the same findings, everywhere.

Where the `hyperscan` wheel is missing (the tests then run the Python scan only) the comparison is
skipped; CI installs the wheel on x86_64.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.rules.load import load_rules
from gpu_triage.diagnosis.training.rules.regex import literal_set
from gpu_triage.diagnosis.training.scan.block_scan import HyperscanFinder, LiteralFinder, engine_name, finder_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRAINING = FIXTURES / "training"
JOB_DIRS = ("scenarios", "corpus")  # a folder under one of these is one job: its files go to one call
RULES = load_rules()
PATTERNS = [s.scan for s in RULES.signatures()]
LITERALS = [lit for s in RULES.signatures() for lit in s.literals]
needs_hyperscan = pytest.mark.skipif(engine_name() != "hyperscan", reason="the hyperscan wheel is not installed")


def cases() -> list[list[Path]]:
    """Every fixture input of the project: training logs, jobs of several files, kernel logs."""
    out: list[list[Path]] = []
    for path in sorted(TRAINING.rglob("*")):
        if path.is_dir() and path.parent.name in JOB_DIRS:
            out.append(sorted(p for p in path.rglob("*") if p.is_file()))
        elif path.is_file() and path.suffix == ".log" and path.parent.parent.name not in JOB_DIRS:
            out.append([path])
    out += [[p] for p in sorted((FIXTURES / "kmsg").glob("*.log"))]
    return out


CASES = cases()


def _run(paths: list[Path], engine: str, parallel: bool = False) -> dict[str, Any]:
    doc = diagnose([(p.name, [p.read_bytes()]) for p in paths], engine=engine, parallel=parallel).to_json()
    return {k: doc[k] for k in ("root_cause", "findings", "events")} | {"lines": doc["summary"]["lines_read"]}


def test_the_fixture_walk_sees_every_kind_of_input() -> None:
    names = {p.parent.name for case in CASES for p in case}
    assert {"classes", "oom_rank3", "training", "kmsg"} <= names
    assert len(CASES) >= 40


@needs_hyperscan
@pytest.mark.parametrize("paths", CASES, ids=[str(c[0].relative_to(FIXTURES)) for c in CASES])
def test_hyperscan_and_the_python_scan_give_the_same_findings(paths: list[Path]) -> None:
    python = _run(paths, "python")
    assert _run(paths, "hyperscan") == python
    assert _run(paths, "hyperscan", parallel=True) == python  # the scan in its own thread


def _example_lines() -> list[str]:
    return [ex.line for r in RULES.rules for ex in r.examples] + [ex.line for c in RULES.context for ex in c.examples]


_LINES = _example_lines() + list(RULES.near_misses[:40])
_NOISE = [
    "",
    "step 1 | loss 0.5",
    "node1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "\x1b[31mred\x1b[0m",
]


@needs_hyperscan
@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_LINES + _NOISE), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_random_mixtures_give_the_same_findings(lines: list[str], rng: random.Random) -> None:
    data = "\n".join(lines).encode()
    cut = rng.randrange(len(data) + 1)
    chunks = [data[:cut], data[cut:]]
    one = diagnose([(None, chunks)], engine="hyperscan").to_json()
    two = diagnose([(None, chunks)], engine="python").to_json()
    assert (one["findings"], one["events"]) == (two["findings"], two["events"])


@needs_hyperscan
def test_hyperscan_flags_whole_lines_and_nothing_else() -> None:
    data = b"healthy\n[rank3]: RuntimeError: CUDA error: out of memory\nfine\nNVRM: Xid (PCI:0000:3b:00): 79\n"
    finder = finder_for(PATTERNS, LITERALS, "hyperscan")
    assert isinstance(finder, HyperscanFinder)
    spans = finder(data, 0, len(data))
    assert [data[a:b] for a, b in sorted(spans.items())] == [
        b"[rank3]: RuntimeError: CUDA error: out of memory",
        b"NVRM: Xid (PCI:0000:3b:00): 79",
    ]
    middle = data.index(b"fine")
    assert finder(data, middle, len(data)) == {middle + 5: len(data) - 1}


def test_the_python_scan_flags_every_example_line() -> None:
    finder = finder_for(PATTERNS, LITERALS, "python")
    assert isinstance(finder, LiteralFinder)
    data = "\n".join(_example_lines()).encode() + b"\n"
    assert len(finder(data, 0, len(data))) == len(_example_lines())


@needs_hyperscan
def test_the_python_scan_flags_at_least_what_hyperscan_does() -> None:
    """The literal scan is the wide net (the regexes then decide); a line Hyperscan flags that it missed
    would be a finding the pure-Python fallback loses. Over every rule's examples, near misses and noise."""
    lines = _LINES + list(RULES.near_misses) + _NOISE
    data = "\n".join(lines).encode() + b"\n"
    hyperscan = finder_for(PATTERNS, LITERALS, "hyperscan")(data, 0, len(data))
    python = finder_for(PATTERNS, LITERALS, "python")(data, 0, len(data))
    assert len(hyperscan) >= len(_example_lines())  # a comparison with something in it
    missed = {data[a:b] for a, b in hyperscan.items() if python.get(a) != b}
    assert missed == set()


def test_the_engine_can_be_forced() -> None:
    assert engine_name("python") == "python"
    assert diagnose([(None, [b"x\n"])], engine="python").engine == "python"


@needs_hyperscan
def test_the_environment_does_not_choose_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU_TRIAGE_SCAN is read where the command line and the daemon call `diagnose`, not inside it."""
    monkeypatch.setenv("GPU_TRIAGE_SCAN", "python")
    assert engine_name() == "hyperscan"
    assert diagnose([(None, [b"x\n"])]).engine == "hyperscan"


@needs_hyperscan
@pytest.mark.parametrize("literal", literal_set(LITERALS))
def test_both_engines_skip_the_same_unreadable_lines(literal: str) -> None:
    """A line too long or too binary to read counts as skipped when it holds a literal some signature
    needs, whichever engine looked, and however the input was cut."""
    lines = [b"x" * 70_000 + b" " + literal.encode(), b"-\x00 " + literal.encode(), b"y" * 70_000, b"z\x00"]
    data = b"\n".join(lines) + b"\n" + lines[0]  # the last one unterminated
    for chunks in ([data], [data[i : i + 4096] for i in range(0, len(data), 4096)]):
        skipped = {
            engine: diagnose([(None, chunks)], engine=engine).lines_skipped for engine in ("hyperscan", "python")
        }
        assert skipped == {"hyperscan": 3, "python": 3}


@needs_hyperscan
@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"Alpha[^\n]{0,20}Omega", "Alpha" + "日本" * 10 + "Omega"),  # 20 characters, 60 bytes
        (r"peer (?P<peer>\S{1,8}) closed", "peer ноды-7 closed"),
        (r"x(?:a[^,]{0,3}){1,3}y", "xaééaébaéy"),
        (r"^Signal: (?P<signal>Segmentation fault) \(11\)$", "[node-ü:12] Signal: Segmentation fault (11)"),
        (r"rank (?P<rank>\d{1,3}) [^\n]{1,10}?failed", "rank 7 \ufffd\ufffd\ufffd\ufffd\ufffd failed"),
    ],
)
def test_a_bounded_scan_form_flags_what_the_regex_matches_in_any_characters(pattern: str, text: str) -> None:
    """The scan form keeps the regex's bounds in bytes, widened by what a character may take (four bytes
    of UTF-8), so a line of non-ASCII text the regex matches is still flagged."""
    import hyperscan as hs

    from gpu_triage.diagnosis.training.input.log_lines import normalise
    from gpu_triage.diagnosis.training.rules.regex import scan_pattern

    assert re.search(pattern, normalise(text).text, re.ASCII)
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(
        expressions=[f"(?:{scan_pattern(pattern)})[^\\n]*$".encode()], ids=[0], elements=1, flags=[hs.HS_FLAG_MULTILINE]
    )
    found: list[int] = []
    db.scan(text.encode(), match_event_handler=lambda *a: found.append(a[0]))
    assert found == [0]


@needs_hyperscan
def test_the_parallel_scan_leaves_no_thread_behind_even_when_the_input_fails() -> None:
    import threading

    def failing() -> Iterator[bytes]:
        yield b"[rank3]: RuntimeError: CUDA error: out of memory\n" * 50_000  # past one block: the thread starts
        raise OSError("the disk went away")

    report = diagnose([(None, [b"[rank3]: RuntimeError: CUDA error: out of memory\n" * 50_000])], parallel=True)
    assert [f.class_id for f in report.findings] == ["cuda_oom"]
    with pytest.raises(OSError, match="went away"):
        diagnose([(None, failing())], parallel=True)
    assert not [t for t in threading.enumerate() if t.name == "gpu-triage-scan"]
