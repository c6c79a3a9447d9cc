"""The training-log corpus: whole jobs as users paste them, each run through `gpu-triage diagnose --json`.

tests/fixtures/training/corpus/ holds failing and healthy jobs written line by line from the format strings of
NCCL, PyTorch, the launchers (torchrun, DeepSpeed, mpirun, srun, pdsh, kubectl) and the kernel, across versions,
without looking at the classifier's rules; expected.yaml says, per case, what a user should be told first. A case
is a `.log` file or a directory (one job, all its files in one call); the two biggest jobs are generated at test
time by corpus_jobs.py. Test ids are the case ids, and a failure prints the case's shape and what came back.

Every case goes through the command's own code (`diagnose_files`, what `gpu-triage diagnose --json` runs after
parsing its arguments) in this process; a few also go through the real command, which must say the same.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_triage.diagnosis.training.input.log_lines import normalise
from gpu_triage.diagnosis.training.place.facts import short_host
from gpu_triage.exporter.cli.commands import diagnose_files
from tests.conftest import REPO
from tests.diagnosis.corpus_jobs import GENERATORS, wrap
from tests.exporter.cli.test_diagnose import cli

CORPUS = REPO / "tests" / "fixtures" / "training" / "corpus"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((CORPUS / "expected.yaml").read_text())

# The class ids of the issue-11 contract; kernel events add xid_<code> and sxid_<code>.
CLASSES = {
    "gpu_hw_fault", "host_oom_killed", "cuda_oom", "cuda_illegal_address", "cuda_driver_incompatible",
    "ib_gdr_access_error", "ib_async_event", "ib_completion_timeout", "ib_memreg_error", "ib_qp_setup_error",
    "ofi_efa_error", "shm_unavailable", "shm_attach_error", "p2p_broken", "nvswitch_fabric_error", "duplicate_gpu",
    "ring_topology_error", "nccl_lib_mismatch", "rendezvous_store_error", "socket_connect_error",
    "size_mismatch_truncated", "collective_mismatch", "collective_timeout", "watchdog_hang", "remote_peer_closed",
    "nccl_generic_error", "job_failed_unclassified", "process_segfault", "nccl_comm_aborted", "cuda_device_assert",
    "cuda_kernel_fault", "cuda_no_device", "agent_xid_report", "topology_xml_error", "duplicate_rank",
}  # fmt: skip
# Conditions that slow a job without ending it: never findings, named in the report's performance section.
PERFORMANCE = {"gdr_disabled", "p2p_disabled", "socket_fallback", "host_tuning_warning"}
KERNEL_CLASS = re.compile(r"s?xid_\d{1,5}")
KEYS = {"shape", "root", "host", "rank", "local_rank", "gpu", "also", "not", "also_at", "max_findings", "exit", "generated", "performance"}  # fmt: skip
PLACE = ("host", "rank", "local_rank", "gpu")


def known(cls: str) -> bool:
    return cls in CLASSES or KERNEL_CLASS.fullmatch(cls) is not None


def inputs(case: str, scratch: Path) -> list[Path]:
    """The files of one job, in the order `diagnose` gets them."""
    generated = EXPECTED[case].get("generated")
    if generated:
        return sorted(GENERATORS[generated](scratch / case))
    path = CORPUS / case
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path.with_name(f"{case}.log")]


Outcome = tuple[int, dict[str, Any] | None, str]  # exit status, the JSON report, stderr


def _report(stdout: str) -> dict[str, Any] | None:
    try:
        return json.loads(stdout) if stdout.strip() else None
    except json.JSONDecodeError:
        return None


def diagnose(case: str, scratch: Path) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    rc = diagnose_files([str(p) for p in inputs(case, scratch)], True, out=out, err=err)
    return rc, _report(out.getvalue()), err.getvalue()


def diagnose_by_command(case: str, scratch: Path) -> Outcome:
    done = cli("--json", *map(str, inputs(case, scratch)))
    return done.returncode, _report(done.stdout.decode()), done.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("generated")


def place_of(finding: dict[str, Any]) -> str:
    where = "/".join(f"{k}={finding.get(k)}" for k in PLACE if finding.get(k) is not None)
    ranks = finding.get("ranks")
    return f"{finding['class']}({where}{' ranks=' + str(len(ranks)) if ranks else ''})"


def at(finding: dict[str, Any], want: dict[str, Any]) -> bool:
    """A finding of want's class at want's place; a rank may be one of a folded finding's ranks."""
    if finding["class"] != want["class"]:
        return False
    for key, value in want.items():
        if key == "class":
            continue
        if key == "rank" and value in (finding.get("ranks") or []):
            continue
        if finding.get(key) != value:
            return False
    return True


