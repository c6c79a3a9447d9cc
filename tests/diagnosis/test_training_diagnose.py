"""`diagnose` end to end: fixtures of every class, multi-rank scenarios, healthy runs and bad input."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_triage.diagnosis.core.actions import Action, Severity
from gpu_triage.diagnosis.training.diagnose import Report, diagnose

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "training"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((FIXTURES / "expected.yaml").read_text())
HEALTHY = sorted(FIXTURES.glob("healthy_*.log"))


def _inputs(name: str) -> list[Path]:
    path = FIXTURES / name
    return sorted(path.iterdir()) if path.is_dir() else [path]


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _diagnose_files(paths: list[Path], chunk: int = 1 << 16) -> Report:
    return diagnose([(p.name, _chunks(p.read_bytes(), chunk)) for p in paths])


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


def test_every_class_has_a_fixture() -> None:
    """A class that can end a job is some fixture's root cause; a performance condition is in some
    fixture's performance section (it is never a root cause)."""
    roots = {e["root"] for e in EXPECTED.values()}
    slow = {c for e in EXPECTED.values() for c in e.get("performance", [])}
    from gpu_triage.diagnosis.training.rules.load import load_rules

    rules = load_rules().rules
    assert {r.class_id for r in rules if not r.performance} <= roots
    assert {r.class_id for r in rules if r.performance} <= slow


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_root_cause_and_location(name: str) -> None:
    want = EXPECTED[name]
    report = _diagnose_files(_inputs(name))
    assert report.findings, "no findings"
    root = report.findings[0]
    assert (root.class_id, root.host, root.rank, root.gpu) == (
        want["root"],
        want["host"],
        want["rank"],
        want["gpu"],
    )
    later = [f.class_id for f in report.findings[1:]]
    for class_id in want.get("also", []):
        assert class_id in later
    for f in report.findings[1:]:
        if f.class_id in want.get("caused_by", []):
            assert f.details["likely_caused_by"] == root.id
    if "second" in want:
        assert report.findings[1].class_id == want["second"]
    if "straggler" in want:
        assert root.details["straggler_rank"] == want["straggler"]
        assert f"(straggler: rank {want['straggler']}," in root.title
    assert len(report.events) == want.get("events", 0)
    assert [f.class_id for f in report.performance] == want.get("performance", [])


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name)
def test_a_healthy_run_produces_no_findings(path: Path) -> None:
    report = _diagnose_files([path])
    assert report.findings == []
    assert report.events == []
    assert report.lines_read >= 150


def test_healthy_runs_together_are_still_healthy() -> None:
    # The old-NCCL one is left out: next to the others it would be a job with mixed NCCL versions.
    report = _diagnose_files([p for p in HEALTHY if "old_nccl" not in p.name])
    assert report.findings == [] and report.lines_read > 800


def test_json_is_the_design_shape() -> None:
    report = _diagnose_files(_inputs("scenarios/xid79_with_nccl.log"))
    doc = json.loads(json.dumps(report.to_json()))
    assert set(doc) == {"root_cause", "events", "findings", "performance", "summary"}
    assert doc["root_cause"] == doc["findings"][0]["id"]
    assert doc["events"][0] == {
        "line": 14,
        "xid": 79,
        "pci_bus_id": "0000:ab:00.0",
        "pid": 41266,
        "process": "python3",
        "timestamp": "May  1 14:03:10",
        "text": (
            "May  1 14:03:10 node2 kernel: [ 8841.123981] NVRM: Xid (PCI:0000:ab:00): 79, pid=41266,"
            " name=python3, GPU has fallen off the bus."
        ),
    }
    required = {"id", "class", "severity", "action", "title", "playbook", "gpu", "rank", "local_rank", "host"}
    required |= {"place_inferred", "ranks", "count", "evidence"}
    for f in doc["findings"]:
        assert required <= set(f)
        assert f["severity"] in {"critical", "warning", "info", "unknown"}
        assert f["action"] in Action.__members__
        assert all(set(e) == {"line", "text"} for e in f["evidence"])
    root = doc["findings"][0]
    assert (root["class"], root["playbook"], root["action"]) == ("xid_79", "xid-79", "REBOOT_NODE")
    lines = (FIXTURES / "scenarios" / "xid79_with_nccl.log").read_bytes().count(b"\n")
    assert doc["summary"]["lines_read"] == lines


