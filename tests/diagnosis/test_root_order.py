"""Which finding leads when several layers report one failure (diagnosis/training/findings/root_cause.py, kernel.py)."""

from __future__ import annotations

from gpu_triage.diagnosis.training.diagnose import Report, diagnose


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


def _sources(*inputs: tuple[str, list[str]]) -> Report:
    return diagnose([(name, ["\n".join(lines).encode() + b"\n"]) for name, lines in inputs])


TIMEOUT = (
    "[rank{0}]:[E ProcessGroupNCCL.cpp:523] [Rank {0}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1201, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600757 "
    "milliseconds before timing out."
)


def test_an_xid_leads_the_cuda_error_its_gpu_gave_the_rank() -> None:
    """The rank's 'uncorrectable ECC error encountered' is Xid 94 seen from the application."""
    report = _text(
        "h100-c94:3041756:3041756 [4] NCCL INFO comm 0x55aa rank 4 nranks 8 cudaDev 4 busId 9a000 - Init COMPLETE",
        "[rank4]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "[Tue Nov  5 02:28:12 2024] NVRM: Xid (PCI:0000:9a:00): 94, pid=3041756, name=python3, Contained: SM (0x1). "
        "RST: No, D-RST: No",
    )
    assert [(f.class_id, f.rank) for f in report.findings] == [("xid_94", 4), ("gpu_hw_fault", 4)]
    assert report.findings[1].details["likely_caused_by"] == report.findings[0].id


def test_an_xid_on_another_gpu_does_not_jump_ahead_of_a_cuda_error() -> None:
    report = _text(
        "n1:11:11 [4] NCCL INFO comm 0x55aa rank 4 nranks 8 cudaDev 4 busId 9a000 - Init COMPLETE",
        "n1:12:12 [5] NCCL INFO comm 0x55ab rank 5 nranks 8 cudaDev 5 busId ab000 - Init COMPLETE",
        "[rank4]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "Nov  5 02:28:12 n1 kernel: NVRM: Xid (PCI:0000:ab:00): 94, pid=12, name=python3, Contained: SM (0x1).",
    )
    assert [f.class_id for f in report.findings] == ["gpu_hw_fault", "xid_94"]


def test_a_non_fatal_sxid_leads_the_timeouts_and_names_no_host_of_its_own() -> None:
    """`nvidia-nvswitch2:` is the switch driver's device, not a pdsh host prefix."""
    report = _text(
        *(TIMEOUT.format(r) for r in range(2)),
        "[Tue Mar 12 14:11:58 2024] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 12028, Non-fatal, Link 61 egress "
        "non-posted PRIV error (First)",
    )
    assert [f.class_id for f in report.findings] == ["sxid_12028", "collective_timeout"]
    assert report.findings[1].ranks == [0, 1]
    assert all(f.host is None for f in report.findings)


def test_a_non_fatal_sxid_follows_a_specific_training_log_fault() -> None:
    report = _text(
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.10 GiB of which 1.2 GiB is free.",
        "Mar 12 15:18:41 dgx-sw-7 kernel: nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX "
        "Short Error Rate",
    )
    assert [f.class_id for f in report.findings] == ["cuda_oom", "sxid_20009"]


def test_the_nccl_version_an_error_names_counts_towards_a_mismatch() -> None:
    report = _sources(
        ("node-a.log", ["NCCL version 2.20.5+cuda12.4"]),
        (
            "node-b.log",
            [
                "[rank2]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                "NCCL version 2.19.3"
            ],
        ),
    )
    lib = next(f for f in report.findings if f.class_id == "nccl_lib_mismatch")
    assert lib.details["versions"] == "2.19.3, 2.20.5"
    assert report.findings[0] is lib


def test_nccl_tests_names_the_nccl_error_it_got() -> None:
    """NCCLCHECK's `Test NCCL failure file:line '<ncclGetErrorString> / <last error>'`, then TESTCHECK's line."""
    report = _text(
        "[1,1]<stdout>:nt-3: Test NCCL failure common.cu:958 'internal error - please report this issue to the "
        "NCCL developers / '",
        "[1,1]<stdout>: .. nt-3 pid 344155: Test failure common.cu:842",
    )
    assert [(f.class_id, f.host, f.rank) for f in report.findings] == [("nccl_generic_error", "nt-3", 1)]


def test_xids_of_two_hosts_on_the_same_bus_id_are_judged_apart() -> None:
    """Every node has a GPU at 3b:00: node09's double-bit error is its own fault, not a symptom of node07's 79."""
    report = _text(
        "node07: [12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has fallen off the bus.",
        "node09: [12346.100000] NVRM: Xid (PCI:0000:3b:00): 48, pid=777, name=python3, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
    )
    dbe = next(f for f in report.findings if f.class_id == "xid_48")
    assert dbe.host == "node09"
    assert dbe.severity.value == "critical" and dbe.action.value != "IGNORE"
    assert "likely_caused_by" not in dbe.details


def test_an_xid_is_not_the_cause_of_findings_on_another_host() -> None:
    report = _text(
        "May  1 12:00:00 node07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has fallen off "
        "the bus.",
        "node09:41211:41339 [1] NCCL INFO comm 0x55d4b0c0 rank 9 nranks 16 cudaDev 1 busId 3b000 - Init COMPLETE",
        "node09:41211:41339 [1] NCCL WARN NET/IB : Got completion from peer 10.3.1.12<39811> with error 12, "
        "opcode 0, len 0, vendor err 129",
        "node09:41211:41339 [1] misc/strongstream.cc:395 NCCL WARN Cuda failure 700 'an illegal memory access was "
        "encountered'",
    )
    assert report.findings[0].class_id == "xid_79" and report.findings[0].host == "node07"
    others = [f for f in report.findings if f.host == "node09"]
    assert {f.class_id for f in others} >= {"cuda_illegal_address"}
    assert not any(f.details.get("likely_caused_by") == report.findings[0].id for f in others)
    # On its own host the same bus id still ties the XID to the rank's error.
    same = _text(
        "May  1 12:00:00 node09 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=41211, name=python3, GPU has fallen off "
        "the bus.",
        "node09:41211:41339 [1] NCCL INFO comm 0x55d4b0c0 rank 9 nranks 16 cudaDev 1 busId 3b000 - Init COMPLETE",
        "node09:41211:41339 [1] misc/strongstream.cc:395 NCCL WARN Cuda failure 700 'an illegal memory access was "
        "encountered'",
    )
    cuda = next(f for f in same.findings if f.class_id == "cuda_illegal_address")
    assert cuda.details.get("likely_caused_by") == same.findings[0].id


def test_journal_exports_of_two_hosts_keep_their_xids_apart() -> None:
    """`journalctl -o short-iso` and rsyslog's RFC 3339 lines name the host after the stamp."""
    report = _text(
        "2024-05-01T12:00:00+0000 node07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has "
        "fallen off the bus.",
        "2024-05-01T12:00:01.500000+00:00 node09 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=777, name=python3, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0.",
    )
    assert sorted((f.class_id, f.host) for f in report.findings) == [("xid_48", "node09"), ("xid_79", "node07")]
    assert not any("likely_caused_by" in f.details for f in report.findings)
