"""One raw log line in, the message and who printed it out.

Training logs reach us wrapped in up to four layers of prefixes, outermost first:

* a container runtime's or `kubectl --timestamps` stamp (`2024-05-01T12:00:00.123456789Z stdout F …`),
  a syslog / journald or `dmesg` stamp for kernel lines;
* a launcher's or aggregator's tag: `kubectl logs --prefix` (`[pod/trainer-0/pytorch] `), pdsh and
  DeepSpeed's multi-node runner (`node07: `), Open MPI `--tag-output` (`[1,3]<stdout>:`, the MPI rank)
  and Slurm `srun --label` (`3: …`), which number the launcher's tasks (a task is one rank, or one
  node's torchrun: diagnosis/training/place/identity.py decides), torchrun (`[default3]:` = role + local
  rank, `[rank3]:` = global rank; both may be stacked), Lightning (`[rank: 3] `), Ray
  (`(RayWorker pid=4242, ip=10.0.0.3) `);
* the printer's own header: PyTorch/glog (`[E501 12:00:00.123456 4242 ProcessGroupNCCL.cpp:1595]`,
  or without brackets, also torch._logging's `W0314 12:34:56.789000 1234 torch/…/api.py:858]`),
  Python logging (`ERROR:torch.distributed…:`, `[INFO] `, timestamps), NCCL's `host:pid:tid [cudaDev]`;
* PyTorch's process-group tag inside the message (`[PG ID 0 PG GUID 0(default_pg) Rank 3]`).

`normalise` peels them off in a loop and keeps what they say about the line: rank, local rank,
launcher task, host, pid, CUDA device, process group and the first timestamp. Rules then match the bare message, so
one signature serves every launcher. Everything here is bounded and never raises on odd input: a
line cut mid-way simply keeps whatever prefix it still has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpu_triage.diagnosis.core.line_scan import ANSI
from gpu_triage.diagnosis.core.log_stamps import Stamp, abs_stamp, header, md_stamp

_ANSI = re.compile(ANSI.pattern.decode())  # line_scan's, for text

# Python logging's and DeepSpeed's date and time (`[2024-05-01 12:00:00,123] `, `2024-05-01 12:00:00,123 - `).
_ISO = re.compile(
    r"\[?(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<hms>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})?\]?(?: {1,4}- {1,4}| {1,4}|$)"
)
_SLURM = re.compile(r" {0,6}(?P<task>\d{1,6}): ")
_TORCHRUN = re.compile(r"\[(?P<role>[A-Za-z_][\w-]{0,30}?)(?P<n>\d{1,6})\]: ?|\[rank: (?P<lightning>\d{1,6})\] ")
_OMPI = re.compile(r"\[(?:\d{1,10},)?(?P<vpid>\d{1,7})\](?:\[[^\]:\s]{1,255}:\d{1,10}\])?<std(?:out|err)>: ?")
_KUBECTL = re.compile(r"\[pod/(?P<pod>[a-z0-9.-]{1,253})/[a-z0-9-]{1,63}\] ")
_RAY = re.compile(r"\([\w.<>]{1,128} pid=(?P<pid>\d{1,10})(?:, ip=(?P<ip>[\d.]{7,15}))?\) ")
# The printers that put the host and pid in brackets: UCX's log (`[1700000000.123456] [node1:12345:0] `,
# src/ucs/debug/log.c, the thread a number or a name), its fatal-error lines (`[node1:12345:0:12345] `),
# and Open MPI's error-signal handler (`[node1:12345] `, opal/util/stacktrace.c).
_HOST_PID = re.compile(
    r"(?:\[\d{9,11}\.\d{6}\] {1,4})?\[(?P<host>[A-Za-z0-9][\w.-]{0,252}):(?P<pid>\d{1,10}) {0,4}"
    r"(?::[\w-]{1,32}(?::\d{1,10})?)?\] {1,24}"
)
# pdsh and DeepSpeed's runner put `host: ` first. A word before `: ` is taken for a host only when it
# looks like one (lower case with a digit or a dash, or an IPv4 address), so that `RuntimeError: ` or
# `srun: ` stay part of the message, and so does the NVSwitch driver's device name (`nvidia-nvswitch2: SXid …`).
_PDSH = re.compile(r"(?P<host>[a-z][a-z0-9-]{0,62}(?:\.[a-z0-9-]{1,63}){0,8}|\d{1,3}(?:\.\d{1,3}){3}): ")
_NOT_HOSTS = re.compile(
    r"python[\d.]{0,5}|[\w.-]{1,200}\.(?:sh|py|log|txt|out)|line|error|warning|nvidia-nvswitch\d{1,4}"
)
_PY_LEVEL = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]{1,128}:|\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] "
    r"|[\w.]{1,128}: \[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] "
)
_DS_WHERE = re.compile(r"\[[\w.-]{1,64}:\d{1,6}:\w{1,64}\] ")  # DeepSpeed's logger: [file:line:function]
# glog / c10 (`[E0501 12:00:00.123 4242 file.cpp:12] `, month not zero-padded: `E709`) and
# torch._logging 2.3+ (`W0314 12:34:56.789000 139981234567808 torch/distributed/…/api.py:858] `).
_GLOG = re.compile(
    r"\[?(?P<lvl>[IWEFCVD])(?P<md>\d{3,4})? ?(?P<hms>\d{2}:\d{2}:\d{2}\.\d{1,9})? {0,4}(?:\d{1,20} )?"
    r"[\w./-]{1,200}:\d{1,6}\] ?"
)
_NCCL = re.compile(r"(?P<host>[\w.-]{1,253}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>-?\d{1,4})\] ")
_PG_TAG = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d{1,6})[^\]\[]{0,80}? )?Rank (?P<rank>\d{1,6})\]")

_TAG_WINDOW = 400  # the PG/rank tag sits near the start of the message; don't scan a long line for it


@dataclass(frozen=True, slots=True)
class LogLine:
    text: str  # the message with every recognised prefix removed
    raw: str  # the line without colour codes and line-end characters
    rank: int | None = None  # global rank
    local_rank: int | None = None
    task: int | None = None  # srun --label's task, Open MPI's rank: a global rank only when a task is one rank
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None  # CUDA device index as the process saw it (NCCL's `[N]`)
    pg: str | None = None  # PyTorch process-group id
    stamp: Stamp | None = None
    indent: int = 0  # blanks before the message once the prefixes are off (a table's fields are indented)
    pod: str | None = None  # the pod `kubectl logs --prefix` names (`host` is NCCL's hostname when it says one)


def clean(raw: str) -> str:
    """`raw` without ANSI escapes, trailing CR/LF and NUL bytes."""
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    if "\x00" in raw:
        raw = raw.replace("\x00", "")
    return raw.rstrip("\r\n")


def _glog_stamp(md: str | None, hms: str | None) -> Stamp | None:
    if md is None or hms is None:
        return None
    whole, _, frac = hms.partition(".")
    return md_stamp(int(md[:-2]), int(md[-2:]), whole, frac or None)


@dataclass(slots=True)
class _Fields:
    rank: int | None = None
    local_rank: int | None = None
    task: int | None = None
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    pg: str | None = None
    stamp: Stamp | None = None
    indent: int = 0
    pod: str | None = None

    def stamp_once(self, stamp: Stamp | None) -> None:
        if self.stamp is None:
            self.stamp = stamp


def _looks_like_host(word: str) -> bool:
    if _NOT_HOSTS.fullmatch(word):
        return False
    return word[0].isdigit() or any(c.isdigit() or c == "-" for c in word)


def _strip_one(text: str, f: _Fields, seen: set[str]) -> str | None:
    """Remove one prefix from `text`, recording what it says; None when no prefix is left."""
    rest = _strip_outer(text, f, seen)
    return rest if rest is not None else _strip_inner(text, f, seen)


def _strip_outer(text: str, f: _Fields, seen: set[str]) -> str | None:
    """Runtimes', aggregators' and launchers' prefixes."""
    if (h := header(text)) is not None and h.kind not in seen:
        seen.add(h.kind)
        f.host = f.host or h.host
        f.stamp_once(h.stamp)
        return text[h.end :]
    if "kubectl" not in seen and (m := _KUBECTL.match(text)):
        seen.add("kubectl")
        f.host = f.host or m["pod"]
        f.pod = m["pod"]
        return text[m.end() :]
    if "ompi" not in seen and (m := _OMPI.match(text)):
        seen.add("ompi")
        f.task = int(m["vpid"])  # the MPI rank: a process of the job, a rank only if each process is one
        return text[m.end() :]
    if "ray" not in seen and (m := _RAY.match(text)):
        seen.add("ray")
        f.pid = int(m["pid"])
        f.host = f.host or m["ip"]
        return text[m.end() :]
    if "host_pid" not in seen and (m := _HOST_PID.match(text)):
        seen.add("host_pid")
        f.host = f.host or m["host"]
        f.pid = f.pid or int(m["pid"])
        return text[m.end() :]
    if "slurm" not in seen and (m := _SLURM.match(text)):
        seen.add("slurm")
        f.task = int(m["task"])
        return text[m.end() :]
    return None