def test_playbook_ids_of_training_findings() -> None:
    report = _diagnose_files(_inputs("classes/ib_completion_timeout.log"))
    assert report.findings[0].playbook == "nccl-ib-completion-timeout"
    assert report.findings[0].steps and any("NCCL_IB_DISABLE=1" in s for s in report.findings[0].steps)


def test_repeated_lines_collapse_with_count_and_first_and_last_evidence() -> None:
    lines = [
        f"node1:100:101 [0] misc/socket.cc:538 NCCL WARN socketProgress: Connection closed by remote peer 10.0.0.{i}<1>"
        for i in range(2, 9)
    ]
    report = _text("node1:100:101 [0] NCCL INFO comm 0x1 rank 4 nranks 8 cudaDev 0 busId 18000 - Init COMPLETE", *lines)
    [finding] = report.findings
    assert finding.id == "remote_peer_closed:node1/rank4/0000:18:00.0"
    assert finding.count == 7
    assert [(e.line, e.text) for e in finding.evidence] == [(2, lines[0]), (8, lines[-1])]
    assert finding.details["peer"] == "10.0.0.2<1>"  # fields of the first occurrence


def test_one_finding_per_rank_and_stable_ids() -> None:
    report = _diagnose_files(_inputs("scenarios/oom_rank3"))
    ids = [f.id for f in report.findings]
    assert len(ids) == len(set(ids))
    again = _diagnose_files(_inputs("scenarios/oom_rank3"), chunk=7)
    assert [f.id for f in again.findings] == ids
    [closed] = [f for f in report.findings if f.class_id == "remote_peer_closed"]
    assert closed.ranks == [0, 1, 2] and closed.count == 6
    assert [m["count"] for m in closed.members] == [2, 2, 2]


def test_evidence_names_its_input_when_there_are_several() -> None:
    report = _diagnose_files(_inputs("scenarios/oom_rank3"))
    root = report.findings[0]
    assert [(e.source, e.line) for e in root.evidence] == [("rank3.log", 38)]
    assert report.to_json()["summary"]["sources"] == 4
    single = _diagnose_files(_inputs("classes/cuda_oom.log"))
    assert all(e.source is None for f in single.findings for e in f.evidence)


def test_straggler_that_timed_out_itself_is_marked_and_first() -> None:
    report = _text(
        "[rank0]:[E0501 12:10:41.1 1 ProcessGroupNCCL.cpp:1] [PG 0 Rank 0] Timeout at NCCL work: 9, last enqueued NCCL work: 9, last completed NCCL work: 8.",
        "[rank1]:[E0501 12:10:40.1 1 ProcessGroupNCCL.cpp:1] [PG 0 Rank 1] Timeout at NCCL work: 9, last enqueued NCCL work: 9, last completed NCCL work: 8.",
        "[rank2]:[E0501 12:10:42.1 1 ProcessGroupNCCL.cpp:1] [PG 0 Rank 2] Timeout at NCCL work: 7, last enqueued NCCL work: 9, last completed NCCL work: 6.",
    )
    [timeouts] = report.findings
    assert timeouts.ranks == [0, 1, 2]
    assert timeouts.details["straggler_rank"] == 2
    assert (timeouts.details["last_completed"], timeouts.details["others_last_completed"]) == (6, 8)
    # The proof, the straggler's own line, leads the evidence: the text report shows it.
    assert "last completed NCCL work: 6." in timeouts.evidence[0].text
    assert "last completed SeqNum 6, the others 8" in timeouts.title


def test_no_straggler_when_ranks_agree() -> None:
    timeout = "[rank{0}]: [Rank {0}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600100 milliseconds before timing out."
    report = _text(timeout.format(0), timeout.format(1))
    [timeouts] = report.findings
    assert timeouts.ranks == [0, 1] and "straggler_rank" not in timeouts.details


def test_xid_on_a_node_is_the_root_cause_of_its_ranks_errors() -> None:
    report = _diagnose_files(_inputs("scenarios/xid79_with_nccl.log"))
    root = report.findings[0]
    assert root.class_id == "xid_79" and root.severity is Severity.CRITICAL
    assert root.count == 1  # the driver's own line and its single-line twin are one fault
    [event] = report.events  # and one event: the Xid line, which names the process
    assert (event["line"], event["process"]) == (14, "python3")
    others = report.findings[1:]
    assert all(f.details.get("likely_caused_by") == root.id for f in others)


