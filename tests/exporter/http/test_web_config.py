"""--web.config.file: the exporter-toolkit format, strict at start, agreeing with promtool; auth and headers."""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import secrets
import ssl
import subprocess
import threading
from pathlib import Path

import bcrypt
import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpu_triage.exporter.http.web_config import WebConfig, WebConfigError, WebConfigMiddleware, load_web_config
from tests.conftest import require_tool
from tests.daemon_proc import GPU_TRIAGE, free_port, serve, state_args, wait_for

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = require_tool("openssl")
    home = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(home / "key.pem"), "-out", str(home / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return home / "cert.pem", home / "key.pem"


GOOD = {
    "tls only": "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n",
    "tls 1.3 only": "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS13\n",
    "auth only": f"basic_auth_users:\n  prometheus: '{HASH}'\n",
    "headers": "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    "empty": "",
}
BAD = {
    "unknown top key": ("tls_config:\n  cert_file: {cert}\n", "unknown key 'tls_config'"),
    "unknown tls key": (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  colour: red\n",
        "unknown key 'colour'",
    ),
    "missing key file": ("tls_server_config:\n  cert_file: {cert}\n", "key_file is required"),
    "cert does not exist": (
        "tls_server_config:\n  cert_file: /nope.pem\n  key_file: {key}\n",
        "/nope.pem does not exist",
    ),
    "bad hash": ("basic_auth_users:\n  prometheus: hunter2\n", "not a bcrypt hash"),
    "bad version": (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: SSL3\n",
        "'SSL3' is not one of",
    ),
    "header not allowed": ("http_server_config:\n  headers:\n    Server: me\n", "'Server' cannot be set here"),
}


def write(tmp_path: Path, text: str, cert: tuple[Path, Path]) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text.format(cert=cert[0], key=cert[1]))
    return path


@pytest.mark.parametrize("name", GOOD)
def test_good_files_load_and_promtool_agrees(name: str, tmp_path: Path, cert: tuple[Path, Path]) -> None:
    path = write(tmp_path, GOOD[name], cert)
    load_web_config(path)
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "web-config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", BAD)
def test_bad_files_are_refused_and_promtool_agrees(name: str, tmp_path: Path, cert: tuple[Path, Path]) -> None:
    text, message = BAD[name]
    path = write(tmp_path, text, cert)
    with pytest.raises(WebConfigError, match=message):
        load_web_config(path)
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "web-config", str(path)], capture_output=True, text=True, check=False)
    if name != "header not allowed":  # promtool 2.42 does not check header names
        assert result.returncode != 0, f"promtool accepted {name}"


