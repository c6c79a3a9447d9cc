"""Settings: flags over environment over config file over defaults; every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_triage.exporter.settings import OPTIONS, Settings, SettingsError, env_name, load_settings, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0), ("1d", 86400.0), ("2.5", 2.5), (3, 3.0)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 s", "5x", "s", "1m30", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-1s", "-5", "-0.5m"])
def test_negative_durations_must_be_positive(text: str) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        parse_duration(text)


def test_zero_must_be_positive() -> None:
    with pytest.raises(SettingsError) as e:
        load_settings({"collector_interval": "0s", "diagnose_max_bytes": "0"}, None)
    assert e.value.problems == [
        "--collector.interval (or GPU_TRIAGE_COLLECTOR_INTERVAL): must be positive (got '0s')",
        "--diagnose.max-bytes (or GPU_TRIAGE_DIAGNOSE_MAX_BYTES): must be positive (got '0')",
    ]


def test_defaults() -> None:
    s = load_settings({}, None)
    assert s.web_listen_address == [":9481"] and s.backend == "auto" and s.collector_interval == 5.0
    assert s.state_dir == Path("/var/lib/gpu-triage") and s.read_timeout == 4.0


def test_every_option_is_a_setting_and_every_setting_an_option() -> None:
    assert {o.field for o in OPTIONS} == set(Settings.model_fields)
    assert env_name("state.dir") == "GPU_TRIAGE_STATE_DIR"
    assert env_name("web.listen-address") == "GPU_TRIAGE_WEB_LISTEN_ADDRESS"


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gpu-triage.yaml"
    config.write_text("collector.interval: 9s\nbackend: sim\nlog.level: debug\nstate.dir: /srv/state\n")
    monkeypatch.setenv("GPU_TRIAGE_COLLECTOR_INTERVAL", "2s")
    monkeypatch.setenv("GPU_TRIAGE_STATE_DIR", "/env/state")
    s = load_settings({"state_dir": "/flag/state"}, config)
    assert s.collector_interval == 2.0  # environment beats the file
    assert s.backend == "sim" and s.log_level == "debug"  # the file beats defaults
    assert s.state_dir == Path("/flag/state")  # the flag beats everything


def test_listen_addresses_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_TRIAGE_WEB_LISTEN_ADDRESS", "127.0.0.1:9481, [::1]:9481")
    assert load_settings({}, None).web_listen_address == ["127.0.0.1:9481", "[::1]:9481"]


def test_every_problem_is_listed_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("colector.interval: 5s\nweb.telemetry-path: metrics\n")
    monkeypatch.setenv("GPU_TRIAGE_LOG_FORMAT", "xml")
    with pytest.raises(SettingsError) as e:
        load_settings({"backend": "cuda", "collector_interval": "fast", "web_listen_address": ["9481"]}, config)
    problems = "\n".join(e.value.problems)
    assert len(e.value.problems) == 6, problems
    for expected in (
        "unknown key 'colector.interval'",
        "--backend (or GPU_TRIAGE_BACKEND): Input should be 'auto', 'nvml', 'dcgm' or 'sim' (got 'cuda')",
        "--collector.interval (or GPU_TRIAGE_COLLECTOR_INTERVAL): 'fast' is not a duration",
        "--web.listen-address (or GPU_TRIAGE_WEB_LISTEN_ADDRESS): '9481' is not host:port",
        "--web.telemetry-path (or GPU_TRIAGE_WEB_TELEMETRY_PATH): must start with /",
        "--log.format (or GPU_TRIAGE_LOG_FORMAT): Input should be 'logfmt' or 'json' (got 'xml')",
    ):
        assert expected in problems


@pytest.mark.parametrize(
    ("content", "message"),
    [("[1, 2]", "must be a mapping"), ("a: [", "not valid YAML"), (None, "cannot read it")],
)
def test_bad_config_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError, match=message):
        load_settings({}, path)


def test_listen_addresses_may_be_comma_separated_in_flags_too() -> None:
    assert load_settings({"web_listen_address": ["127.0.0.1:1,[::1]:2", ":3"]}, None).web_listen_address == [
        "127.0.0.1:1",
        "[::1]:2",
        ":3",
    ]


def test_environment_values_are_parsed_as_flags_are_and_other_variables_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPU_TRIAGE_SOURCE_KMSG", "false")
    monkeypatch.setenv("GPU_TRIAGE_WEB_MAX_CONNECTIONS", "64")
    monkeypatch.setenv("GPU_TRIAGE_DIAGNOSE_MAX_BYTES", "1MiB")
    monkeypatch.setenv("GPU_TRIAGE_CONFIG", "/nowhere.yaml")  # read by the command line, not a setting
    monkeypatch.setenv("GPU_TRIAGE_URL", "http://127.0.0.1:9481")  # gpu-triage check's
    s = load_settings({}, None)
    assert s.source_kmsg is False and s.web_max_connections == 64 and s.diagnose_max_bytes == 2**20
    monkeypatch.setenv("GPU_TRIAGE_WEB_MAX_CONNECTIONS", "4")
    with pytest.raises(SettingsError) as e:
        load_settings({}, None)
    assert e.value.problems == [
        "--web.max-connections (or GPU_TRIAGE_WEB_MAX_CONNECTIONS): Input should be greater than or equal to 8 (got '4')"
    ]