def test_unknown_xid_code_is_reported_as_unknown() -> None:
    report = _text("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 999, pid=7, name=python3, something new")
    [finding] = report.findings
    assert finding.class_id == "xid_999"
    assert (finding.severity, finding.action, finding.playbook) == (
        Severity.UNKNOWN,
        Action.RUN_DIAGNOSTICS,
        "run-diagnostics",
    )
    assert "999" in finding.evidence[0].text


def test_mixed_nccl_versions_across_hosts_are_a_library_mismatch() -> None:
    report = _text(
        "node1:1:1 [0] NCCL INFO NCCL version 2.20.5+cuda12.2",
        "node2:1:1 [0] NCCL INFO NCCL version 2.18.1+cuda12.1",
        "node3:1:1 [0] NCCL INFO NCCL version 2.20.5+cuda12.2",
    )
    [finding] = report.findings
    assert (finding.class_id, finding.id) == ("nccl_lib_mismatch", "nccl_lib_mismatch:versions")
    assert finding.details["versions"] == "2.18.1, 2.20.5"


def test_socket_error_on_a_docker_address_says_so() -> None:
    report = _diagnose_files(_inputs("classes/socket_connect_error.log"))
    assert "docker" in str(report.findings[0].details["address_hint"])


def test_torchrun_exit_report_is_placed_on_the_killed_worker() -> None:
    """The agent's line, the table's exit code and its signal are one kill, of pid 40233: the table
    binds the pid to host, global rank and local rank."""
    report = _diagnose_files(_inputs("classes/host_oom_killed.log"))
    kills = [f for f in report.findings if f.class_id == "host_oom_killed"]
    assert len(kills) == 1
    [root] = kills
    assert (root.host, root.rank, root.local_rank, root.count) == ("node1", 3, 3, 3)
    assert [e.line for e in root.evidence] == [8, 24, 26]
    assert root.evidence[-1].text.strip() == "traceback : Signal 9 (SIGKILL) received by PID 40233"


@pytest.mark.parametrize("size", [1, 2, 3, 17, 4096])
def test_same_result_whatever_the_chunk_boundaries(size: int) -> None:
    paths = _inputs("scenarios/ib_port_then_completion.log")
    want = _diagnose_files(paths).to_json()
    assert _diagnose_files(paths, chunk=size).to_json() == want


def test_random_chunk_boundaries_and_crlf() -> None:
    data = (FIXTURES / "scenarios" / "timeout_straggler.log").read_bytes()
    want = diagnose([(None, [data])]).to_json()
    rng = random.Random(5)
    cuts = sorted(rng.sample(range(len(data)), 200))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert diagnose([(None, pieces)]).to_json() == want
    crlf = diagnose([(None, [data.replace(b"\n", b"\r\n")])]).to_json()
    assert [f["id"] for f in crlf["findings"]] == [f["id"] for f in want["findings"]]
    assert [f["evidence"] for f in crlf["findings"]] == [f["evidence"] for f in want["findings"]]


def test_ansi_colours_do_not_hide_a_fault() -> None:
    report = _text("\x1b[31m[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\x1b[0m")
    assert report.findings[0].class_id == "cuda_oom" and report.findings[0].rank == 3
    assert "\x1b" not in report.findings[0].evidence[0].text


def test_progress_bar_redraws_are_separate_lines() -> None:
    report = _text(" 10%|#  | 1/10\r 20%|## | 2/10\r[rank1]: RuntimeError: CUDA error: out of memory")
    assert [f.class_id for f in report.findings] == ["cuda_oom"]


def test_empty_input_and_no_inputs() -> None:
    assert diagnose([]).to_json() == {
        "root_cause": None,
        "events": [],
        "findings": [],
        "performance": [],
        "summary": {"sources": 0, "lines_read": 0, "lines_skipped": 0, "events_dropped": 0},
    }
    report = diagnose([("empty", []), ("blank", [b"", b""])])
    assert report.findings == [] and report.lines_read == 0