def _strip_inner(text: str, f: _Fields, seen: set[str]) -> str | None:
    """torchrun's tags, and the printers' own headers."""
    if (m := _TORCHRUN.match(text)) is not None:
        # `[rank3]:` is PyTorch's global rank (so is Lightning's `[rank: 3]`); any other role name
        # numbers the local rank.
        if m["lightning"] is not None:
            f.rank = int(m["lightning"])
        elif m["role"] == "rank":
            f.rank = int(m["n"])
        else:
            # torchrun's tee writes the line right after the tag: a blank there is the line's own.
            f.local_rank = int(m["n"])
            return text[m.end() :] if text[m.end() - 1] == ":" else text[m.end() - 1 :]
        return text[m.end() :]
    if "pdsh" not in seen and (m := _PDSH.match(text)) and _looks_like_host(m["host"]):
        seen.add("pdsh")
        f.host = f.host or m["host"]
        return text[m.end() :]
    if "level" not in seen and (m := _PY_LEVEL.match(text)):
        seen.add("level")
        return text[m.end() :]
    if "where" not in seen and (m := _DS_WHERE.match(text)):
        seen.add("where")
        return text[m.end() :]
    if "glog" not in seen and (m := _GLOG.match(text)):
        seen.add("glog")
        f.stamp_once(_glog_stamp(m["md"], m["hms"]))
        return text[m.end() :]
    if "logging" not in seen and (m := _ISO.match(text)):
        seen.add("logging")
        f.stamp_once(abs_stamp(m["date"], m["hms"], m["frac"], m["tz"]))
        return text[m.end() :]
    if "nccl" not in seen and (m := _NCCL.match(text)):
        seen.add("nccl")
        f.host = m["host"]
        f.pid = int(m["pid"])
        dev = int(m["dev"])
        f.cuda_dev = dev if dev >= 0 else None
        return text[m.end() :]
    return None


