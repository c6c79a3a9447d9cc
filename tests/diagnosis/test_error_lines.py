"""A dead job is never silent, nor is a fragment of one: error-level lines no rule names are findings.

The lines are written from the printers' formats (NCCL's `NCCL WARN`, CUDA's error strings, c10d's
`E`-level glog, UCX's `UCX  ERROR`); the benign ones are those healthy jobs print (tests/fixtures).
"""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.training.diagnose import Report, diagnose
from gpu_triage.diagnosis.training.rules.load import load_rules


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


@pytest.mark.parametrize(
    "line",
    [
        # NCCL 2.23's WARN for a CollNet registration it cannot use (transport/coll_net.cc)
        "gpu-node-03:5101:5170 [0] transport/coll_net.cc:930 NCCL WARN CollNet: requested buffers not registered",
        # PyTorch's C10_CUDA_CHECK with an error no class names, pasted without its traceback
        "[rank2]: RuntimeError: CUDA error: invalid configuration argument",
        # c10d at level E (the timestamp without a thread id, as 2.4+ prints it)
        "[rank1]:[E0606 09:09:08.170157826 ProcessGroupNCCL.cpp:2732] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "First PG on this rank to signal dumping.",
        # UCX's error level (src/ucs/debug/log.c)
        "[1760000000.654321] [gpu-node-07:77125:0]       ucp_worker.c:1783 UCX  ERROR failed to set UCX_MAX_RNDV_RAILS",
    ],
)
def test_an_error_level_line_no_rule_names_is_still_a_finding(line: str) -> None:
    [finding] = _text("epoch 3 step 900 loss 1.21", line).findings
    assert finding.class_id == "job_failed_unclassified"
    assert [e.text for e in finding.evidence] == [line]


def test_the_place_the_line_names_is_the_finding_s() -> None:
    [finding] = _text(
        "[1760000000.654321] [gpu-node-07:77125:0]       ucp_worker.c:1783 UCX  ERROR failed to set UCX_MAX_RNDV_RAILS"
    ).findings
    assert (finding.host, finding.details["pid"]) == ("gpu-node-07", 77125)


@pytest.mark.parametrize("line", [ex.line for ex in load_rules().fallback.benign_examples])
def test_the_benign_ones_a_healthy_job_prints_are_not(line: str) -> None:
    assert _text("epoch 3 step 900 loss 1.21", line).findings == []


def test_an_info_line_quoting_an_error_is_no_error_and_a_warning_level_glog_line_neither() -> None:
    assert (
        _text(
            "node1:40211:40211 [0] NCCL INFO misc/cudawrap.cc:150 Cuda failure 'peer access is already enabled'",
            "[rank0]:[W0501 12:00:02.001000 3104 ProcessGroupNCCL.cpp:4561] Warning: something c10d warns about",
        ).findings
        == []
    )


def test_a_named_cause_elsewhere_explains_an_unnamed_error_line() -> None:
    """The job died of rank 3's OOM: rank 0's odd NCCL WARN is not a second root cause."""
    report = _text(
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 3 has a total capacity of 79.15 GiB",
        "[rank0]:gpu-node-01:5101:5170 [0] transport/coll_net.cc:930 NCCL WARN CollNet: requested buffers not registered",
    )
    assert [f.class_id for f in report.findings] == ["cuda_oom"]
