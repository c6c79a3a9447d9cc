"""Flight Recorder pickles decoded in a child process whose memory is capped.

diagnosis/fr_unpickle.py refuses every instruction that is not a plain value, which is what keeps a
pickle from running code. It also scans for a memo index that would make CPython's unpickler allocate
gigabytes, but that scan is a Python loop: a 512-rank job's dumps would take a minute. Here the fast C
unpickler runs unscanned (imports and calls are still refused) in a child whose address space is
limited (RLIMIT_AS), so a pickle that asks for too much memory fails with MemoryError there, not in
the daemon; a child that dies or stalls costs that one dump, reported, and the next dump gets a fresh
child. The child sends back the reduced dump (diagnosis.flight_recorder.Dump) as JSON.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
from collections import deque
from dataclasses import asdict
from typing import IO, Any

from gpu_triage.diagnosis.flight_recorder import Dump, DumpError, Frame, Group, Op, parse

__all__ = ["CHILD_MEMORY_BYTES", "SandboxDecoder"]

CHILD_MEMORY_BYTES = 3 << 30  # address space: a 64 MiB dump's values with room to spare
DECODE_TIMEOUT_S = 60.0
_HEAD = struct.Struct("<IQ")


def _op_from(d: dict[str, Any]) -> Op:
    d = dict(d)
    d["in_sizes"] = tuple(tuple(s) for s in d["in_sizes"])
    d["out_sizes"] = tuple(tuple(s) for s in d["out_sizes"])
    d["dtypes"] = tuple(d["dtypes"])
    d["frames"] = tuple(Frame(**f) for f in d["frames"])
    return Op(**d)


def to_wire(dump: Dump) -> bytes:
    out = {
        "rank": dump.rank,
        "source": dump.source,
        "version": dump.version,
        "form": dump.form,
        "groups": {
            n: {
                "desc": g.desc,
                "pg_id": g.pg_id,
                "ops": [asdict(o) for o in g.ops],
                "p2p": [asdict(o) for o in g.p2p],
                "count": g.count,
                "last_op_id": g.last_op_id,
            }
            for n, g in dump.groups.items()
        },
        "members": dump.members,
        "world_hint": dump.world_hint,
        "states_known": dump.states_known,
        "wrapped": dump.wrapped,
        "comm_lib": dump.comm_lib,
        "skipped": dump.skipped,
        "notes": dump.notes,
        "last": asdict(dump.last) if dump.last else None,
        "last_group": dump.last_group,
    }
    return json.dumps({"ok": out}).encode() + b"\n"


def from_wire(raw: dict[str, Any]) -> Dump:
    dump = Dump(raw["rank"], raw["source"], raw["version"], raw["form"])
    for name, g in raw["groups"].items():
        group = Group(name, g["desc"], g["pg_id"], count=g["count"], last_op_id=g["last_op_id"])
        group.ops = deque((_op_from(o) for o in g["ops"]), maxlen=group.ops.maxlen)
        group.p2p = deque((_op_from(o) for o in g["p2p"]), maxlen=group.p2p.maxlen)
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

    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while head := stdin.read(_HEAD.size):
        name_len, size = _HEAD.unpack(head)
        name, data = stdin.read(name_len).decode(), stdin.read(size)
        try:
            reply = to_wire(parse(name, data, "pickle", scanned=False))
        except DumpError as e:
            reply = json.dumps({"error": str(e)}).encode() + b"\n"
        except MemoryError:
            reply = json.dumps({"error": f"{name}: the pickle needs more memory than a dump may use"}).encode() + b"\n"
        del data
        stdout.write(reply)
        stdout.flush()


class SandboxDecoder:
    """`decode` for diagnosis.training.diagnose: pickles in a capped child, JSON dumps here."""

    def __init__(self, memory: int = CHILD_MEMORY_BYTES, timeout: float = DECODE_TIMEOUT_S) -> None:
        self.memory, self.timeout = memory, timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __call__(self, name: str, data: bytes, kind: str) -> Dump:
        if kind != "pickle":
            return parse(name, data, kind)
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(_HEAD.pack(len(name.encode()), len(data)) + name.encode() + data)
            proc.stdin.flush()
            line = self._reply(proc.stdout)
        except (OSError, TimeoutError) as e:
            self.close()
            raise DumpError(f"{name}: could not be decoded ({e or 'the decoder stopped'})") from None
        reply = json.loads(line)
        if "error" in reply:
            raise DumpError(reply["error"])
        return from_wire(reply["ok"])

    def _reply(self, out: IO[bytes]) -> bytes:
        ready, _, _ = select.select([out], [], [], self.timeout)
        if not ready:
            raise TimeoutError(f"no answer within {self.timeout:g}s")
        line = out.readline()
        if not line:
            raise OSError("the decoder died")
        return line

    def _start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            code = f"from gpu_triage.exporter.fr_decode import _child; _child({self.memory})"
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            )
        return self.proc

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout):
                if f is not None:
                    f.close()
            self.proc = None

    def __enter__(self) -> SandboxDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