def test_invalid_utf8_is_read_with_replacement() -> None:
    data = b"[rank2]: RuntimeError: CUDA error: out of memory \xff\xfe\xc3\n\xc3\x28 ERROR \xa0\xa1\n"
    report = diagnose([(None, [data])])
    assert [f.class_id for f in report.findings] == ["cuda_oom"]
    assert "\ufffd" in report.findings[0].evidence[0].text


def test_binary_garbage_is_skipped_cleanly() -> None:
    rng = random.Random(1)
    garbage = bytes(rng.randrange(256) for _ in range(1 << 20))
    # Make sure the garbage holds a signature, so the skipping path is really taken.
    garbage += b"\x00CUDA error: out of memory\x00\n\x00\x00ERROR" + bytes(rng.randrange(256) for _ in range(4096))
    report = diagnose([("core", _chunks(garbage, 8192))])
    assert report.findings == []
    assert report.lines_skipped >= 1


def test_a_ten_megabyte_line_is_skipped_not_held() -> None:
    huge = b"NCCL WARN Cuda failure 'out of memory' " + b"A" * (10 << 20)
    data = b"ok\n" + huge + b"\n[rank1]: RuntimeError: CUDA error: out of memory\n"
    report = diagnose([(None, _chunks(data, 1 << 20))])
    assert report.lines_read == 3 and report.lines_skipped == 1
    assert [(f.class_id, f.evidence[0].line) for f in report.findings] == [("cuda_oom", 3)]
    unterminated = diagnose([(None, _chunks(huge, 1 << 20))])
    assert unterminated.findings == [] and unterminated.lines_skipped == 1


def test_a_log_cut_mid_line_still_counts_its_last_line() -> None:
    report = diagnose([(None, [b"ok\n[rank1]: RuntimeError: CUDA error: out of memory"])])
    assert report.lines_read == 2
    assert [f.class_id for f in report.findings] == ["cuda_oom"]
    cut = diagnose([(None, [b"ok\n[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to all"])])
    assert cut.findings[0].class_id == "cuda_oom" and cut.findings[0].evidence[0].line == 2


def test_memoryviews_and_bytearrays_are_accepted() -> None:
    data = b"[rank1]: RuntimeError: CUDA error: out of memory\n"
    report = diagnose([(None, [bytearray(data[:10]), memoryview(data)[10:]])])  # type: ignore[list-item]
    assert report.findings[0].class_id == "cuda_oom"


def test_a_failure_inside_a_kubernetes_pod_log() -> None:
    healthy = (FIXTURES / "healthy_k8s_node2.log").read_bytes()
    failure = (
        b"2024-05-01T12:31:00.000000001Z stderr F \x1b[31m[default5]:[rank13]: torch.OutOfMemoryError: CUDA out of"
        b" memory. Tried to allocate 2.00 GiB. GPU 5 has a total capacity of 79.15 GiB\x1b[0m\r\n"
    )
    report = diagnose([("pod-worker-1.log", [healthy, failure])])
    [finding] = report.findings
    assert (finding.class_id, finding.host, finding.rank, finding.gpu) == ("cuda_oom", "node2", 13, "0000:ab:00.0")
    assert finding.evidence[0].line == healthy.count(b"\n") + 1


def test_a_failure_in_a_slurm_labelled_log() -> None:
    healthy = (FIXTURES / "healthy_slurm_label.log").read_bytes()
    failure = (
        b"2: gpu-a100-07:40222:40350 [2] misc/shmutils.cc:61 NCCL WARN Call to open failed: No such file or directory\n"
    )
    report = diagnose([(None, [healthy + failure])])
    [finding] = report.findings
    assert (finding.class_id, finding.host, finding.rank, finding.gpu) == (
        "shm_attach_error",
        "gpu-a100-07",
        2,
        "0000:3a:00.0",
    )


def test_a_flood_of_repeated_lines_is_counted_exactly() -> None:
    from gpu_triage.diagnosis.training.scan.classify import CACHE_ENTRIES

    same = b"node1:9:10 [0] misc/socket.cc:538 NCCL WARN socketProgress: Connection closed by remote peer 10.0.0.4<1>\n"
    # More distinct messages than the classification caches hold, so they empty and refill on the way.
    varied = b"".join(
        b"[rank2]:[E0501 12:00:00.%06d 7 ProcessGroupNCCL.cpp:1] [Rank 2] Process group watchdog thread terminated"
        b" with exception: CUDA error: out of memory (%d)\n" % (i, i)
        for i in range(CACHE_ENTRIES + 500)
    )
    report = diagnose([(None, [same * 3000, varied])])
    counts = {f.class_id: (f.count, [e.line for e in f.evidence]) for f in report.findings}
    assert counts == {
        "cuda_oom": (CACHE_ENTRIES + 500, [3001, 3000 + CACHE_ENTRIES + 500]),
        "remote_peer_closed": (3000, [1, 3000]),
    }


