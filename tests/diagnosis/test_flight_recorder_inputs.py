"""Dumps nobody should trust: pickles that would run code or eat memory, truncated, huge, of an unknown version."""

from __future__ import annotations

import json
import pickle
import pickletools
import struct
from pathlib import Path
from typing import Any

import pytest

from gpu_triage.diagnosis.training.diagnose import diagnose
from gpu_triage.diagnosis.training.hang.flight_recorder import MAX_DUMP_BYTES, DumpError, dump_kind, parse, rank_of
from gpu_triage.diagnosis.training.hang.fr_unpickle import UnsafePickleError, load_unscanned, loads, scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
REAL = FIXTURES / "never_joined" / "pickle" / "nccl_trace_rank_0"


class _Plant:
    """Pickles to a call of exec that writes a marker file: what a hostile dump would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"with open({str(self.marker)!r}, 'w') as f: f.write('ran')",))


def _hostile(marker: Path, protocol: int) -> bytes:
    return pickle.dumps({"version": "2.10", "entries": [_Plant(marker)]}, protocol=protocol)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_pickle_that_would_run_code_runs_nothing(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "marker"
    data = _hostile(marker, protocol)
    with pytest.raises(UnsafePickleError):
        loads(data)
    with pytest.raises(UnsafePickleError, match=r"builtins?__\.exec|builtins\.exec"):
        load_unscanned(data)  # the second layer alone refuses the import as well
    assert not marker.exists()
    # As an input of `diagnose`, named like a dump and told by its content: skipped with the reason.
    report = diagnose([("nccl_trace_rank_0", [data])]).to_json()
    assert not marker.exists()
    if protocol >= 2:
        assert any("nccl_trace_rank_0" in s for s in report["hang"]["skipped"])


def test_the_stdlib_would_have_run_it(tmp_path: Path) -> None:
    """The hostile pickle is real: plain pickle.loads writes the marker (so the test above proves something)."""
    marker = tmp_path / "marker"
    pickle.loads(_hostile(marker, 2))
    assert marker.read_text() == "ran"


def test_a_memo_index_that_asks_for_gigabytes_is_refused_before_unpickling() -> None:
    # PROTO 2, NONE, LONG_BINPUT 0x3fffffff, STOP: CPython's unpickler would size its memo for 2**31 slots.
    bomb = b"\x80\x02N" + b"r" + struct.pack("<I", 0x3FFFFFFF) + b"."
    with pytest.raises(UnsafePickleError, match="memo index"):
        scan(bomb)


def test_every_instruction_of_a_real_dump_is_allowed() -> None:
    data = REAL.read_bytes()
    scan(data)
    names = {op.name for op, _, _ in pickletools.genops(data)}
    assert not names & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"}
    assert loads(data) == pickle.loads(data)


def test_a_truncated_dump_is_an_error_not_a_crash() -> None:
    data = REAL.read_bytes()
    for cut in (3, len(data) // 2, len(data) - 1):
        with pytest.raises(DumpError, match="nccl_trace_rank_0"):
            parse("nccl_trace_rank_0", data[:cut], "pickle")
    text = (FIXTURES / "never_joined" / "json" / "nccl_trace_rank_0.json").read_bytes()
    with pytest.raises(DumpError, match="not a readable JSON dump"):
        parse("nccl_trace_rank_0.json", text[: len(text) // 2], "json")


def test_a_dump_over_the_limit_is_skipped_without_reading_it_all() -> None:
    head = REAL.read_bytes()[:64]
    read = 0

    def huge() -> Any:  # a 1 GiB dump, streamed: never built in memory
        nonlocal read
        yield head
        for _ in range(1024):
            read += 1 << 20
            yield b"\0" * (1 << 20)

    report = diagnose([("nccl_trace_rank_5", huge())]).to_json()
    assert report["hang"]["skipped"] == [
        f"nccl_trace_rank_5: a dump over the {MAX_DUMP_BYTES >> 20} MiB limit, skipped"
    ]
    assert read <= MAX_DUMP_BYTES + (1 << 20)


def _with_version(version: str) -> bytes:
    raw = loads(REAL.read_bytes())
    raw["version"] = version
    return pickle.dumps(raw, protocol=2)


def test_an_unknown_major_version_is_refused_with_a_message() -> None:
    with pytest.raises(DumpError, match=r"version 3\.0 is not one this reader knows"):
        parse("nccl_trace_rank_0", _with_version("3.0"), "pickle")


def test_a_newer_minor_version_is_read_and_says_so() -> None:
    dump = parse("nccl_trace_rank_0", _with_version("2.99"), "pickle")
    assert dump.groups["0"].ops and any("2.99" in n for n in dump.notes)


def test_malformed_entries_are_counted_and_skipped() -> None:
    raw = loads(REAL.read_bytes())
    raw["entries"][1] = {"record_id": "x"}
    raw["entries"][2] = [1, 2, 3]
    dump = parse("nccl_trace_rank_0", pickle.dumps(raw, protocol=2), "pickle")
    assert dump.skipped == 2
    assert len(dump.groups["0"].ops) == len(raw["entries"]) - 2


def test_older_dump_without_the_newer_fields_is_read() -> None:
    """Dump versions before 2.4 have no dtypes, thread or is_p2p fields (FlightRecorder.hpp's history)."""
    raw = loads(REAL.read_bytes())
    raw["version"] = "2.2"
    for e in raw["entries"]:
        for key in ("input_dtypes", "output_dtypes", "thread_id", "thread_name", "is_p2p", "retired", "timeout_ms"):
            e.pop(key, None)
    dump = parse("nccl_trace_rank_0", pickle.dumps(raw, protocol=2), "pickle")
    assert [o.seq for o in dump.groups["0"].ops] == [e["collective_seq_id"] for e in raw["entries"]]


def test_content_not_name_says_what_an_input_is() -> None:
    assert dump_kind(REAL.read_bytes()[:8192]) == "pickle"
    assert dump_kind((FIXTURES / "healthy" / "json" / "nccl_trace_rank_1.json").read_bytes()[:8192]) == "json"
    assert dump_kind(b'{"level": "info", "msg": "step 5"}') is None
    assert dump_kind(b"[rank0]: Traceback (most recent call last):") is None
    # A dump renamed to look like a log is still read as a dump, a log named like a dump still as a log.
    report = diagnose([("rank2.log", [REAL.read_bytes()])]).to_json()
    assert report["hang"]["skipped"] and "cannot tell which rank" in report["hang"]["skipped"][0]
    log = diagnose([("nccl_trace_rank_0", [b"[rank0]: hello\n"])]).to_json()
    assert "hang" not in log and log["summary"]["lines_read"] == 1


@pytest.mark.parametrize(
    ("name", "rank"),
    [("nccl_trace_rank_3", 3), ("/tmp/fr/nccl_trace_rank_12.json", 12), ("dump_rank7.pkl", 7), ("trace", None)],
)
def test_rank_from_the_file_name(name: str, rank: int | None) -> None:
    assert rank_of(name) == rank


def test_json_dump_has_no_frames_and_zero_times() -> None:
    raw = json.loads((FIXTURES / "never_joined" / "json" / "nccl_trace_rank_0.json").read_bytes())
    assert all("frames" not in e for e in raw["entries"])
    dump = parse("nccl_trace_rank_0.json", json.dumps(raw).encode(), "json")
    assert all(not op.frames for op in dump.groups["0"].ops)
