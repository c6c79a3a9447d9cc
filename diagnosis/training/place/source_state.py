"""What one input has told so far that later lines of the same input depend on.

* torchrun's failure table (torch/distributed/elastic/multiprocessing/errors): each failed worker is
  an entry of indented fields, `host : node07`, `rank : 27 (local_rank: 3)`, `exitcode : -9 (pid:
  4242)`, `traceback : …`, closed by the next entry or the table's border. The entry binds host,
  global rank, local rank and pid together, and gives its place to the indented lines inside it that
  carry no place of their own (the exit code, the signal, the worker's traceback). A line of another
  process interleaved there, which names its own host or rank, keeps its own place.
* a message its printer splits over two lines by design (PRRTE's `… exited on` / `signal 9
  (Killed).`): the first line waits for the second.
* torchrun's agent stopping the workers still running after one failed (`Sending process P closing
  signal SIGTERM`, in local-rank order), then naming the failed one (`failed (exitcode: …) local_rank:
  N (pid: P)`): a roll call diagnosis/training/findings/workers.py turns into pids of local ranks.
* Python tracebacks: where each started and the exception line that ended it, so that an uncaught
  exception can count as a death of the process (diagnosis/training/findings/deaths.py); not one Python printed after
  `Exception ignored in:`, which it could not raise. Ranks dying together print their tracebacks
  interleaved (`[rank0]: Traceback …`, `[rank1]: Traceback …`, …, `[rank0]: KeyError …`), so one is
  open per printer (its rank, local rank, host, pid and task) and ends with that printer's exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpu_triage.diagnosis.training.input.log_lines import LogLine
from gpu_triage.diagnosis.training.place.facts import short_host

MAX_TRACEBACKS = 16  # per input: the first ones and the last one are what matter
MAX_OPEN = 64  # tracebacks open at once in one input: one per printer that is dying
MAX_ROLL = 1024  # workers one agent stops
MAX_ROLL_CALLS = 16  # per input
CONTINUE_WITHIN = 2  # lines between the two halves of a two-line message
_HOOKED = re.compile(r"\[rank\d{1,7}\]: Traceback")  # PyTorch 2.3+ prints uncaught exceptions so


# Who printed a line, as far as its prefixes say: (rank, local rank, host, pid, launcher task).
Printer = tuple[int | None, int | None, str | None, int | None, int | None]


def printer(line: LogLine) -> Printer:
    return line.rank, line.local_rank, short_host(line.host), line.pid, line.task


def _same_printer(a: Printer, b: Printer) -> bool:
    """Nothing tells them apart: each part is equal, or one of the two lines does not say it."""
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


@dataclass(slots=True)
class TableEntry:
    line: int
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class RollCall:
    """An agent's stop of its running workers (pids in local-rank order) and the worker that had failed."""

    pids: tuple[int, ...]
    failed_pid: int
    failed_local_rank: int


@dataclass(frozen=True, slots=True)
class Traceback:
    start: int  # the `Traceback (most recent call last):` line
    line: int  # the exception line that ends it
    text: str  # the exception line as read
    rank: int | None
    host: str | None
    local_rank: int | None
    task: int | None  # the launcher's task (diagnosis/training/place/identity.py)
    hooked: bool  # printed by PyTorch's excepthook (`[rankN]: Traceback`): uncaught for certain
    classified: bool = False  # its exception line is a finding of its own