def test_xids_of_one_gpu_are_judged_together_as_the_daemon_does() -> None:
    """48 with a remap and Xid 154 asking for a reboot: 48 is the root cause and the reboot its action;
    the remap event, the sympathetic 45 and the 154 itself are symptoms."""
    report = _text(
        "May  1 14:03:10 node2 kernel: NVRM: Xid (PCI:0000:ab:00): 48, pid=1, name=python3, DBE",
        "May  1 14:03:10 node2 kernel: NVRM: Xid (PCI:0000:ab:00): 63, pid=1, name=python3, Row remapper",
        "May  1 14:03:11 node2 kernel: NVRM: Xid (PCI:0000:ab:00): 45, pid=1, name=python3, Ch 00000008",
        "May  1 14:03:11 node2 kernel: NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
    )
    root, *rest = report.findings
    assert (root.class_id, root.action, root.severity) == ("xid_48", Action.REBOOT_NODE, Severity.CRITICAL)
    assert "154" in str(root.details["note"])
    assert [f.class_id for f in rest] == ["xid_63", "xid_45", "xid_154"]
    assert all(f.action is Action.IGNORE and f.details["likely_caused_by"] == root.id for f in rest)


def test_the_same_code_on_two_gpus_is_judged_per_gpu() -> None:
    report = _text(
        "NVRM: Xid (PCI:0000:ab:00): 48, pid=1, name=python3, DBE",
        "NVRM: Xid (PCI:0000:ab:00): 63, pid=1, name=python3, Row remapper",
        "NVRM: Xid (PCI:0000:18:00): 48, pid=2, name=python3, DBE",
    )
    verdicts = {(f.class_id, f.gpu): f.action for f in report.findings}
    assert verdicts[("xid_48", "0000:ab:00.0")] is Action.DRAIN_AND_RESET
    assert verdicts[("xid_48", "0000:18:00.0")] is Action.RESET_GPU


_XID79 = "[ 8841.123981] NVRM: Xid (PCI:0000:ab:00): 79, pid=41266, name=python3, GPU has fallen off the bus."
_FALLEN_AB = "[ 8841.124002] NVRM: GPU 0000:ab:00.0: GPU has fallen off the bus."


@pytest.mark.parametrize("lines", [[_XID79, _FALLEN_AB], [_FALLEN_AB, _XID79]], ids=["xid-first", "message-first"])
def test_fallen_off_the_bus_is_one_fault_in_either_order(lines: list[str]) -> None:
    report = _text(*lines)
    [finding] = report.findings
    assert (finding.class_id, finding.gpu, finding.count) == ("xid_79", "0000:ab:00.0", 1)
    [event] = report.events
    assert event["process"] == "python3"


def test_fallen_off_messages_far_apart_or_on_another_gpu_are_their_own_faults() -> None:
    other = "[ 8841.124002] NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."
    report = _text(_XID79, other, *["chatter"] * 20, _FALLEN_AB)
    counts = {f.gpu: f.count for f in report.findings if f.class_id == "xid_79"}
    assert counts == {"0000:ab:00.0": 2, "0000:18:00.0": 1}
    assert len(report.events) == 3


def test_xids_hours_apart_are_separate_incidents() -> None:
    """Three Xid 13 on one GPU in a day: not the application's fault alone any more (incidents.decide)."""
    from gpu_triage.diagnosis.training.input.log_lines import normalise
    from gpu_triage.diagnosis.xid.incidents import Occurrence, decide

    lines = [
        f"[Wed May  1 {hour:02d}:00:00 2024] NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python3, Graphics Exception"
        for hour in (2, 9, 17)
    ]
    stamps = [normalise(line).stamp for line in lines]
    assert all(s is not None and s.kind == "abs" for s in stamps)
    expected = decide(
        [
            Occurrence(13, line, s.value if s else None, ref=n)
            for n, (line, s) in enumerate(zip(lines, stamps, strict=True), 1)
        ]
    )[-1]
    assert expected.root and expected.action is Action.RUN_DIAGNOSTICS
    [finding] = _text(*lines).findings
    assert (finding.action, finding.severity, finding.count) == (expected.action, expected.severity, 3)
    assert finding.details["note"] == expected.note