def problems(exp: dict[str, Any], rc: int, report: dict[str, Any] | None, stderr: str) -> list[str]:
    root = exp["root"]
    want_rc = exp.get("exit", 0 if root == "none" else 1)
    out = [] if rc == want_rc else [f"exit status {rc}, expected {want_rc}"]
    if want_rc == 2:
        return out + (
            [] if "no log lines read" in stderr else [f"stderr does not say 'no log lines read': {stderr.strip()!r}"]
        )
    if report is None:
        return [*out, f"no JSON report on stdout (stderr: {stderr.strip()[:300]!r})"]
    findings: list[dict[str, Any]] = report.get("findings", [])
    classes = [f["class"] for f in findings]
    slow = [f["class"] for f in report.get("performance", [])]
    if slow != exp.get("performance", []):
        out.append(f"performance section {slow}, expected {exp.get('performance', [])}")
    if root == "none":
        return out + ([f"findings on a healthy log: {[place_of(f) for f in findings]}"] if findings else [])
    if not findings:
        return [*out, f"no findings, expected root {root}"]
    first = findings[0]
    if first["class"] != root:
        out.append(f"root is {first['class']}, expected {root}")
    out += [
        f"root {key} is {first.get(key)!r}, expected {exp[key]!r}"
        for key in PLACE
        if key in exp and first.get(key) != exp[key]
    ]
    out += [f"{cls} missing after the root" for cls in exp.get("also", []) if cls not in classes[1:]]
    out += [f"{cls} reported, must not be" for cls in exp.get("not", []) if cls in classes]
    out += [f"no finding at {want}" for want in exp.get("also_at", []) if not any(at(f, want) for f in findings)]
    if "max_findings" in exp and len(findings) > exp["max_findings"]:
        out.append(f"{len(findings)} findings, at most {exp['max_findings']} expected")
    return out


@pytest.mark.parametrize("case", sorted(EXPECTED), ids=str)
def test_case(case: str, scratch: Path) -> None:
    exp = EXPECTED[case]
    rc, report, stderr = diagnose(case, scratch)
    found = problems(exp, rc, report, stderr)
    got = [place_of(f) for f in (report or {}).get("findings", [])]
    assert not found, (
        f"{case}: {exp['shape']}\n  problems: {found}\n  findings: {got[:12]}{' …' if len(got) > 12 else ''}"
    )


@pytest.mark.parametrize(
    "case",
    [
        "empty-input",
        "healthy-01-nccl278-pt17-launch-clean",
        "host_oom_killed-01-pt21-interleaved-no-nccl-debug-wrong-place-trap_wrap100",
        "xid_48-04-big-job-64-rank-files-generated",
    ],
    ids=str,
)
def test_the_command_says_the_same(case: str, scratch: Path) -> None:
    """The real `gpu-triage diagnose --json` process: the same exit status and report as its code in-process."""
    assert case in EXPECTED
    by_command, in_process = diagnose_by_command(case, scratch), diagnose(case, scratch)
    assert by_command[:2] == in_process[:2]
    assert ("no log lines read" in by_command[2]) == ("no log lines read" in in_process[2])


def test_the_report_names_its_root_cause() -> None:
    """`root_cause` is the first finding's id, so a script need not know that findings are ordered."""
    case = "cuda_oom-02-pt20-cuda-outofmemoryerror-error-file"
    rc, report, _ = diagnose(case, REPO)
    assert rc == 1 and report is not None and report["findings"]
    assert report.get("root_cause") == report["findings"][0]["id"]


def test_expected_yaml_matches_the_corpus() -> None:
    """Every case has its files, every file its case, every field and class is one the contract knows, and a
    `_wrapNN` case is its twin wrapped at NN columns."""
    files = {p.name.removesuffix(".log") for p in CORPUS.iterdir() if p.name != "expected.yaml"}
    on_disk = {case for case, exp in EXPECTED.items() if not exp.get("generated")}
    assert files == on_disk, (
        f"files without a case: {sorted(files - on_disk)}, cases without files: {sorted(on_disk - files)}"
    )
    for case, exp in EXPECTED.items():
        assert set(exp) <= KEYS and {"shape", "root"} <= set(exp), (case, sorted(exp))
        named = [exp["root"], *exp.get("also", []), *exp.get("not", []), *(w["class"] for w in exp.get("also_at", []))]
        assert all(known(c) for c in named if c != "none"), (case, named)
        assert set(exp.get("performance", [])) <= PERFORMANCE, case
        assert exp.get("generated") in (None, *GENERATORS), case
        twin = re.fullmatch(r"(.+)_wrap(\d+)", case)
        if twin:
            assert (CORPUS / f"{case}.log").read_text() == wrap(
                (CORPUS / f"{twin[1]}.log").read_text(), int(twin[2])
            ), case
            assert {k: v for k, v in exp.items() if k != "shape"} == {
                k: v for k, v in EXPECTED[twin[1]].items() if k != "shape"
            }
    roots = [exp["root"] for exp in EXPECTED.values()]
    assert sum(r != "none" for r in roots) >= 150 and roots.count("none") >= 20
    assert all(roots.count(c) >= 4 for c in CLASSES), sorted(c for c in CLASSES if roots.count(c) < 4)


@pytest.mark.parametrize("case", sorted(EXPECTED), ids=str)
def test_the_host_and_rank_the_deciding_line_names_are_the_finding_s(case: str, scratch: Path) -> None:
    """Whatever launcher or printer put them there (`host:pid:tid [dev]`, srun, pdsh, mpirun, Open MPI's and
    UCX's `[host:pid]`, `[rankN]:`), the host and rank of a finding's first evidence line are the finding's
    (one of its ranks when folded). The NCCL version mismatch, which no one line decides, is left out."""
    _, report, _ = diagnose(case, scratch)
    for f in (report or {}).get("findings", []):
        if not f["evidence"] or f["id"].endswith(":versions"):
            continue
        line = normalise(f["evidence"][0]["text"])
        if line.host is not None and line.pod is None:
            hosts = {m.get("host") for m in f.get("members", [])} | {f["host"]}
            assert short_host(line.host) in hosts, (f["id"], line.raw[:120])
        if line.rank is not None:
            assert line.rank == f["rank"] or line.rank in f["ranks"], (f["id"], line.raw[:120])