@dataclass(slots=True)
class SourceState:
    index: int
    name: str | None
    entry: TableEntry | None = None
    continues: tuple[int, LogLine] | None = None
    open_tracebacks: dict[Printer, tuple[int, LogLine]] = field(default_factory=dict)
    ignored: tuple[int, Printer | None] = (-10, None)  # the last `Exception ignored in: …` and its printer
    tracebacks: list[Traceback] = field(default_factory=list)
    exit_reported: bool = False  # a launcher reported a process's end in this input
    stopping: list[int] = field(default_factory=list)  # pids the agent is stopping now
    roll_calls: list[RollCall] = field(default_factory=list)
    lines: int = 0  # set when the input ends

    # -- torchrun's failure table --------------------------------------------------------------

    def table_host(self, number: int, host: str) -> None:
        if self.entry is None or self.entry.host is not None or self.entry.rank is not None:
            self.entry = TableEntry(number)
        self.entry.host = short_host(host)

    def table_rank(self, number: int, rank: int, local_rank: int | None) -> None:
        if self.entry is None or self.entry.rank is not None:
            self.entry = TableEntry(number)
        self.entry.rank, self.entry.local_rank = rank, local_rank

    def table_end(self) -> None:
        self.entry = None

    def table_place(self, line: LogLine) -> TableEntry | None:
        """The open entry, when `line` is one of its indented lines without a place of its own (a
        launcher's `node07: ` prefix names the agent's host, which is the table's)."""
        entry = self.entry
        if entry is None or line.indent < 2 or line.rank is not None or line.pid is not None:
            return None
        if line.host is not None and entry.host is not None and short_host(line.host) != short_host(entry.host):
            return None
        return entry if line.local_rank is None else None

    # -- torchrun's agent stopping its workers -------------------------------------------------------

    def stop(self, pid: int) -> None:
        if len(self.stopping) < MAX_ROLL:
            self.stopping.append(pid)

    def failed(self, pid: int, local_rank: int) -> None:
        """The agent's report of the worker that failed: it closes the stop just before it."""
        if self.stopping and len(self.roll_calls) < MAX_ROLL_CALLS:
            self.roll_calls.append(RollCall(tuple(self.stopping), pid, local_rank))
        self.stopping = []

    # -- two-line messages ----------------------------------------------------------------------

    def joined(self, number: int, line: LogLine) -> tuple[int, str] | None:
        """(line, text) of the whole message when `line` is the second half of a waiting first one."""
        first = self.continues
        self.continues = None
        if first is None or not 0 < number - first[0] <= CONTINUE_WITHIN:
            return None
        return first[0], f"{first[1].text} {line.text}"

    # -- tracebacks -----------------------------------------------------------------------------

    def ignore(self, number: int, line: LogLine) -> None:
        self.ignored = (number, printer(line))

    def traceback(self, number: int, line: LogLine) -> None:
        key = printer(line)
        self.open_tracebacks.pop(key, None)  # a new traceback of that printer: the last one never ended
        # Python prints an exception it cannot raise (in __del__, at exit) after `Exception ignored in`:
        # that traceback kills nothing.
        at, by = self.ignored
        if number - at <= 2 and by is not None and _same_printer(by, key):
            return
        if len(self.open_tracebacks) >= MAX_OPEN:
            del self.open_tracebacks[next(iter(self.open_tracebacks))]  # the oldest
        self.open_tracebacks[key] = (number, line)

    def exception(self, number: int, line: LogLine, *, classified: bool = False) -> None:
        """`line` is an exception line: it ends its printer's open traceback, if there is one."""
        key = printer(line)
        found = key if key in self.open_tracebacks else None
        if found is None:
            # A printer that says less on one line than on another (`[rank0]:` before the exception but
            # not the header), as long as no other open traceback could be its own.
            alike = [k for k in self.open_tracebacks if _same_printer(k, key)]
            found = alike[0] if len(alike) == 1 else None
        if found is None:
            return
        start, head = self.open_tracebacks.pop(found)
        trace = Traceback(
            start,
            number,
            line.raw,
            head.rank if head.rank is not None else line.rank,
            head.host or line.host,
            head.local_rank if head.local_rank is not None else line.local_rank,
            head.task if head.task is not None else line.task,
            hooked=_HOOKED.search(head.raw) is not None,
            classified=classified,
        )
        if len(self.tracebacks) < MAX_TRACEBACKS:
            self.tracebacks.append(trace)
        else:
            self.tracebacks[-1] = trace  # keep the last one: an uncaught exception ends the output