def test_the_event_that_fills_the_list_is_judged_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_triage.diagnosis.training import diagnose as training
    from gpu_triage.diagnosis.training.findings import kernel as training_kernel
    from gpu_triage.diagnosis.training.rules.load import load_rules

    monkeypatch.setattr(training_kernel, "MAX_EVENTS", 2)
    state = training._Diagnosis(load_rules())
    xid = "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=python3, Graphics Exception\n"
    state.read(None, [xid.encode() * 3])
    assert len(state.kernel.events) == 2 and state.kernel.dropped == 1
    assert len(state.kernel.occurrences[(0, None, "0000:3b:00.0")]) == 2


def test_an_uncaught_exception_at_the_end_of_a_log_is_a_death_a_handled_one_is_not() -> None:
    traceback = [
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "ValueError: bad shape",
    ]
    died = _text("step 1 | loss 2.0", *traceback)
    [finding] = died.findings
    assert finding.class_id == "job_failed_unclassified"
    assert finding.evidence[0].text == "ValueError: bad shape"
    handled = _text("step 1 | loss 2.0", *traceback, *[f"step {i} | loss 1.9" for i in range(2, 12)])
    assert handled.findings == []
    ignored = _text("step 1", "Exception ignored in: <function X.__del__ at 0x7f00>", *traceback)
    assert ignored.findings == []


def test_a_dead_job_with_only_a_launcher_report_is_not_healthy() -> None:
    report = _text("srun: error: gpu07: task 3: Exited with exit code 2")
    [finding] = report.findings
    assert (finding.class_id, finding.host, finding.rank) == ("job_failed_unclassified", "gpu07", 3)


COALESCED_TIMEOUT = (
    "[rank{0}]:[E0501 00:00:00.000 1 ProcessGroupNCCL.cpp:1] [PG ID 1 PG GUID 1 Rank {0}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=7, OpType={1}, NumelIn={2}, NumelOut={2}, Timeout(ms)=600000) ran for "
    "600001 milliseconds before timing out."
)


def test_a_work_without_a_size_keeps_its_seq_and_op() -> None:
    """PyTorch prints the unset `size_t numelIn_` of a coalesced work as 2^64-1, 20 digits: still the
    watchdog's timeout with its SeqNum and OpType, the size unknown rather than a number to compare."""
    unset = 2**64 - 1
    report = _text(COALESCED_TIMEOUT.format(2, "COALESCED", unset), COALESCED_TIMEOUT.format(3, "ALLREDUCE", 4))
    [timeouts] = [f for f in report.findings if f.class_id == "collective_timeout"]
    assert timeouts.ranks == [2, 3]
    assert (timeouts.details["seq"], timeouts.details["op"]) == (7, "COALESCED")
    assert timeouts.details["numel_in"] == "unknown"
    [mismatch] = [f for f in report.findings if f.class_id == "collective_mismatch"]
    assert str(unset) not in mismatch.title


def test_xids_a_day_apart_in_plain_dmesg_are_two_incidents() -> None:
    """Plain `dmesg` stamps seconds since boot: they compare with each other, so Xid 31 at 100 s is not
    a symptom of an Xid 79 25 hours later on the same GPU."""
    xid31 = "[  100.1] NVRM: Xid (PCI:0000:3b:00): 31, pid=555, name=python3, Ch 00000008, intr 00000000. MMU Fault"
    xid79 = "[90000.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has fallen off the bus."
    apart = {f.class_id: f for f in _text(xid31, xid79).findings}
    assert "likely_caused_by" not in apart["xid_31"].details and apart["xid_31"].severity is not Severity.INFO
    close = {f.class_id: f for f in _text(xid31, xid79.replace("90000.1", "  130.1")).findings}
    assert close["xid_31"].details.get("likely_caused_by", "").startswith("xid_79")


