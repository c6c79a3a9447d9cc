"""--web.config.file: TLS and basic auth, in the file format every Prometheus exporter reads.

The format is the exporter-toolkit's (`tls_server_config`, `basic_auth_users` with bcrypt hashes,
`http_server_config.headers`), so one file serves node_exporter, Prometheus and gpu-triage alike, and
`promtool check web-config` checks it. It is read strictly at start: an unknown key, a missing
certificate or a bad hash stops the daemon with every problem listed, rather than serving in clear
text by mistake.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import ssl
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_triage.exporter.http.asgi import App, Message, Receive, Scope, Send, header
from gpu_triage.exporter.http.errors import refuse

_TOP = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_HEADERS = {
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
}


@functools.cache
def _dummy_hash(rounds: int) -> bytes:
    """Checked against for unknown users, so a wrong user name costs the same time as a wrong password:
    made at the cost of the dearest configured hash (a cheaper one would tell the names apart).

    bcrypt is imported here and in _password_ok: only a daemon with basic_auth_users loads it, at start (the
    checker makes this hash then)."""
    import bcrypt

    return bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=rounds))


def _cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash, `$2b$<cost>$...` (checked by load_web_config)."""
    return int(hashed[4:6])


class WebConfigError(Exception):
    def __init__(self, path: Path, problems: list[str]) -> None:
        super().__init__(f"web config file {path}: " + "; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Tls:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version, context.maximum_version = self.min_version, self.max_version
        context.load_cert_chain(self.cert_file, self.key_file)
        context.verify_mode = self.client_auth
        if self.client_ca_file is not None:
            context.load_verify_locations(self.client_ca_file)
        return context


@dataclass(frozen=True, slots=True)
class WebConfig:
    tls: Tls | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)


def load_web_config(path: Path) -> WebConfig:
    problems: list[str] = []
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise WebConfigError(path, [f"cannot read it: {e}"]) from e
    if not isinstance(doc, dict):
        raise WebConfigError(path, ["must be a YAML mapping"])
    problems += [f"unknown key {k!r}" for k in doc if k not in _TOP]
    tls = _tls(doc.get("tls_server_config"), path.parent, problems)
    users = _users(doc.get("basic_auth_users"), problems)
    headers = _headers(doc.get("http_server_config"), problems)
    if problems:
        raise WebConfigError(path, problems)
    return WebConfig(tls, users, headers)


def _tls(section: Any, base: Path, problems: list[str]) -> Tls | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        problems.append("tls_server_config must be a mapping")
        return None
    problems += [f"tls_server_config: unknown key {k!r}" for k in section if k not in _TLS]
    files = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        if section.get(key):
            file = base / str(section[key])  # relative paths are relative to the config file
            if not file.is_file():
                problems.append(f"tls_server_config.{key}: {file} does not exist")
            files[key] = file
    for key in ("cert_file", "key_file"):
        if key not in files:
            problems.append(f"tls_server_config.{key} is required")
    auth = section.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        problems.append(f"tls_server_config.client_auth_type {auth!r} is not one of {sorted(_CLIENT_AUTH)}")
    if _CLIENT_AUTH.get(auth, ssl.CERT_NONE) != ssl.CERT_NONE and "client_ca_file" not in files:
        problems.append(f"tls_server_config.client_auth_type {auth} needs client_ca_file")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = section.get(key, default)
        if name not in _VERSIONS:
            problems.append(f"tls_server_config.{key} {name!r} is not one of {sorted(_VERSIONS)}")
        versions[key] = _VERSIONS.get(name, _VERSIONS[default])
    if problems or "cert_file" not in files or "key_file" not in files:
        return None
    tls = Tls(
        files["cert_file"],
        files["key_file"],
        _CLIENT_AUTH[auth],
        files.get("client_ca_file"),
        versions["min_version"],
        versions["max_version"],
    )
    try:
        tls.context()
    except (OSError, ssl.SSLError) as e:
        problems.append(f"tls_server_config: the certificate and key do not load: {e}")
        return None
    return tls


def _users(section: Any, problems: list[str]) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        problems.append("basic_auth_users must be a mapping of user names to bcrypt hashes")
        return {}
    users = {}
    for user, hashed in section.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
            problems.append(f"basic_auth_users.{user}: not a bcrypt hash (htpasswd -nBC 10 \"\" | tr -d ':\\n')")
            continue
        users[str(user)] = text.encode()
    return users


def _headers(section: Any, problems: list[str]) -> dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        problems.append("http_server_config must be a mapping")
        return {}
    problems += [f"http_server_config: unknown key {k!r}" for k in section if k not in {"headers", "http2"}]
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        problems.append("http_server_config.headers must be a mapping")
        return {}
    problems += [f"http_server_config.headers: {k!r} cannot be set here" for k in headers if k not in _HEADERS]
    return {str(k): str(v) for k, v in headers.items() if k in _HEADERS}


_RETRY = (b"retry-after", b"1")
_CHALLENGE = (b"www-authenticate", b'Basic realm="gpu-triage"')