def has_prefix(raw: str) -> bool:
    """Whether `raw` starts with a prefix `normalise` would take off (a launcher's, a runtime's, a logger's)."""
    text = clean(raw).lstrip()
    return _strip_one(text, _Fields(), set()) is not None


def normalise(raw: str) -> LogLine:
    """Split `raw` into the bare message and the identity its prefixes carry."""
    cleaned = clean(raw)
    f = _Fields()
    seen: set[str] = set()
    text = cleaned.lstrip()
    # Each prefix kind is taken once (torchrun tags may stack), so the loop is bounded.
    for _ in range(16):
        rest = _strip_one(text, f, seen)
        if rest is None:
            break
        text = rest.lstrip()
        f.indent = len(rest) - len(text)
    if not seen and f.rank is None and f.local_rank is None:
        f.indent = len(cleaned) - len(cleaned.lstrip())
    tag = _PG_TAG.search(text, 0, _TAG_WINDOW)
    if tag is not None:
        f.pg = tag["pg"]
        # `[Rank N]` numbers the rank in its process group: the global rank only in the default one.
        if f.rank is None and tag["pg"] in (None, "0"):
            f.rank = int(tag["rank"])
    return LogLine(
        text=text.rstrip(),
        raw=cleaned,
        rank=f.rank,
        local_rank=f.local_rank,
        task=f.task,
        host=f.host,
        pid=f.pid,
        cuda_dev=f.cuda_dev,
        pg=f.pg,
        stamp=f.stamp,
        indent=f.indent,
        pod=f.pod,
    )
