"""Flight Recorder pickles decoded in a child process whose memory is capped.

diagnosis/training/hang/fr_unpickle.py refuses every instruction that is not a plain value, which is what keeps a
pickle from running code. It also scans for a memo index that would make CPython's unpickler allocate
gigabytes, but that scan is a Python loop: a 512-rank job's dumps would take a minute. Here the fast C
unpickler runs unscanned (imports and calls are still refused) in a child whose address space is
limited (RLIMIT_AS), so a pickle that asks for too much memory fails with MemoryError there, not in
the daemon; a child that dies or stalls costs that one dump, reported, and the next dump gets a fresh
child. Where the limit cannot be set (the systemd unit forbids setrlimit), the child runs the scan
instead. The child sends back the reduced dump (diagnosis.training.hang.flight_recorder.Dump) as JSON.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
from dataclasses import fields
from typing import Any

from gpu_triage.diagnosis.training.hang.flight_recorder import Dump, DumpError, Frame, Group, Op, parse
from gpu_triage.diagnosis.training.hang.report import InProcessDecoder, Pending
from gpu_triage.exporter.worker import Worker

__all__ = ["CHILD_MEMORY_BYTES", "SandboxDecoder"]

CHILD_MEMORY_BYTES = 3 << 30  # address space: a 64 MiB dump's values with room to spare
DECODE_TIMEOUT_S = 60.0
_HEAD = struct.Struct("<IQ")


_OP_FIELDS = tuple(f.name for f in fields(Op))


def _op_to(op: Op) -> list[Any]:
    return [[[f.name, f.filename, f.line] for f in op.frames] if k == "frames" else getattr(op, k) for k in _OP_FIELDS]


def _op_from(values: list[Any]) -> Op:
    d = dict(zip(_OP_FIELDS, values, strict=True))
    d["in_sizes"] = tuple(tuple(s) for s in d["in_sizes"])
    d["out_sizes"] = tuple(tuple(s) for s in d["out_sizes"])
    d["dtypes"] = tuple(d["dtypes"])
    d["frames"] = tuple(Frame(*f) for f in d["frames"])
    return Op(**d)


def to_wire(dump: Dump) -> bytes:
    out = {
        "rank": dump.rank,
        "source": dump.source,
        "version": dump.version,
        "form": dump.form,
        "groups": {
            n: [g.desc, g.pg_id, g.count, g.last_op_id, [_op_to(o) for o in g.ops], [_op_to(o) for o in g.p2p]]
            for n, g in dump.groups.items()
        },
        "members": dump.members,
        "world_hint": dump.world_hint,
        "states_known": dump.states_known,
        "wrapped": dump.wrapped,
        "comm_lib": dump.comm_lib,
        "skipped": dump.skipped,
        "notes": dump.notes,
        "last": _op_to(dump.last) if dump.last else None,
        "last_group": dump.last_group,
    }
    return json.dumps({"ok": out}).encode() + b"\n"


def from_wire(raw: dict[str, Any]) -> Dump:
    dump = Dump(raw["rank"], raw["source"], raw["version"], raw["form"])
    for name, (desc, pg_id, count, last_op_id, ops, p2p) in raw["groups"].items():
        group = Group(name, desc, pg_id, count=count, last_op_id=last_op_id)
        group.ops.extend(_op_from(o) for o in ops)
        group.p2p.extend(_op_from(o) for o in p2p)
        dump.groups[name] = group
    dump.members = {k: tuple(v) for k, v in raw["members"].items()}
    dump.world_hint, dump.states_known, dump.wrapped = raw["world_hint"], raw["states_known"], raw["wrapped"]
    dump.comm_lib, dump.skipped, dump.notes = raw["comm_lib"], raw["skipped"], list(raw["notes"])
    dump.last = _op_from(raw["last"]) if raw["last"] else None
    dump.last_group = raw["last_group"]
    return dump


def _child(memory: int) -> None:
    """The decoding process: length-prefixed (name, pickle) in on stdin, one JSON line out per dump."""
    import resource

    scanned = False
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except (OSError, ValueError):
        # Not allowed here (the systemd unit's SystemCallFilter=~@resources, a lower hard limit): the
        # memo is then bounded by the pre-scan instead, slower but as safe.
        scanned = True
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while head := stdin.read(_HEAD.size):
        name_len, size = _HEAD.unpack(head)
        name, data = stdin.read(name_len).decode(), stdin.read(size)
        try:
            reply = to_wire(parse(name, data, "pickle", scanned=scanned))
        except DumpError as e:
            reply = json.dumps({"error": str(e)}).encode() + b"\n"
        except MemoryError:
            reply = json.dumps({"error": f"{name}: the pickle needs more memory than a dump may use"}).encode() + b"\n"
        del data
        stdout.write(reply)
        stdout.flush()


class _Worker:
    """One decoding process, and a thread that collects its answers (so a busy child never blocks on a full
    pipe while the parent is still sending). Answers come in the order the dumps were sent."""

    def __init__(self, memory: int) -> None:
        import subprocess  # here: most diagnoses read no pickle dump, and start no child

        code = f"from gpu_triage.exporter.fr_decode import _child; _child({memory})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        self.sent = 0
        self.answers: list[bytes] = []
        self.ended = False
        self.cond = threading.Condition()
        self._reader = Worker("fr-decode-reader", self._read)
        self._reader.start()

    def _read(self) -> None:
        """One answer; at the end of the child's output (or once close() shut the pipe), the last turn."""
        assert self.proc.stdout is not None
        try:
            line = self.proc.stdout.readline()
        except (OSError, ValueError):  # ValueError: read from the pipe close() has just closed
            line = b""
        with self.cond:
            if line:
                self.answers.append(line)
            else:
                self.ended = True
                self._reader.stopping.set()
            self.cond.notify_all()

    def send(self, name: str, data: bytes) -> int:
        assert self.proc.stdin is not None
        encoded = name.encode()
        self.proc.stdin.write(_HEAD.pack(len(encoded), len(data)) + encoded + data)
        self.proc.stdin.flush()
        self.sent += 1
        return self.sent - 1

    def answer(self, ticket: int, timeout: float) -> bytes | None:
        """The answer to dump number `ticket`; None when the process ended or stalled first."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.answers) <= ticket and not self.ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.answers[ticket] if ticket < len(self.answers) else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class SandboxDecoder:
    """The Decoder of diagnosis.training.hang.report for the CLI and the daemon: pickles in capped child processes
    (`workers` of them, dumps dealt round-robin), JSON dumps here. A child that dies or stalls costs the
    dumps it held, each reported; the next dump gets a fresh child."""

    def __init__(self, memory: int = CHILD_MEMORY_BYTES, timeout: float = DECODE_TIMEOUT_S, workers: int = 0) -> None:
        self.memory, self.timeout = memory, timeout
        self.slots: list[_Worker | None] = [None] * (workers or min(2, os.cpu_count() or 1))
        self.turn = 0

    def submit(self, name: str, data: bytes, kind: str) -> Pending:
        if kind != "pickle":
            return InProcessDecoder().submit(name, data, kind)
        slot = self.turn % len(self.slots)
        self.turn += 1
        worker = self.slots[slot]
        if worker is None or worker.ended or worker.proc.poll() is not None:
            if worker is not None:
                worker.close()
            worker = self.slots[slot] = _Worker(self.memory)
        try:
            ticket = worker.send(name, data)
        except OSError as e:
            return _failed(f"{name}: could not be decoded ({e})")
        return lambda: self._result(worker, ticket, name)

    def _result(self, worker: _Worker, ticket: int, name: str) -> Dump:
        line = worker.answer(ticket, self.timeout)
        if line is None:
            worker.close()
            raise DumpError(
                f"{name}: could not be decoded (the decoding process stopped or took over {self.timeout:g}s)"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise DumpError(reply["error"])
        return from_wire(reply["ok"])

    def close(self) -> None:
        for worker in self.slots:
            if worker is not None:
                worker.close()
        self.slots = [None] * len(self.slots)

    def __enter__(self) -> SandboxDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failed(message: str) -> Pending:
    def fail() -> Dump:
        raise DumpError(message)

    return fail
