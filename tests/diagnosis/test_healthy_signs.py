"""Output a healthy job prints that must not read as a failure: handled tracebacks, tracebacks of
threads and asyncio tasks, NCCL's connect retries that then succeed."""

from __future__ import annotations

from gpu_triage.diagnosis.training import Report, diagnose


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
