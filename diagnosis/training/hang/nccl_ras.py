"""Reading NCCL's RAS report (`ncclras`, or `echo status | nc localhost 28028`; NCCL 2.24 and later).

Written from the format strings of NCCL's src/ras/client_support.cc (2.24.3 to 2.30). The text report
has a job summary, a table of communicators, then `Errors` and `Warnings` sections whose blocks name
the ranks that matter:

    DEAD                      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5
    #0-0 (cf264af53edbe986) INCOMPLETE    Missing communicator data from 1 rank
      Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213   (2.26+; 2.24: "The missing rank: 21")
    #0-0 (27a079b828ff1a75) MISMATCH      Communicator ranks have different [AllReduce ]collective operation counts
      26 ranks have launched up to operation 6650
      Rank 3 has launched up to operation 6649 -- GPU 3 managed by process 483075 on node 172.16.64.210

and `#x-y (hash) ERROR` blocks with `Rank N reported <error> -- GPU ...`. Only outliers are listed by
rank (at most a quarter of the communicator and ten ranks, unless `-v`). The JSON report (`-f json`,
2.28.7+) lists every rank with its `collective_counts` and the `missing_ranks`.

RAS numbers ranks within a communicator; for the world communicator that is the global rank. One
query cannot tell a hung rank from one that is catching up: RAS itself says to query again.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_RAS_BYTES", "RasRank", "RasReport", "is_ras", "parse_ras"]

MAX_RAS_BYTES = 16 << 20
_HEADER = re.compile(r"^#(\d+)-(\d+) \(([0-9a-f]{1,16})\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_GPU_OF = r"GPU (?P<gpu>\d+)(?: \(NVML (?P<nvml>\d+)\))? managed by process (?P<pid>\d+) on node (?P<host>\S+)"
_RANK_LINE = re.compile(
    r"^Rank (?P<rank>\d+)(?: has launched up to operation (?P<count>\d+)| has not launched any operations"
    r"| has status (?P<status>\w+)| reported (?P<error>[^-]+?))? -- (?:"
    + _GPU_OF
    + r"|\[process information not found\])$"
)
_GROUP = re.compile(
    r"^(?P<n>\d+) ranks have launched up to operation (?P<count>\d+)$|^(?P<z>\d+) ranks have not launched"
)
_MISSING_LIST = re.compile(r"^The missing ranks?: (?P<ranks>[\d,\- ]+)$")
_PROCESS = re.compile(r"^Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpus>[\d,]+)")
_TABLE_ROW = re.compile(r"^(?P<group>\d+)\s+\d+\s+\d+\s+[\d-]+\s+(?P<size>\d+)\s+\d+\s+[A-Z]+\s+[A-Z,]+$")
_COUNTS = re.compile(r"^Communicator ranks have different (?:(?P<op>\w+) )?(?:collective )?operation counts$")


@dataclass(frozen=True, slots=True)
class RasRank:
    rank: int | None
    comm: str  # "#0-0 (cf264af53edbe986)"
    host: str | None
    pid: int | None
    gpu: int | None
    why: str  # "missing", "dead", "behind", "error"
    count: int | None = None  # operations launched, for "behind"
    line: int = 0
    text: str = ""


@dataclass(slots=True)
class RasReport:
    source: str
    ranks: list[RasRank] = field(default_factory=list)
    dead: list[RasRank] = field(default_factory=list)  # processes, not ranks: RAS names them by pid
    comm_sizes: dict[str, int] = field(default_factory=dict)
    ahead: dict[str, int] = field(default_factory=dict)  # per communicator: the count most ranks reached
    form: str = "text"


def is_ras(head: bytes) -> bool:
    """Whether `head` (an input's first bytes) starts an ncclras report, text or JSON."""
    text = head[:4096]
    return (b"Job summary\n===" in text or b"\nCommunicators..." in text or text.startswith(b"Communicators...")) or (
        text.lstrip().startswith(b"{") and b'"nccl_version"' in text and b'"communicators' in text
    )


def parse_ras(source: str, data: bytes) -> RasReport:
    text = data[:MAX_RAS_BYTES].decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        return _parse_json(source, text)
    reader = _TextReader(RasReport(source))
    for number, raw in enumerate(text.splitlines(), 1):
        reader.line(number, raw.strip())
    return reader.finish()


class _TextReader:
    """The text report, line by line: which block a line is in decides what its ranks mean."""

    def __init__(self, report: RasReport) -> None:
        self.report = report
        self.comm = self.section = ""
        self.op: str | None = None  # the op of a count mismatch block ("AllReduce"; "" before 2.26)
        self.group_count: int | None = None
        self.counts: dict[tuple[str, str], Counter[int]] = {}  # (communicator, op) -> count -> ranks
        self.behind: list[tuple[str, RasRank]] = []
        self.sizes: dict[str, int] = {}  # communicator group -> ranks per communicator (the summary table)

    def line(self, number: int, line: str) -> None:
        report = self.report
        if line in ("Errors", "Warnings", "DEAD", "INCOMPLETE", "TIMEOUT"):
            self.section, self.comm = line, ""
        elif (m := _HEADER.match(line)) is not None:
            self.comm, self.section, self.op = f"#{m.group(1)}-{m.group(2)} ({m.group(3)})", m.group(4), None
            if m.group(1) in self.sizes:
                report.comm_sizes[self.comm] = self.sizes[m.group(1)]
        elif not self.section and (m := _TABLE_ROW.match(line)) is not None:
            self.sizes[m.group("group")] = int(m.group("size"))
        elif self.section == "DEAD" and (m := _PROCESS.match(line)) is not None:
            gpu = int(m.group("gpus").split(",")[0])
            report.dead.append(RasRank(None, "", m.group("host"), int(m.group("pid")), gpu, "dead", None, number, line))
        elif not self.comm:
            return
        elif (m := _MISSING_LIST.match(line)) is not None:
            for r in _numbers(m.group("ranks")):
                report.ranks.append(RasRank(r, self.comm, None, None, None, "missing", None, number, line))
        elif (m := _COUNTS.match(line)) is not None:
            self.op, self.group_count = m.group("op") or "", None
            self.counts[(self.comm, self.op)] = Counter()
        elif line.startswith("Communicator ranks have different status"):
            self.op = None
        elif self.op is not None and (m := _GROUP.match(line)) is not None:
            self.group_count = int(m.group("count")) if m.group("count") else 0
            self.counts[(self.comm, self.op)][self.group_count] += int(m.group("n") or m.group("z"))
        elif (m := _RANK_LINE.match(line)) is not None:
            self._rank_line(m, number, line)

    def _rank_line(self, m: re.Match[str], number: int, line: str) -> None:
        rank = _rank(m, self.comm, number, line)
        if self.section == "INCOMPLETE":
            self.report.ranks.append(_with(rank, "missing"))
        elif self.section == "ERROR":
            self.report.ranks.append(_with(rank, "error"))
        elif self.op is not None:
            alone = m.group("count") is not None or "not launched" in line  # "Rank N has launched up to ..."
            count = (int(m.group("count")) if m.group("count") else 0) if alone else self.group_count
            if count is not None:
                if alone:
                    self.counts[(self.comm, self.op)][count] += 1
                self.behind.append((self.op, _with(rank, "behind", count)))

    def finish(self) -> RasReport:
        for (comm, _), c in self.counts.items():
            if c:
                self.report.ahead[comm] = max(self.report.ahead.get(comm, 0), c.most_common(1)[0][0])
        top = {key: max(c) for key, c in self.counts.items() if c}
        for op, r in self.behind:
            if r.count is not None and r.count < top.get((r.comm, op), 0) and r not in self.report.ranks:
                self.report.ranks.append(r)
        return self.report


def _rank(m: re.Match[str], comm: str, number: int, line: str) -> RasRank:
    gpu, pid = m.group("gpu"), m.group("pid")
    return RasRank(
        int(m.group("rank")),
        comm,
        m.group("host"),
        int(pid) if pid else None,
        int(gpu) if gpu else None,
        "",
        None,
        number,
        line,
    )


def _with(rank: RasRank, why: str, count: int | None = None) -> RasRank:
    return RasRank(rank.rank, rank.comm, rank.host, rank.pid, rank.gpu, why, count, rank.line, rank.text)


def _numbers(text: str) -> list[int]:
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out.extend(range(int(lo), (int(hi) if hi.isdigit() else int(lo)) + 1))
        if len(out) > 65536:
            break
    return out


def _parse_json(source: str, text: str) -> RasReport:
    report = RasReport(source, form="json")
    try:
        raw: Any = json.loads(text)
    except ValueError:
        return report
    comms = raw.get("communicators") if isinstance(raw, dict) else None
    for i, c in enumerate(comms if isinstance(comms, list) else []):
        if not isinstance(c, dict):
            continue
        comm = f"#{i} ({str(c.get('hash', ''))[:20]})"
        if isinstance(c.get("size"), int):
            report.comm_sizes[comm] = c["size"]
        totals = {}
        for r in c.get("ranks") or []:
            if isinstance(r, dict) and isinstance(r.get("collective_counts"), dict) and isinstance(r.get("rank"), int):
                totals[r["rank"]] = (sum(v for v in r["collective_counts"].values() if isinstance(v, int)), r)
        if totals:
            common = Counter(t for t, _ in totals.values()).most_common(1)[0][0]
            report.ahead[comm] = common
            for rank, (total, r) in sorted(totals.items()):
                if total < common:
                    report.ranks.append(_json_rank(rank, comm, r, "behind", total))
        for r in c.get("missing_ranks") or []:
            if isinstance(r, dict) and isinstance(r.get("rank"), int):
                status = r["status"] if isinstance(r.get("status"), dict) else {}
                report.ranks.append(
                    _json_rank(r["rank"], comm, r, "dead" if status.get("considered_dead") else "missing")
                )
    return report


def _json_rank(rank: int, comm: str, r: dict[str, Any], why: str, count: int | None = None) -> RasRank:
    host, pid, gpu = r.get("host"), r.get("pid"), r.get("nvml_dev", r.get("cuda_dev"))
    return RasRank(
        rank,
        comm,
        str(host)[:128] if host is not None else None,
        pid if isinstance(pid, int) else None,
        gpu if isinstance(gpu, int) else None,
        why,
        count,
        0,
        f"{comm} rank {rank}: {why}" + (f" at operation {count}" if count is not None else ""),
    )
