"""The header a platform puts before a log line: when it was logged and, for syslog and the journal, on which host.

One parser for every reader of raw lines: `log_lines.normalise` takes the host and a comparable
`Stamp` from it, the kernel-log parser the timestamp as printed (`Header.printed`). The shapes, with
an optional `<N>` syslog priority in front of any of them:

* syslog and the journal, `<stamp> <host> <ident>[<pid>]: <message>`, where the stamp is any of
  RFC 3164's `May  1 12:00:00` (rsyslog's traditional format, `journalctl`'s default `short`; the
  month in the locale's words), `journalctl -o short-precise`'s `May 01 12:00:00.123456`, RFC 3339
  with a numeric offset (`journalctl -o short-iso` and `short-iso-precise`, rsyslog's
  RSYSLOG_FileFormat, syslog-ng's ISO dates), `journalctl -o short-full`'s `Wed 2024-05-01 12:00:00
  UTC` and `short-unix`'s `1714564800.123456`;
* a container runtime's or `kubectl --timestamps`' RFC 3339 stamp (`2024-05-01T12:00:00.123456789Z`,
  with CRI's `stdout F` after it), also `dmesg --time-format=iso`'s (`2024-05-01T12:00:00,123456+0000`);
  no host: what follows is the program's own output, in which `Epoch 1: ` is not a host and ident;
* `dmesg`'s seconds since boot (`[ 8841.123981]`) and `dmesg -T`'s `[Wed May  1 14:03:10 2024]`;
  no host: after them come the kernel's own `driver device: ` prefixes (`usb 1-1: `);
* a /dev/kmsg record (`4,4821,2500000000,-;`: priority, sequence, microseconds since boot, flags).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

_MONTHS = {
    m: i
    for i, m in enumerate(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], start=1)
}
_HMS = r"(?P<hms>\d{2}:\d{2}:\d{2})"
_DATE = r"(?P<date>\d{4}-\d{2}-\d{2})"

_PRIORITY = re.compile(r"<(?P<pri>\d{1,3})>")
# syslog's `host ident[pid]: ` after the stamp (`node07 kernel: `, `node07 python3[4242]: `).
_SENDER = re.compile(r"(?P<host>[\w.-]{1,253}) (?P<ident>[\w./-]{1,64})(?:\[\d{1,10}\])?: ")
_SYSLOG = (
    re.compile(r"(?P<printed>(?P<mon>\S{1,12}) {1,2}(?P<day>\d{1,2}) " + _HMS + r"(?:\.(?P<frac>\d{1,9}))?) "),
    re.compile(r"(?P<printed>" + _DATE + "[T ]" + _HMS + r"(?:\.(?P<frac>\d{1,9}))?(?P<tz>[+-]\d{2}:?\d{2})) "),
    re.compile(
        r"(?P<printed>[^\W\d_]{2,12}\.? " + _DATE + " " + _HMS + r"(?:\.(?P<frac>\d{1,9}))?"
        r" (?P<zone>[A-Za-z]{1,6}|[+-]\d{4})) "
    ),
    re.compile(r"(?P<printed>(?P<epoch>\d{9,11})\.(?P<frac>\d{1,9})) "),
)
_ISO = re.compile(
    r"(?P<printed>" + _DATE + "T" + _HMS + r"(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?)"
    r"(?: (?:stdout|stderr) [FP])? "
)
_DMESG_T = re.compile(
    r"\[(?P<printed>\S{1,12} {1,2}(?P<mon>\S{1,12}) {1,2}(?P<day>\d{1,2}) " + _HMS + r" (?P<year>\d{4}))\] ?"
)
_DMESG = re.compile(r"\[ {0,12}(?P<printed>\d{1,12}\.\d{1,9})\] ?")
_KMSG = re.compile(r"(?P<pri>\d{1,10}),\d{1,20},(?P<printed>\d{1,20}),[^;]{0,32};")


class Stamp(NamedTuple):
    """A timestamp as far as the line tells it.

    `kind` says what can be compared: "abs" (seconds since the epoch, UTC when no zone is given),
    "md" (month, day and time without a year: glog and syslog), "uptime" (dmesg seconds since boot).
    Two stamps order each other only when their kinds are equal.
    """

    kind: str
    value: float


@dataclass(frozen=True, slots=True)
class Header:
    kind: str  # "syslog", "iso", "dmesg" or "kmsg": a line may carry one of each (a pod's stamp, then syslog's)
    end: int  # where the message (or the next prefix) starts
    printed: str  # the timestamp as printed
    stamp: Stamp | None
    host: str | None = None
    ident: str | None = None  # syslog's: the program that logged the line (`kernel` for the kernel)
    priority: int | None = None  # syslog's `<N>` or a kmsg record's: facility * 8 + level


def _seconds(hms: str, frac: str | None) -> float:
    h, m, s = (int(part) for part in hms.split(":"))
    return h * 3600 + m * 60 + s + (int(frac[:6]) / 10 ** len(frac[:6]) if frac else 0.0)


def abs_stamp(date: str, hms: str, frac: str | None, tz: str | None) -> Stamp | None:
    """An ISO date and time (and zone offset, UTC without one) as seconds since the epoch."""
    text = f"{date}T{hms}"
    if tz and tz != "Z":
        text += tz if ":" in tz else f"{tz[:3]}:{tz[3:]}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:  # 2024-13-45 and friends: not a time after all
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Stamp("abs", moment.timestamp() + _seconds("00:00:00", frac))


# Days before each month in a leap year, so that 29 February has a place too.
_DAYS_BEFORE = (0, 31, 60, 91, 121, 152, 182, 213, 244, 274, 305, 335)


def md_stamp(month: int, day: int, hms: str, frac: str | None) -> Stamp:
    # No year: seconds into a year, so differences hold across a month's end; a year's end goes backwards.
    return Stamp("md", ((_DAYS_BEFORE[(month - 1) % 12] + day - 1) * 86400) + _seconds(hms, frac))


def _syslog_stamp(m: re.Match[str]) -> Stamp | None:
    groups = m.groupdict()
    if groups.get("epoch"):
        return Stamp("abs", float(m["printed"]))
    if groups.get("date"):
        zone = groups.get("zone")
        tz = groups.get("tz") or (zone if zone and zone[0] in "+-" else None)
        return abs_stamp(m["date"], m["hms"], m["frac"], tz)  # a zone's name is read as UTC
    month = _MONTHS.get(m["mon"])
    return md_stamp(month, int(m["day"]), m["hms"], m["frac"]) if month else None


def header(text: str) -> Header | None:
    """The platform's header at the start of `text`, or None."""
    pri = _PRIORITY.match(text)
    start = pri.end() if pri else 0
    priority = int(pri["pri"]) if pri else None
    for pattern in _SYSLOG:
        if (m := pattern.match(text, start)) and (sender := _SENDER.match(text, m.end())):
            stamp = _syslog_stamp(m)
            return Header("syslog", sender.end(), m["printed"], stamp, sender["host"], sender["ident"], priority)
    if m := _ISO.match(text, start):
        stamp = abs_stamp(m["date"], m["hms"], m["frac"], m["tz"])
        return Header("iso", m.end(), m["printed"], stamp, priority=priority)
    if m := _DMESG.match(text, start):
        return Header("dmesg", m.end(), m["printed"], Stamp("uptime", float(m["printed"])), priority=priority)
    if m := _DMESG_T.match(text, start):
        month = _MONTHS.get(m["mon"])
        date = f"{m['year']}-{month:02d}-{int(m['day']):02d}" if month else None
        stamp = abs_stamp(date, m["hms"], None, None) if date else None
        return Header("dmesg", m.end(), m["printed"], stamp, priority=priority)
    if m := _KMSG.match(text, start):
        stamp = Stamp("uptime", int(m["printed"]) / 1e6)
        return Header("kmsg", m.end(), m["printed"], stamp, priority=int(m["pri"]) if pri is None else priority)
    return None


def printed_stamp(prefix: str) -> str | None:
    """The timestamp at the start of `prefix` (what a kernel line carries before `NVRM:`), as printed."""
    prefix = prefix.lstrip(" ")
    found = header(prefix)
    if found is not None:
        return found.printed
    pri = _PRIORITY.match(prefix)
    for pattern in _SYSLOG:  # a syslog stamp without the sender after it
        if m := pattern.match(prefix, pri.end() if pri else 0):
            return m["printed"]
    return None
