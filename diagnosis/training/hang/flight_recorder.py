"""Reading PyTorch Flight Recorder dumps: what each rank was doing when the job stopped.

Written from PyTorch's recorder (torch/csrc/distributed/c10d/FlightRecorder*.hpp, dump versions "2.0"
to "2.10") and its analyzer (torch/distributed/flight_recorder). A dump is one rank's: a dict with
`version`, `pg_config` (process group name -> name, desc, ranks as the text "[0, 1]"), `pg_status`,
`comm_lib_version` and `entries`, the ring buffer's records oldest first. Each entry says which process
group (`process_group`: (name, desc)) ran which op (`profiling_name`, "nccl:all_reduce", "nccl:send
0->1", "gloo:broadcast") at which position (`collective_seq_id` counts the group's collectives,
`p2p_seq_id` its point-to-point ops, `record_id` everything the rank recorded), with its tensor sizes
and dtypes, its `state` (scheduled, started, completed), when it was created and the Python frames
that called it (the pickle only; the JSON dump has none). The pickle dump is what
TORCH_NCCL_DUMP_ON_TIMEOUT writes to TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank> (and `_dump_fr_trace`
returns); the JSON one is `_dump_fr_trace_json`, where a missing time is 0 instead of None and
`pg_status` holds text.

What a dump does not say is read elsewhere: the rank is the number its file name ends with (PyTorch's
writer names it `<prefix><rank>`, and the analyzer reads it back the same way), the host and GPU come
from the job's logs. What only NCCL fills in: `state` beyond "scheduled" (CUDA events are queried; the
Gloo recorder of PyTorch 2.13 and 2.14 leaves every entry "scheduled" and `retired` set even on the op
that timed out), send/recv entries (Gloo records none; they leave only a gap in `op_id`), a usable
`pg_config` (Gloo's has one entry keyed "" with the wrong ranks) and `nccl_comm_state`.

Only a window of each process group's latest ops is kept per rank (`WINDOW`): which collective hung is
decided at the end of the buffers, and a 512-rank job's dumps then fit in flat memory.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from gpu_triage.diagnosis.training.hang.fr_model import FRAMES_KEPT, WINDOW, Dump, DumpError, Frame, Group, Op
from gpu_triage.diagnosis.training.hang.fr_unpickle import UnsafePickleError, load_unscanned, loads

__all__ = [
    "KNOWN_MINOR",
    "MAX_DUMP_BYTES",
    "Dump",
    "DumpError",
    "Frame",
    "Group",
    "Op",
    "dump_kind",
    "parse",
    "rank_of",
]

MAX_DUMP_BYTES = 64 << 20  # one rank's dump; TORCH_FR_BUFFER_SIZE=20000 with stacks is well under
MAX_ENTRIES = 200_000  # entries read per dump; the rest are counted as skipped
MAX_FRAMES = 16  # stack frames kept per op (innermost first, as PyTorch records them)
MAX_TENSORS = 64  # tensors per op whose sizes are compared
MAX_GROUPS = 4096  # process groups per dump
KNOWN_MINOR = 10  # dump versions 2.0 to 2.10 are read as PyTorch's sources write them
_RANK = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle|pt))?$")
_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)$")


def dump_kind(head: bytes) -> str | None:
    """ "pickle" or "json" when `head` (an input's first bytes) starts a Flight Recorder dump."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    text = head.lstrip()[:8192]
    if not text.startswith(b"{"):
        return None
    # nlohmann's JSON writes keys sorted: "entries" (with its first entry's fields) comes before "pg_config".
    if b'"pg_config"' in text or (b'"entries"' in text and b'"collective_seq_id"' in text):
        return "json"
    return None


def rank_of(name: str | None) -> int | None:
    """The rank a dump's file name ends with (`nccl_trace_rank_3`, `fr_rank3.json`)."""
    if not name:
        return None
    m = _RANK.search(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def parse(name: str, data: bytes, kind: str, rank: int | None = None, *, scanned: bool = True) -> Dump:
    """Read one dump (`kind` from `dump_kind`). `scanned=False` skips the pickle pre-scan (fr_unpickle)."""
    rank = rank if rank is not None else rank_of(name)
    if rank is None:
        raise DumpError(f"{name}: cannot tell which rank wrote this dump; name it <prefix><rank>, as PyTorch does")
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{name}: {len(data)} bytes is over the {MAX_DUMP_BYTES >> 20} MiB a dump may have")
    try:
        raw = (loads(data) if scanned else load_unscanned(data)) if kind == "pickle" else json.loads(data)
    except UnsafePickleError as e:
        raise DumpError(f"{name}: {e}") from None
    except (ValueError, RecursionError) as e:
        raise DumpError(f"{name}: not a readable JSON dump: {e}") from None
    return _read(name, rank, kind, raw)


def _read(name: str, rank: int, kind: str, raw: Any) -> Dump:
    if not isinstance(raw, dict) or not isinstance(raw.get("version"), str):
        raise DumpError(f"{name}: not a Flight Recorder dump (no version)")
    version = raw["version"]
    major, _, minor = version.partition(".")
    if major != "2" or not minor.isdigit():
        raise DumpError(f"{name}: dump version {version} is not one this reader knows (2.x)")
    dump = Dump(rank, name, version, kind, comm_lib=str(raw.get("comm_lib_version") or "")[:64])
    if int(minor) > KNOWN_MINOR:
        dump.notes.append(f"dump version {version} is newer than 2.{KNOWN_MINOR}: read as 2.{KNOWN_MINOR}")
    _pg_config(dump, raw.get("pg_config"))
    entries = raw.get("entries", [])
    if not isinstance(entries, list):
        raise DumpError(f"{name}: `entries` is not a list")
    if len(entries) > MAX_ENTRIES:
        dump.skipped += len(entries) - MAX_ENTRIES
        dump.notes.append(f"only the latest {MAX_ENTRIES} of {len(entries)} entries were read")
        entries = entries[-MAX_ENTRIES:]
    _entries(dump, entries)
    first = next((e.get("record_id") for e in entries if isinstance(e, dict)), 0)
    dump.wrapped = isinstance(first, int) and first > 0
    if dump.skipped:
        dump.notes.append(f"{dump.skipped} malformed entries skipped")
    return dump


def _entries(dump: Dump, entries: list[Any]) -> None:
    """The entries, newest first: each group keeps its latest WINDOW ops, and older entries are only counted."""
    known: dict[Any, Group] = {}  # by the entry's own process_group value, which repeats
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if not isinstance(entry, dict):
            dump.skipped += 1
            continue
        pg = entry.get("process_group")
        try:
            group = known.get(pg)
        except TypeError:  # the JSON dump's [name, desc] is a list
            pg = tuple(pg) if isinstance(pg, list) else repr(pg)
            group = known.get(pg)
        if group is None:
            group = _group(dump, entry)
            if group is None:
                dump.skipped += 1
                continue
            known[pg] = group
        group.count += 1
        window = group.p2p if _is_p2p(entry) else group.ops
        if len(window) >= WINDOW:
            continue
        op = _op(entry, i + 1, len(window) < FRAMES_KEPT)
        if op is None:
            dump.skipped += 1
            continue
        window.appendleft(op)
        group.last_op_id = max(group.last_op_id, op.op_id)
        dump.states_known = dump.states_known or op.state in ("started", "completed") or op.backend == "nccl"
        if dump.last is None:
            dump.last, dump.last_group = op, group.name


def _pg_config(dump: Dump, config: Any) -> None:
    if not isinstance(config, dict):
        return
    for key, value in list(config.items())[:4096]:
        if not isinstance(value, dict):
            continue
        ranks = _ranks(value.get("ranks"))
        if ranks:
            dump.world_hint = max(dump.world_hint, max(ranks) + 1)
        # Gloo's recorder files every group under "" with the wrong ranks: only a named entry is membership.
        if isinstance(key, str) and key and ranks:
            dump.members[key] = ranks


def _ranks(text: Any) -> tuple[int, ...]:
    if isinstance(text, list):
        values: Any = text
    elif isinstance(text, str) and len(text) < 1 << 20:
        try:
            values = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return ()
    else:
        return ()
    if not isinstance(values, list | tuple) or not all(isinstance(r, int) and 0 <= r < 1 << 24 for r in values):
        return ()
    return tuple(values)


def _group(dump: Dump, entry: dict[str, Any]) -> Group | None:
    pg_name, desc, pg_id = op_group(entry)
    group = dump.groups.get(pg_name)
    if group is None:
        if len(dump.groups) >= MAX_GROUPS:
            return None
        group = dump.groups[pg_name] = Group(pg_name, desc, pg_id)
    return group


def _is_p2p(entry: dict[str, Any]) -> bool:
    flag = entry.get("is_p2p")
    if isinstance(flag, bool):
        return flag
    name = entry.get("profiling_name")
    return isinstance(name, str) and name.rpartition(":")[2].startswith(("send", "recv"))


def op_group(entry: dict[str, Any]) -> tuple[str, str, int]:
    pg = entry.get("process_group")
    name, desc = (str(pg[0])[:128], str(pg[1])[:128]) if isinstance(pg, list | tuple) and len(pg) == 2 else ("", "")
    pg_id = entry.get("pg_id")
    return name or str(pg_id), desc, pg_id if isinstance(pg_id, int) else -1


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sizes(value: Any) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(value, list | tuple):
        return None
    out = []
    for dims in value[:MAX_TENSORS]:
        if not isinstance(dims, list | tuple) or not all(_int(d) is not None for d in dims[:16]):
            return None
        out.append(tuple(dims[:16]))
    return tuple(out)


def _op(entry: Any, index: int, with_frames: bool) -> Op | None:
    if not isinstance(entry, dict):
        return None
    profiling = entry.get("profiling_name")
    record_id, seq, p2p_seq = (
        _int(entry.get("record_id")),
        _int(entry.get("collective_seq_id")),
        _int(entry.get("p2p_seq_id")),
    )
    if not isinstance(profiling, str) or record_id is None or seq is None or "process_group" not in entry:
        return None
    backend, _, name = profiling.partition(":")
    if not name:
        backend, name = "", profiling
    name = name.strip()[:128]
    peer = None
    if (m := _P2P.match(name)) is not None:
        # "send 0->1" is from 0 to 1, "recv 1<-0" into 1 from 0 (group ranks): the peer is the other one.
        kind, second = m.group(1), int(m.group(3))
        name, peer = kind, second
    elif " " in name:
        name = name.split(" ", 1)[0]
    is_p2p = entry.get("is_p2p")
    p2p = bool(is_p2p) if isinstance(is_p2p, bool) else name in ("send", "recv")
    in_sizes, out_sizes = _sizes(entry.get("input_sizes", [])), _sizes(entry.get("output_sizes", []))
    if in_sizes is None or out_sizes is None:
        return None
    dtypes = tuple(
        str(d)[:32]
        for d in [*entry.get("input_dtypes", ())[:MAX_TENSORS], *entry.get("output_dtypes", ())[:MAX_TENSORS]]
    )
    state = entry.get("state")
    frames: tuple[Frame, ...] = ()
    raw_frames = entry.get("frames")
    if with_frames and isinstance(raw_frames, list):
        frames = tuple(
            Frame(str(f.get("name", ""))[:200], str(f.get("filename", ""))[:300], _int(f.get("line")) or 0)
            for f in raw_frames[:MAX_FRAMES]
            if isinstance(f, dict)
        )
    return Op(
        record_id=record_id,
        index=index,
        seq=(p2p_seq or 0) if p2p else seq,
        op_id=_int(entry.get("op_id")) or 0,
        name=name,
        backend=backend[:16],
        p2p=p2p,
        peer=peer,
        in_sizes=in_sizes,
        out_sizes=out_sizes,
        dtypes=dtypes,
        state=state if state in ("scheduled", "started", "completed") else "scheduled",
        created_ns=_int(entry.get("time_created_ns")) or 0,
        timeout_ms=_int(entry.get("timeout_ms")),
        frames=frames,
    )