def _password_ok(hashed: bytes, password: bytes) -> bool:
    import bcrypt

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # longer than bcrypt's 72 bytes: not a password we issued
        return False


class _Lane:
    """Password checks on a thread of their own, so many at most, so many from one client address."""

    def __init__(self, name: str, limit: int, per_client: int) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)  # bcrypt lets go of the GIL while it hashes
        self.limit = limit
        self.per_client = per_client
        self.pending = 0
        self.by_client: dict[str, int] = {}

    def has_room(self, client: str) -> bool:
        return self.pending < self.limit and self.by_client.get(client, 0) < self.per_client

    async def run(self, client: str, hashed: bytes, password: bytes) -> bool:
        self.pending += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, _password_ok, hashed, password)
        finally:
            self.pending -= 1
            self.by_client[client] -= 1
            if not self.by_client[client]:
                del self.by_client[client]


class PasswordChecks:
    """bcrypt is slow on purpose (~70 ms at cost 10, ~0.3 s at 12), and Prometheus sends the same
    credentials every scrape: credentials that passed are remembered (a hash of them, in memory) and
    recognised on the event loop at once. The rest take a bcrypt round, a bounded number at a time, and a
    flood of wrong passwords is refused (429) beyond that without taking a scrape's place or making it wait:
    the addresses that gave a wrong password lately are checked on one thread, at most six checks waiting
    and two from one address; the others (a scraper seen for the first time after a restart, say) on
    another, two waiting at most, one from one address."""

    REMEMBERED = 64
    FAILED_SECONDS = 600.0  # how long a wrong password counts against its address
    FAILED_REMEMBERED = 4096

    def __init__(self, users: Mapping[str, bytes] | None = None) -> None:
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._clean = _Lane("bcrypt", limit=2, per_client=1)
        self._failing = _Lane("bcrypt-failed", limit=6, per_client=2)
        self._failed: OrderedDict[str, float] = OrderedDict()  # client address -> when, oldest first
        self._rounds = max((_cost(h) for h in (users or {}).values()), default=10)
        if users:
            self._clean.pool.submit(_dummy_hash, self._rounds)  # made before the first unknown user needs it

    @staticmethod
    def _key(user: bytes, password: bytes) -> bytes:
        return hashlib.sha256(user + b"\0" + password).digest()

    def known(self, user: bytes, password: bytes) -> bool:
        key = self._key(user, password)
        if key in self._good:
            self._good.move_to_end(key)
            return True
        return False

    def _failed_lately(self, client: str) -> bool:
        now = time.monotonic()
        while self._failed and next(iter(self._failed.values())) < now - self.FAILED_SECONDS:
            self._failed.popitem(last=False)
        return client in self._failed

    async def check(self, user: bytes, password: bytes, hashed: bytes | None, client: str = "") -> bool | None:
        """Whether the password is right; None when there is no room for the check now."""
        lane = self._failing if self._failed_lately(client) else self._clean
        if not lane.has_room(client):
            return None
        # Unknown users cost the same time as a wrong password: their name does not leak.
        ok = await lane.run(client, hashed or _dummy_hash(self._rounds), password)
        self._failed.pop(client, None)
        if ok and hashed is not None:
            self._good[self._key(user, password)] = None
            while len(self._good) > self.REMEMBERED:
                self._good.popitem(last=False)
            return True
        self._failed[client] = time.monotonic()
        while len(self._failed) > self.FAILED_REMEMBERED:
            self._failed.popitem(last=False)
        return False


class WebConfigMiddleware:
    """Basic auth (when users are configured) and the configured response headers, for every request."""

    def __init__(self, app: App, config: WebConfig, open_paths: frozenset[str] = frozenset()) -> None:
        """`open_paths` answer without credentials (the health probes)."""
        self.app = app
        self.config = config
        self.open_paths = open_paths
        self._headers = [(k.lower().encode(), v.encode()) for k, v in config.headers.items()]
        self._checks = PasswordChecks(config.users)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.config.users and scope["path"] not in self.open_paths:
            authorised = await self._authorised(scope)
            if not authorised:
                await self._deny(send, busy=authorised is None)
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and self._headers:
                message["headers"] = [*message.get("headers", []), *self._headers]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _authorised(self, scope: Scope) -> bool | None:
        """None: the password could not be checked now (too many checks under way)."""
        scheme, _, value = (header(scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            user, _, password = base64.b64decode(value, validate=True).partition(b":")
        except ValueError:
            return False
        if self._checks.known(user, password):
            return True
        client = (scope.get("client") or ("",))[0]
        hashed = self.config.users.get(user.decode(errors="replace"))
        return await self._checks.check(user, password, hashed, str(client))

    async def _deny(self, send: Send, *, busy: bool) -> None:
        if busy:
            await refuse(send, 429, "too many password checks under way", extra_headers=[_RETRY, *self._headers])
        else:
            await refuse(send, 401, "authentication required", extra_headers=[_CHALLENGE, *self._headers])
