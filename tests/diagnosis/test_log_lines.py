"""Normalising one raw line: the prefixes of launchers, runtimes and printers come off, identity stays."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_triage.diagnosis.core.log_stamps import Stamp
from gpu_triage.diagnosis.training.input.log_lines import LogLine, clean, normalise

MSG = "misc/socket.cc:538 NCCL WARN socketProgress: Connection closed by remote peer 10.0.0.4<35120>"


def _abs(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_nccl_header_gives_host_pid_and_cuda_device() -> None:
    line = normalise(f"node-7.cluster.local:40211:40290 [3] {MSG}")
    assert line.text == MSG
    assert (line.host, line.pid, line.cuda_dev, line.rank) == ("node-7.cluster.local", 40211, 3, None)


def test_torchrun_rank_tag_is_the_global_rank_and_role_tag_the_local_rank() -> None:
    assert normalise(f"[rank11]:{MSG}").rank == 11
    line = normalise(f"[default3]:node2:1:2 [3] {MSG}")
    assert (line.rank, line.local_rank, line.host, line.text) == (None, 3, "node2", MSG)
    stacked = normalise(f"[default3]:[rank11]: {MSG}")
    assert (stacked.rank, stacked.local_rank, stacked.text) == (11, 3, MSG)


def test_launcher_tasks_are_kept_apart_from_ranks() -> None:
    """srun's label and Open MPI's tag number tasks: a rank only when each task is one (diagnosis/training/place/identity.py)."""
    line = normalise(f"5: node1:1:2 [5] {MSG}")
    assert (line.task, line.rank) == (5, None)
    assert (normalise(f"  5: [rank13]: {MSG}").task, normalise(f"  5: [rank13]: {MSG}").rank) == (5, 13)
    assert (normalise("[1,3]<stdout>:Traceback (most recent call last):").task, normalise("[1,3]<stderr>: x").task) == (
        3,
        3,
    )
    assert normalise("12:00:01 not a label").text == "12:00:01 not a label"


def test_pytorch_glog_prefixes_and_process_group_tag() -> None:
    raw = (
        "[rank2]:[E0501 12:10:41.220011 3301 ProcessGroupNCCL.cpp:1537] [PG ID 4 PG GUID 4(TP_GROUP) Rank 2]"
        " Timeout at NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6."
    )
    line = normalise(raw)
    assert line.text.startswith("[PG ID 4 PG GUID 4(TP_GROUP) Rank 2] Timeout at NCCL work: 7")
    assert (line.rank, line.pg) == (2, "4")
    assert line.stamp is not None and line.stamp.kind == "md"
    old = normalise("[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout")
    assert (old.rank, old.pg, old.stamp) == (3, None, None)
    assert old.text.startswith("[Rank 3] Watchdog")
    plain = normalise(
        "E0501 14:03:20.118000 140213 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: -9)"
    )
    assert plain.text == "failed (exitcode: -9)"
    assert plain.stamp is not None and plain.stamp.kind == "md"


def test_glog_stamps_order_by_month_day_and_time() -> None:
    early = normalise("[E0501 23:59:59.900000 1 a.cpp:1] x").stamp
    late = normalise("[E0502 00:00:00.100000 1 a.cpp:1] x").stamp
    assert early is not None and late is not None and early.value < late.value


def test_kubernetes_cri_prefix_and_timestamp() -> None:
    line = normalise(f"2024-05-01T12:00:00.123456789Z stderr F [rank3]:node2:7:8 [3] {MSG}")
    assert (line.text, line.rank, line.host) == (MSG, 3, "node2")
    assert line.stamp is not None and line.stamp.kind == "abs"
    assert line.stamp.value == pytest.approx(_abs("2024-05-01T12:00:00") + 0.123456)
    partial = normalise(f"2024-05-01T12:00:00+02:00 stdout P {MSG}")
    assert partial.text == MSG
    assert partial.stamp == Stamp("abs", _abs("2024-05-01T10:00:00"))


def test_python_logging_and_nccl_timestamp_prefixes() -> None:
    line = normalise("[2024-05-01 12:00:00,101] torch.distributed.run: [WARNING] Setting OMP_NUM_THREADS")
    assert line.text == "Setting OMP_NUM_THREADS"  # torch._logging of PyTorch 2.1-2.2
    assert line.stamp is not None and line.stamp.kind == "abs"
    assert line.stamp.value == pytest.approx(_abs("2024-05-01T12:00:00") + 0.101)
    dashed = normalise("2024-05-01 12:05:00,123 - INFO - train.py:212 - step 100")
    assert dashed.text == "INFO - train.py:212 - step 100"


def test_kernel_log_prefixes_give_host_and_time() -> None:
    line = normalise("May  1 14:03:10 node2 kernel: [ 8841.123981] NVRM: Xid (PCI:0000:ab:00): 79, pid=1")
    assert (line.host, line.text) == ("node2", "NVRM: Xid (PCI:0000:ab:00): 79, pid=1")
    assert line.stamp is not None and line.stamp.kind == "md"
    dmesg = normalise("[ 8841.123981] NVRM: Xid (PCI:0000:ab:00): 79")
    assert dmesg.stamp == Stamp("uptime", 8841.123981)
    human = normalise("[Wed May  1 14:03:10 2024] NVRM: Xid (PCI:0000:ab:00): 79")
    assert human.stamp == Stamp("abs", _abs("2024-05-01T14:03:10"))


XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=555, name=python3, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("header", "kind", "value"),
    [
        ("2024-05-01T12:00:00+0000 node07 kernel: ", "abs", _abs("2024-05-01T12:00:00")),  # journalctl short-iso
        ("2024-05-01T14:00:00+02:00 node07 kernel: ", "abs", _abs("2024-05-01T12:00:00")),  # newer short-iso
        ("2024-05-01T12:00:00.250000+00:00 node07 kernel: ", "abs", _abs("2024-05-01T12:00:00") + 0.25),  # rsyslog
        ("May 01 12:00:00.250000 node07 kernel: ", "md", None),  # journalctl short-precise
        ("<4>May  1 12:00:00 node07 kernel: ", "md", None),  # with the syslog priority
        ("Wed 2024-05-01 12:00:00 UTC node07.cluster.local kernel: ", "abs", _abs("2024-05-01T12:00:00")),
        ("1714564800.250000 node07 kernel: ", "abs", 1714564800.25),  # journalctl short-unix
    ],
)
def test_every_syslog_and_journal_header_gives_the_host(header: str, kind: str, value: float | None) -> None:
    line = normalise(header + XID)
    assert (line.text, line.host is not None and line.host.split(".")[0]) == (XID, "node07")
    assert line.stamp is not None and line.stamp.kind == kind
    if value is not None:
        assert line.stamp.value == pytest.approx(value)


def test_a_training_line_from_the_journal_keeps_host_and_rank() -> None:
    line = normalise(f"2024-05-01T12:00:00+0000 node07 python[1234]: [rank5]: {MSG}")
    assert (line.host, line.rank, line.text) == ("node07", 5, MSG)
    precise = normalise(f"May 01 12:00:00.123456 node07 python3[1234]: node07:1234:1290 [5] {MSG}")
    assert (precise.host, precise.pid, precise.cuda_dev, precise.text) == ("node07", 1234, 5, MSG)


def test_a_programs_own_words_after_a_runtime_stamp_are_no_host() -> None:
    """A container's stamp is followed by the program's output; dmesg's by the kernel's `driver device: `."""
    assert normalise("2024-05-01T12:00:00.123456789Z Epoch 1: loss 2.3").host is None
    assert normalise("2024-05-01T12:00:00,123456+0000 usb 1-1: new high-speed USB device").host is None
    assert normalise("[    1.000000] usb 1-1: new high-speed USB device").host is None


def test_ansi_colours_and_line_ends_are_removed() -> None:
    raw = f"\x1b[31m[rank1]:\x1b[0m \x1b[1m{MSG}\x1b[0m\r\n"
    line = normalise(raw)
    assert line.text == MSG and line.rank == 1
    assert "\x1b" not in line.raw and not line.raw.endswith("\r")
    assert clean("a\x00b\r") == "ab"


@pytest.mark.parametrize(
    "cut",
    [
        "node1:4021",
        "node1:40211:40290 [3",
        "[rank1",
        "[rank1]:[E0501 12:10",
        "2024-05-01T12:00:00.12",
        "\x1b[3",
        "May  1 14:03",
        "[ 8841.12",
        "",
        "   ",
    ],
)
def test_a_line_cut_mid_prefix_does_not_break_anything(cut: str) -> None:
    line = normalise(cut)
    assert isinstance(line, LogLine)
    # Whatever prefix could not be recognised stays in the message.
    assert clean(cut).strip().endswith(line.text)


def test_impossible_dates_are_not_timestamps() -> None:
    line = normalise("2024-13-45T99:00:00Z stdout F hello")
    assert line.stamp is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_normalise_never_raises(text: str) -> None:
    line = normalise(text)
    assert isinstance(line.text, str)
    assert len(line.text) <= len(text)


@pytest.mark.parametrize(
    ("raw", "text", "host", "rank", "local_rank"),
    [
        # Open MPI --tag-output (the MPI rank), 4.x without a space, 5.x with one
        ("[1,3]<stdout>:Traceback (most recent call last):", "Traceback (most recent call last):", None, None, None),
        ("[1,3]<stderr>: RuntimeError: x", "RuntimeError: x", None, None, None),
        # kubectl logs --prefix: the pod stands for the host
        ("[pod/trainer-0/pytorch] [rank3]: RuntimeError: x", "RuntimeError: x", "trainer-0", 3, None),
        # pdsh / DeepSpeed's runner, then DeepSpeed's logger
        (
            "node07: [2024-05-01 12:00:00,123] [ERROR] [launch.py:325:sigkill_handler] ['python'] exits with return code = -9",
            "['python'] exits with return code = -9",
            "node07",
            None,
            None,
        ),
        (
            "10.0.87.143: ip-10-0-87-143:149:298 [5] x.c:1 NCCL WARN y",
            "x.c:1 NCCL WARN y",
            "ip-10-0-87-143",
            None,
            None,
        ),
        # words that are no host stay part of the message
        ("RuntimeError: CUDA error: x", "RuntimeError: CUDA error: x", None, None, None),
        ("srun: error: gpu07: task 3: Killed", "srun: error: gpu07: task 3: Killed", None, None, None),
        ("train.sh: line 12: 26147 Killed python3", "train.sh: line 12: 26147 Killed python3", None, None, None),
        # Lightning, Ray
        ("[rank: 2] Child process with PID 13117 terminated", "Child process with PID 13117 terminated", None, 2, None),
        ("(RayWorkerWrapper pid=270291, ip=10.175.94.190) [rank3]: x", "x", "10.175.94.190", 3, None),
        # Python logging, basic and torch._logging 2.3+ (thread id of 15 digits)
        (
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1)",
            "failed (exitcode: 1)",
            None,
            None,
            None,
        ),
        (
            "E0314 12:34:56.789000 139981234567808 torch/distributed/elastic/multiprocessing/api.py:858] failed",
            "failed",
            None,
            None,
            None,
        ),
        # the table of torchrun's ChildFailedError keeps its fields' indentation
        ("[default0]:  host      : node2", "host      : node2", None, None, 0),
    ],
)
def test_launcher_and_aggregator_prefixes(
    raw: str, text: str, host: str | None, rank: int | None, local_rank: int | None
) -> None:
    line = normalise(raw)
    assert (line.text, line.host, line.rank, line.local_rank) == (text, host, rank, local_rank)


def test_c10_logging_month_is_not_zero_padded() -> None:
    july = normalise("[rank1]:[E709 18:37:01.832146912 ProcessGroupNCCL.cpp:607] [Rank 1] x").stamp
    december = normalise("[rank1]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 1] x").stamp
    assert july is not None and december is not None and july.value < december.value


def test_the_rank_of_a_subgroup_is_not_the_global_rank() -> None:
    assert normalise("[PG ID 1 PG GUID 1 Rank 2] Watchdog caught collective operation timeout").rank is None
    assert normalise("[PG ID 0 PG GUID 0(default_pg) Rank 2] Watchdog").rank == 2
    assert normalise("[rank10]:[E1 ProcessGroupNCCL.cpp:1] [PG ID 1 PG GUID 1 Rank 2] x").rank == 10


def test_indentation_of_the_message_is_kept() -> None:
    assert normalise("  exitcode  : -9 (pid: 1)").indent == 2
    assert normalise("[default3]:  exitcode  : -9 (pid: 1)").indent == 2
    assert normalise("[rank3]: x").indent == 0
