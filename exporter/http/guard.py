"""What every request passes before the app sees it: a bounded body, and no forged writes.

`BodyLimit`: a body over its limit is refused with 413 from its Content-Length before a byte of it is
read, and a chunked one as soon as the count passes the limit; a body that does not arrive within the
read timeout is refused with 408. JSON bodies are read here, whole and bounded, before the app runs;
the routes that stream their body (a log to diagnose) count and time it themselves.

`WriteGuard`: requests that change state (any method but GET, HEAD and OPTIONS) are refused when they
name a host that is not this daemon's (DNS rebinding: a page whose name was made to resolve to the node
would otherwise be "same-origin" with it), when they come from another origin (a page in an operator's
browser must not be able to acknowledge a GPU), when their body is not JSON (an HTML form or a simple
cross-site POST cannot send application/json), and always with --web.read-only. Basic auth, where the web
config defines users, comes before both.

`HeadAsGet`: HEAD is answered as GET is, without the body (probes and load balancers that use HEAD).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from gpu_triage.exporter.http.asgi import App, Message, Receive, Scope, Send, header
from gpu_triage.exporter.http.errors import refuse
from gpu_triage.exporter.settings import parse_listen_address

JSON_BODY_LIMIT = 16 * 1024  # the largest JSON the API takes is a fault with a 1024-character message
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _size(limit: int) -> str:
    return f"{limit / 1024:g} KiB" if limit < 2**20 else f"{limit / 2**20:g} MiB"


class _TooLargeError(Exception):
    pass


class _GoneError(Exception):
    """The client hung up before its body arrived."""


class BodyLimit:
    def __init__(self, app: App, *, timeout: float, streamed: Mapping[str, tuple[int, str]]) -> None:
        """`streamed`: path -> (limit, what to tell a client over it) for routes that read their own body."""
        self.app = app
        self.timeout = timeout
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, hint = self.streamed.get(scope["path"], (JSON_BODY_LIMIT, ""))
        over = f"the body is over the {_size(limit)} limit{hint}"
        declared = header(scope, b"content-length")
        chunked = header(scope, b"transfer-encoding") is not None
        if declared is not None:
            if not declared.isdigit():
                await refuse(send, 400, "Content-Length is not a number", close=True)
                return
            if int(declared) > limit:
                await refuse(send, 413, over, close=True)
                return
        if scope["path"] in self.streamed or (not chunked and declared in (None, b"0")):
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await _read(receive, limit)
        except TimeoutError:
            await refuse(send, 408, f"the body did not arrive within {self.timeout:g}s", close=True)
            return
        except _TooLargeError:
            await refuse(send, 413, over, close=True)
            return
        except _GoneError:
            return
        await self.app(scope, _replay(body, receive), send)


async def _read(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _GoneError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLargeError
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then whatever the server says next (a disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class HeadAsGet:
    """HEAD runs the GET route: the same status and headers (Content-Length included), and no body, which
    the HTTP server leaves out of a HEAD answer itself. Without it every route answers HEAD with 405, and a
    probe or load balancer that checks /healthz with HEAD takes the daemon for broken."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


def own_host_names(listen_addresses: Iterable[str], allowed: Iterable[str]) -> frozenset[str]:
    """The names a request that changes state may give in its Host header, besides an IP address and
    localhost: the host names among the listen addresses, this machine's name, and --web.allowed-hosts."""
    names = {socket.gethostname()}
    names |= {parse_listen_address(a)[0] for a in listen_addresses}
    names |= set(allowed)
    names |= {n.partition(".")[0] for n in names if not _is_ip(n)}  # node1 as well as node1.example.com
    return frozenset(n.lower().rstrip(".") for n in names if n and not _is_ip(n))


class WriteGuard:
    def __init__(
        self, app: App, *, read_only: bool, not_writes: frozenset[str], host_names: frozenset[str] = frozenset()
    ) -> None:
        """`not_writes`: paths whose unsafe methods change nothing (a log to diagnose): no JSON needed,
        allowed when read-only, but still same-origin only. `host_names`: own_host_names()."""
        self.app = app
        self.read_only = read_only
        self.not_writes = not_writes
        self.host_names = host_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        problem = _foreign_host(scope, self.host_names)
        if problem is not None:
            await refuse(send, 421, problem, close=True)
            return
        problem = _cross_origin(scope)
        if problem is not None:
            await refuse(send, 403, problem, close=True)
            return
        if scope["path"] not in self.not_writes:
            if self.read_only:
                await refuse(send, 403, "this daemon is read-only (--web.read-only): nothing can be changed here")
                return
            problem = _not_json(scope)
            if problem is not None:
                await refuse(send, 415, problem, close=True)
                return
        await self.app(scope, receive, send)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _host_name(value: str) -> str:
    """`node1:9481` -> `node1`, `[::1]:9481` -> `::1`, lower case, without a trailing dot."""
    if value.startswith("["):
        name = value[1:].partition("]")[0]
    else:
        name, colon, port = value.rpartition(":")
        if not colon or not port.isdigit():
            name = value
    return name.strip().lower().rstrip(".")


def _foreign_host(scope: Scope, names: frozenset[str]) -> str | None:
    """Why the Host of a request that changes state is not this daemon, if it is not.

    DNS rebinding: a page on attacker.example whose name is then made to resolve to 127.0.0.1 is, to the
    browser, same-origin with whatever answers there, Origin and Sec-Fetch-Site included; only the name it
    still sends in Host gives it away. An IP address cannot be rebound, and localhost names resolve to the
    machine itself in every browser. A request without Host (HTTP/1.0) comes from no browser."""
    raw = header(scope, b"host")
    if raw is None:
        return None
    name = _host_name(raw.decode("latin-1"))
    if _is_ip(name) or name == "localhost" or name.endswith(".localhost") or name in names:
        return None
    shown = raw.decode("latin-1")[:100]
    return (
        f"Host {shown!r} is not a name of this daemon: requests that change state must name it by an IP address, "
        "localhost, its host name or a name given with --web.allowed-hosts"
    )


def _cross_origin(scope: Scope) -> str | None:
    """Why a request that changes state looks like it came from another site's page, if it does.

    Browsers send Sec-Fetch-Site (same-origin, same-site, cross-site, none) and Origin on every POST and
    DELETE; curl, Prometheus and scripts send neither, and pass."""
    site = header(scope, b"sec-fetch-site")
    if site is not None and site not in (b"same-origin", b"none"):
        return f"cross-origin request refused (Sec-Fetch-Site: {site.decode(errors='replace')[:40]})"
    origin = header(scope, b"origin")
    if origin is None:
        return None
    host = header(scope, b"host")
    try:
        where = urlsplit(origin.decode("ascii")).netloc
    except (UnicodeDecodeError, ValueError):
        where = ""
    if not where or host is None or where.lower() != host.decode("latin-1").lower():
        return f"cross-origin request refused (Origin: {origin.decode(errors='replace')[:100]})"
    return None


def _not_json(scope: Scope) -> str | None:
    """Why the body is not one a write accepts: JSON, or none at all (`curl -XPOST .../acknowledge`)."""
    kind = header(scope, b"content-type")
    if kind is None:
        has_body = header(scope, b"transfer-encoding") is not None or header(scope, b"content-length") not in (
            None,
            b"0",
        )
        return "a body needs Content-Type: application/json" if has_body else None
    if kind.split(b";")[0].strip().lower() != b"application/json":
        shown = kind.decode(errors="replace")[:100]
        return f"Content-Type {shown} is not accepted here: send application/json (-H 'content-type: application/json')"
    return None