def test_crash_handlers_of_ucx_and_abseil_are_crashes() -> None:
    """UCX's `[host:pid:thread:tid] Caught signal %d (%s)` and abseil's `*** %s received at time=%ld ***`
    are a process's own report of its crash; a SIGBUS among them is /dev/shm running out."""
    [ucx] = _text(
        "[node1:12345:0:12345] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)"
    ).findings
    assert (ucx.class_id, ucx.host, ucx.details["pid"], ucx.details["signal"]) == (
        "process_segfault",
        "node1",
        12345,
        "11",
    )
    [absl] = _text("*** SIGSEGV received at time=1714564800 on cpu 3 ***").findings
    assert (absl.class_id, absl.details["signal"]) == ("process_segfault", "SEGV")
    [bus] = _text("*** SIGBUS received at time=1714564800 on cpu 3 ***").findings
    assert bus.class_id == "shm_unavailable"


def test_cuda_unknown_error_is_a_gpu_fault_and_the_xid_beside_it_names_it() -> None:
    [alone] = _text("[rank4]: RuntimeError: CUDA error: unknown error").findings
    assert (alone.class_id, alone.rank, alone.action) == ("gpu_hw_fault", 4, Action.REBOOT_NODE)
    report = _text(
        "May  1 12:00:00 node07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has fallen off the bus.",
        "node07:555:600 [1] NCCL INFO comm 0x55d4b0c0 rank 4 nranks 8 cudaDev 1 busId 3b000 - Init COMPLETE",
        "node07:555:600 [1] misc/strongstream.cc:395 NCCL WARN Cuda failure 999 'unknown error'",
    )
    root, cuda = report.findings
    assert (root.class_id, cuda.class_id) == ("xid_79", "gpu_hw_fault")
    assert cuda.details["likely_caused_by"] == root.id
    warning = "UserWarning: CUDA unknown error - this may be due to an incorrectly set up environment"
    assert all(f.class_id != "gpu_hw_fault" for f in _text(warning).findings)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Jan 15 23:59:30", "Jan 16 00:00:10"),
        ("Jan 31 23:59:30", "Feb  1 00:00:10"),
        ("Feb 29 23:59:30", "Mar  1 00:00:10"),
        ("Dec 31 23:59:30", "Jan  1 00:00:10"),
    ],
)
def test_syslog_dates_without_a_year_keep_a_burst_whole_across_a_month_or_a_year(first: str, second: str) -> None:
    """40 s apart whatever the calendar says: Xid 63 stays a symptom of the DBE, which stays the root cause."""
    xid48 = (
        f"{first} node07 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
    )
    xid63 = (
        f"{second} node07 kernel: NVRM: Xid (PCI:0000:3b:00): 63, pid=1234, name=python, Row Remapper: New row "
        "(0x00000000000abcde) Marked for Remapping, reset gpu to activate."
    )
    report = _text(xid48, xid63)
    assert report.findings[0].class_id == "xid_48"
    by_class = {f.class_id: f for f in report.findings}
    assert by_class["xid_63"].details.get("likely_caused_by", "").startswith("xid_48")


def test_a_crash_on_every_gpu_of_a_node_is_one_finding() -> None:
    """A job's death leaves Xid 13, then 43 and 45, on each GPU it ran on (the driver's own lines, as dmesg prints
    them): one finding for the application's fault that lists the GPUs, never eight, and no hardware verdict."""
    buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    lines = []
    for n, bus in enumerate(buses):
        lines.append(
            f"[ 8841.{n:06d}] NVRM: Xid (PCI:0000:{bus}:00): 13, pid=4242, name=python3, Graphics SM Warp "
            "Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address"
        )
    for code in (43, 45):
        lines += [f"[ 8842.{n:06d}] NVRM: Xid (PCI:0000:{bus}:00): {code}, pid=4242, name=python3, Ch 00000010"
                  for n, bus in enumerate(buses)]  # fmt: skip
    report = diagnose([(None, ["\n".join(lines).encode() + b"\n"])])
    app = [f for f in report.findings if f.class_id == "xid_13"]
    assert len(app) == 1 and app[0].action is Action.CHECK_APP
    assert app[0].details["gpus"] == ", ".join(f"0000:{b}:00.0" for b in buses) and app[0].count == 8
    assert not any(f.action.rank <= Action.RUN_DIAGNOSTICS.rank for f in report.findings)
    assert len([f for f in report.findings if f.class_id.startswith("xid_")]) <= 3  # 13, 43, 45: one each
