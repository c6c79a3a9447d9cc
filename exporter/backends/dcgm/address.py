"""Where the DCGM host engine listens, and a cheap check that something does.

`nv-hostengine` listens on TCP 127.0.0.1:5555 by default, or on a unix socket with `-d`
(/tmp/nv-hostengine). `--dcgm.address` takes `host[:port]` or `unix:///path`; without it, both defaults
are tried in that order.

The check connects a plain socket first: DCGM's own connect call retries every 50 ms until its
timeout when nothing listens, so asking it directly would hold a read worker for seconds per try.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 5555
_HOST_PORT = re.compile(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]/]+))(?::(?P<port>\d{1,5}))?")


@dataclass(frozen=True, slots=True)
class Address:
    host: str = "localhost"
    port: int = DEFAULT_PORT
    socket_path: Path | None = None

    @classmethod
    def parse(cls, text: str) -> Address:
        """`host`, `host:port`, `[v6]:port` or `unix:///path`; ValueError with an example otherwise."""
        text = text.strip()
        if text.startswith("unix://"):
            path = text.removeprefix("unix://")
            if not path.startswith("/"):
                raise ValueError(f"{text!r}: a unix socket address is unix:///absolute/path")
            return cls(socket_path=Path(path))
        m = _HOST_PORT.fullmatch(text)
        port = int(m["port"] or DEFAULT_PORT) if m else 0
        if m is None or not 0 < port < 65536:
            raise ValueError(
                f"{text!r} is not a host engine address (examples: localhost:5555, unix:///tmp/nv-hostengine)"
            )
        return cls(m["v6"] or m["host"], port)

    def __str__(self) -> str:
        if self.socket_path is not None:
            return f"unix://{self.socket_path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def for_dcgm(self) -> tuple[str, bool]:
        """(the address dcgmConnect_v2 takes, whether it is a unix socket)."""
        if self.socket_path is not None:
            return str(self.socket_path), True
        if self.host == "localhost":  # the host engine binds 127.0.0.1 by default, not ::1
            return f"127.0.0.1:{self.port}", False
        return str(self), False


def unreachable(address: Address, timeout: float = 0.5) -> str | None:
    """Why nothing answers at `address` ("connection refused"), or None when something accepts."""
    try:
        if address.socket_path is not None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(str(address.socket_path))
        else:
            socket.create_connection((address.host, address.port), timeout=timeout).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


# Where nv-hostengine listens unless told otherwise: TCP 127.0.0.1:5555, or its socket with `-d`.
DEFAULTS = (Address(), Address(socket_path=Path("/tmp/nv-hostengine")))


def answering(candidates: tuple[Address, ...]) -> tuple[Address | None, str]:
    """The first address something answers at; otherwise None and why not, for each."""
    problems = []
    for address in candidates:
        if (why := unreachable(address)) is None:
            return address, ""
        problems.append(f"{address} ({why})")
    return None, f"no DCGM host engine answers at {' or '.join(problems)}"