def test_every_problem_at_once(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    path = write(tmp_path, "extra: 1\ntls_server_config:\n  cert_file: /nope\nbasic_auth_users:\n  a: b\n", cert)
    with pytest.raises(WebConfigError) as e:
        load_web_config(path)
    assert len(e.value.problems) == 4, e.value.problems


def client(config: WebConfig) -> TestClient:
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> dict[str, str]:
        return {"ok": "yes"}

    app.add_middleware(WebConfigMiddleware, config=config)
    return TestClient(app)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth() -> None:
    c = client(WebConfig(users={"prometheus": HASH.encode()}))
    denied = c.get("/metrics")
    assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic")
    assert denied.json() == {"error": "authentication required", "status": 401}
    assert c.get("/metrics", headers=basic("prometheus", "wrong")).status_code == 401
    assert c.get("/metrics", headers=basic("nobody", "s3cret")).status_code == 401
    assert c.get("/metrics", headers={"Authorization": "Basic !!!"}).status_code == 401
    assert c.get("/metrics", headers=basic("prometheus", "x" * 100)).status_code == 401
    assert c.get("/metrics", headers=basic("prometheus", "s3cret")).json() == {"ok": "yes"}


def test_configured_headers_on_every_answer() -> None:
    c = client(WebConfig(users={"p": HASH.encode()}, headers={"X-Frame-Options": "deny"}))
    assert c.get("/metrics").headers["x-frame-options"] == "deny"
    assert c.get("/metrics", headers=basic("p", "s3cret")).headers["x-frame-options"] == "deny"


def test_the_daemon_serves_tls_with_basic_auth(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    """The real `gpu-triage serve` with a web config file: HTTPS only, and only with the password."""
    config = write(tmp_path, GOOD["tls only"] + f"basic_auth_users:\n  prometheus: '{HASH}'\n", cert)
    with serve(
        tmp_path / "state", "--web.config.file", str(config), ca_file=cert[0], auth=("prometheus", "s3cret")
    ) as d:
        with httpx.Client(verify=ssl.create_default_context(cafile=cert[0]), timeout=2) as https:
            assert https.get(f"{d.url}/metrics").status_code == 401
            assert "nvidia_gpu_up" in https.get(f"{d.url}/metrics", auth=("prometheus", "s3cret")).text
        with pytest.raises(httpx.TransportError):
            httpx.get(d.url.replace("https://", "http://") + "/metrics", timeout=2)  # no plain HTTP beside it


def test_a_bad_web_config_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n  prometheus: hunter2\n")
    result = subprocess.run(
        [GPU_TRIAGE, "serve", "--backend", "sim", f"--web.listen-address=127.0.0.1:{free_port()}",
         "--web.config.file", str(config), *state_args(tmp_path / "state")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"web config file {config}: basic_auth_users.prometheus: not a bcrypt hash" in result.stderr


def test_check_reaches_a_secured_daemon(tmp_path: Path, cert: tuple[Path, Path]) -> None:
    config = write(tmp_path, GOOD["tls only"] + f"basic_auth_users:\n  prometheus: '{HASH}'\n", cert)
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    with serve(
        tmp_path / "state", "--web.config.file", str(config), ca_file=cert[0], auth=("prometheus", "s3cret")
    ) as d:
        args = [GPU_TRIAGE, "check", "--url", d.url, "--ca-file", str(cert[0]), "--user", "prometheus"]
        ok = subprocess.run([*args, "--password-file", str(password)], check=False, capture_output=True, text=True)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.startswith("OK - 8 GPUs")
        denied = subprocess.run(args, check=False, capture_output=True, text=True)  # no password
        assert denied.returncode == 3 and "401" in denied.stdout


def test_correct_scrapes_get_through_a_flood_of_wrong_passwords(tmp_path: Path) -> None:
    """Wrong passwords each cost a full bcrypt round; the right one, verified once, must not wait behind
    them. (How long it takes is measured in bench/bench_auth_flood.py.)"""
    slow = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=12)).decode()  # ~0.3 s a check, as people set it
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{slow}'\n")
    with serve(tmp_path / "state", "--web.config.file", str(config), auth=("prometheus", "s3cret")) as d:
        # Prometheus has been scraping before the flood starts: its credentials are known.
        assert httpx.get(f"{d.url}/metrics", auth=("prometheus", "s3cret"), timeout=10).status_code == 200
        stop = threading.Event()
        denied: list[int] = []

        def attack() -> None:
            with httpx.Client(timeout=60) as c:
                while not stop.is_set():
                    guess = secrets.token_hex(8)  # a new one each time, as a password guesser sends
                    with contextlib.suppress(httpx.TransportError):
                        denied.append(c.get(f"{d.url}/metrics", auth=("prometheus", guess)).status_code)

        attackers = [threading.Thread(target=attack) for _ in range(40)]
        for t in attackers:
            t.start()
        try:
            wait_for(lambda: len(denied) >= 10, timeout=60, what="the flood to be under way")
            with httpx.Client(timeout=3) as scraper:
                for _ in range(10):
                    answer = scraper.get(f"{d.url}/metrics", auth=("prometheus", "s3cret"))
                    assert answer.status_code == 200 and "nvidia_gpu_up" in answer.text
        finally:
            stop.set()
            for t in attackers:
                t.join()
    assert set(denied) <= {401, 429}, set(denied)


def _flood(url: str, stop: threading.Event, denied: list[int], source: str) -> None:
    """Wrong passwords for a real user, a new one each time, from the loopback address `source`."""
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(local_address=source)) as c:
        while not stop.is_set():
            with contextlib.suppress(httpx.TransportError):
                denied.append(c.get(f"{url}/metrics", auth=("prometheus", secrets.token_hex(8))).status_code)


def test_a_flood_leaves_room_for_scrapers_the_daemon_has_not_seen_yet(tmp_path: Path) -> None:
    """Right after a restart no credentials are known, so the right password needs its bcrypt round too. A
    flood of wrong ones from other addresses (24 threads on four, all of 127.0.0.0/8 is this machine) must
    not take every place: each scraper's first scrape gets through."""
    users = {f"scraper{i}": bcrypt.hashpw(f"pw{i}".encode(), bcrypt.gensalt(rounds=10)).decode() for i in range(4)}
    users["prometheus"] = users["scraper0"]
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()))
    with serve(tmp_path / "state", "--web.config.file", str(config)) as d:
        stop = threading.Event()
        denied: list[int] = []
        attackers = [
            threading.Thread(target=_flood, args=(d.url, stop, denied, f"127.0.0.{2 + i % 4}")) for i in range(24)
        ]
        for t in attackers:
            t.start()
        try:
            # Under way: every attacking address has been told its password is wrong (one at a time, while new).
            wait_for(lambda: denied.count(401) >= 12, timeout=60, what="the flood to be under way")
            for i in range(4):
                with httpx.Client(timeout=20, transport=httpx.HTTPTransport(local_address="127.0.0.1")) as scraper:
                    answer = scraper.get(f"{d.url}/metrics", auth=(f"scraper{i}", f"pw{i}"))
                    assert answer.status_code == 200, f"scraper{i}: {answer.status_code} {answer.text}"
        finally:
            stop.set()
            for t in attackers:
                t.join()
    assert 429 in denied and set(denied) <= {401, 429}, collections.Counter(denied)


def test_an_unknown_user_costs_what_a_known_one_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash an unknown user is checked against has the cost of the dearest configured one (bcrypt's
    `$2b$<cost>$`): a cheaper one answers faster and tells which names exist."""
    from gpu_triage.exporter.http import web_config

    dear = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=11))
    checked: list[bytes] = []

    def record(hashed: bytes, password: bytes) -> bool:
        checked.append(hashed)
        return False

    monkeypatch.setattr(web_config, "_password_ok", record)
    checks = web_config.PasswordChecks({"cheap": HASH.encode(), "dear": dear})
    assert asyncio.run(checks.check(b"nobody", b"guess", None, "192.0.2.1")) is False
    assert asyncio.run(checks.check(b"dear", b"guess", dear, "192.0.2.1")) is False
    assert [h.split(b"$")[2] for h in checked] == [b"11", b"11"]
