"""Output a healthy job prints that must not read as a failure: handled tracebacks, tracebacks of
threads and asyncio tasks, NCCL's connect retries that then succeed."""

from __future__ import annotations

import pytest

from gpu_triage.diagnosis.training.diagnose import Report, diagnose


def _text(*lines: str) -> Report:
    return diagnose([(None, ["\n".join(lines).encode() + b"\n"])])


def _traceback(exc: str) -> list[str]:
    return ["Traceback (most recent call last):", '  File "/opt/venv/lib/python3.11/threading.py", line 1045', exc]


def test_a_thread_s_exception_at_the_end_of_the_log_is_not_a_death() -> None:
    """threading.excepthook's header: the thread died, the process did not."""
    header = "Exception in thread Thread-3 (_pin_memory_loop):"
    assert (
        _text("epoch 3 step 900 loss 1.2", header, *_traceback("ConnectionResetError: [Errno 104] reset")).findings
        == []
    )
    assert _text("epoch 3", header, *_traceback("RuntimeError: boom"), "", "").findings == []


def test_an_asyncio_task_s_unretrieved_exception_is_not_a_death() -> None:
    lines = [
        "ERROR:asyncio:Task exception was never retrieved",
        "future: <Task finished name='Task-7' coro=<upload() done, defined at /app/sync.py:12> exception=OSError()>",
        *_traceback("OSError: [Errno 32] Broken pipe"),
    ]
    assert _text("epoch 3", *lines).findings == []


def test_a_handled_traceback_followed_by_more_output_is_not_a_death() -> None:
    """wandb's BrokenPipeError logged with its traceback, then the job finishes: any output after the
    exception line means the process went on."""
    handled = _text("Checkpoint saved", *_traceback("BrokenPipeError: [Errno 32] Broken pipe"), "Training complete.")
    assert handled.findings == []


def test_an_uncaught_exception_that_ends_the_output_is_still_a_death() -> None:
    report = _text("epoch 3", *_traceback("ValueError: bad shape"), "", "  ")
    assert [f.class_id for f in report.findings] == ["job_failed_unclassified"]
    in_chunks = diagnose(
        [(None, [b"epoch 3\nTraceback (most recent call last):\n", b"  File \"t.py\"\nKeyError: 'x'", b"\n\n"])]
    )
    assert [f.class_id for f in in_chunks.findings] == ["job_failed_unclassified"]


@pytest.mark.parametrize(
    "at_exit",
    [
        # PyTorch 2.4+'s ProcessGroupNCCL destructor, on the first rank of each node
        "[rank0]:[W117 03:41:45.075470549 ProcessGroupNCCL.cpp:1524] Warning: WARNING: destroy_process_group() was "
        "not called before program exit, which can leak resources. For more info, please see "
        "https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())",
        # PyTorch 2.2-2.3's wording of it
        "[rank0]:[W121 08:27:34.749346586 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been "
        "destroyed before we destruct ProcessGroupNCCL. On normal program exit, the application should call "
        "destroy_process_group to ensure that any pending NCCL operations have finished in this process.",
        # NCCL tearing its communicators down, and wandb's summary (colour and all)
        "node1:4242:4300 [0] NCCL INFO comm 0x55d4b0c0 rank 0 nranks 8 cudaDev 0 busId 18000 - Destroy COMPLETE",
        "\x1b[34m\x1b[1mwandb\x1b[0m: 🚀 View run fancy-sun-12 at: https://wandb.ai/team/proj/runs/abc123",
    ],
)
def test_an_uncaught_exception_followed_only_by_exit_handlers_output_is_a_death(at_exit: str) -> None:
    report = _text(
        "epoch 3", *_traceback("TypeError: unsupported operand type(s) for *: 'int' and 'NoneType'"), at_exit
    )
    assert [f.class_id for f in report.findings] == ["job_failed_unclassified"]
    went_on = _text("epoch 3", *_traceback("TypeError: x"), at_exit, "epoch 4 step 10 loss 2.1")
    assert went_on.findings == [], "output of another kind after it: the process went on"


def test_exit_handlers_output_hard_wrapped_after_an_uncaught_exception_is_still_read_as_such() -> None:
    """A ticket that wrapped the log at 100 columns cuts PyTorch's destructor warning into pieces."""
    warning = (
        "[rank0]:[W117 03:41:45.075470549 ProcessGroupNCCL.cpp:1524] Warning: WARNING: destroy_process_group() was "
        "not called before program exit, which can leak resources. For more info, please see "
        "https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())"
    )
    lines = ["epoch 3", *_traceback("TypeError: unsupported operand type(s) for *: 'int' and 'NoneType'"), warning]
    wrapped = [line[i : i + 100] for line in lines for i in range(0, len(line), 100)]
    assert len(wrapped) > len(lines) + 1, "the warning alone is cut twice"
    assert [f.class_id for f in _text(*wrapped).findings] == ["job_failed_unclassified"]


def test_a_handled_traceback_followed_by_a_new_communicator_is_not_a_death() -> None:
    """NCCL's init lines after a traceback mean the process went on (a hang, or a log taken mid-run)."""
    init = [
        "gpu1:2311:2400 [0] NCCL INFO Using network IB",
        "gpu1:2311:2400 [0] NCCL INFO comm 0x55d0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0xabd - "
        "Init START",
        "gpu1:2311:2400 [0] NCCL INFO Channel 00/24 :    0   1   2   3   4   5   6   7",
    ]
    assert _text("step 500 loss 1.9", *_traceback("ConnectionError: Max retries exceeded"), *init).findings == []


def test_a_long_wandb_summary_after_an_uncaught_exception_is_still_read_through() -> None:
    summary = [f"wandb:   train/metric_{i:03d} ▁▂▃▄▅▆▇█▁▂▃▄▅▆▇█▁▂▃▄▅▆▇█▁▂▃▄▅▆▇█▁▂▃▄" for i in range(1200)]
    report = _text("step 100 loss 2.3", *_traceback("RuntimeError: shape mismatch in layer 4"), *summary)
    assert [f.class_id for f in report.findings] == ["job_failed_unclassified"]
    far = [f"step {i} loss 2.3" for i in range(20_000)]
    assert _text(*_traceback("TypeError: x"), *far).findings == [], "a traceback long before the end"


RETRY = (
    "gpu-node-01:2311:2311 [0] NCCL INFO socketStartConnect: connect to 10.0.0.12<43321> returned Connection timed "
    "out, retrying ({0}/34) after sleep for {1} msec"
)
INIT = "gpu-node-01:2311:2311 [0] NCCL INFO ncclCommInitRank comm 0x55d4b0c0 rank 3 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x8e1c5a2f0b7d4c61 - Init COMPLETE"


def test_connect_retries_followed_by_init_complete_are_a_slow_peer() -> None:
    assert _text(RETRY.format(1, 100), RETRY.format(2, 200), INIT, "epoch 1 step 10 loss 2.3").findings == []


def test_connect_retries_without_a_completed_init_are_a_connect_error() -> None:
    [finding] = _text(RETRY.format(1, 100), RETRY.format(2, 200)).findings
    assert (finding.class_id, finding.host, finding.count) == ("socket_connect_error", "gpu-node-01", 2)
    assert finding.details["peer"] == "10.0.0.12<43321>"
    # Another process's init says nothing of this one's connect.
    other = INIT.replace("2311:2311", "2400:2400")
    assert [f.class_id for f in _text(RETRY.format(1, 100), other).findings] == ["socket_connect_error"]
