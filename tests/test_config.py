"""Settings from the environment: strict conversions that name the variable,
and a command line that does not override what the environment set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from yrelay import cli as cli_module
from yrelay.config import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("YRELAY_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("on", True),
        ("ON", True),
        ("1", True),
        ("true", True),
        ("Yes", True),
        ("off", False),
        ("0", False),
        ("False", False),
        ("no", False),
        (" OFF ", False),
    ],
)
def test_booleans_accept_the_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("YRELAY_METRICS", raw)
    assert Settings.from_env().metrics is expected


@pytest.mark.parametrize("raw", ["enabled", "", "2", "y"])
def test_other_boolean_spellings_are_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("YRELAY_VERIFY_DIGESTS", raw)
    with pytest.raises(ValueError, match="YRELAY_VERIFY_DIGESTS.*expected a boolean"):
        Settings.from_env()


@pytest.mark.parametrize(
    "variable, raw, expected",
    [
        ("YRELAY_PORT", "80x", "expected an integer"),
        ("YRELAY_PORT", "8000.5", "expected an integer"),
        ("YRELAY_GC_INTERVAL", "ten", "expected a number"),
        ("YRELAY_GC_INTERVAL", "nan", "expected a number"),
    ],
)
def test_a_bad_number_names_the_variable_and_the_type(monkeypatch, variable, raw, expected):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ValueError, match=f"{variable}=.*{expected}"):
        Settings.from_env()


def test_good_values_convert_and_explicit_overrides_win(monkeypatch):
    monkeypatch.setenv("YRELAY_PORT", " 9001 ")
    monkeypatch.setenv("YRELAY_GC_INTERVAL", "2.5")
    monkeypatch.setenv("YRELAY_HOST", "0.0.0.0")
    monkeypatch.setenv("YRELAY_ALLOWED_ORIGINS", "https://a.example, https://b.example")
    settings = Settings.from_env(host="::1")
    assert (settings.port, settings.gc_interval, settings.host) == (9001, 2.5, "::1")
    assert settings.allowed_origins == ("https://a.example", "https://b.example")


@pytest.fixture
def served(monkeypatch, redis_url):
    """``yrelay serve`` up to uvicorn: what it would listen on and with which settings."""
    seen: dict[str, object] = {}

    def fake_run(app, **options):
        seen.update(options)

    def fake_create_app(settings, url, authenticator):
        seen["settings"] = settings

    monkeypatch.setattr(cli_module.uvicorn, "run", fake_run)
    monkeypatch.setattr(cli_module, "create_app", fake_create_app)
    monkeypatch.setenv("YRELAY_REDIS_URL", redis_url)  # the test Redis (serve checks it answers): no embedded one
    return seen


def test_serve_keeps_what_the_environment_set(served, monkeypatch, tmp_path):
    monkeypatch.setenv("YRELAY_HOST", "0.0.0.0")
    monkeypatch.setenv("YRELAY_PORT", "9123")
    monkeypatch.setenv("YRELAY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("YRELAY_VERIFY_DIGESTS", "on")
    monkeypatch.setenv("YRELAY_INSECURE_NO_AUTH", "on")
    monkeypatch.setenv("YRELAY_AUTH_HOOK", "yrelay.nowhere:factory")
    monkeypatch.setattr(cli_module, "authenticator_for", lambda settings: None)
    result = CliRunner().invoke(cli_module.cli, ["serve"])
    assert result.exit_code == 0, result.output
    settings = served["settings"]
    assert (served["host"], served["port"]) == ("0.0.0.0", 9123)
    assert settings.data_dir == Path(tmp_path) and settings.verify_digests and settings.insecure_no_auth
    assert settings.auth_hook == "yrelay.nowhere:factory"


def test_serve_options_given_win_over_the_environment(served, monkeypatch):
    monkeypatch.setenv("YRELAY_HOST", "0.0.0.0")
    monkeypatch.setenv("YRELAY_PORT", "9123")
    result = CliRunner().invoke(
        cli_module.cli, ["serve", "--host", "127.0.0.2", "--port", "9124", "--insecure-no-auth"]
    )
    assert result.exit_code == 0, result.output
    assert (served["host"], served["port"]) == ("127.0.0.2", 9124)


def test_serve_without_either_uses_the_defaults(served):
    result = CliRunner().invoke(cli_module.cli, ["serve", "--insecure-no-auth"])
    assert result.exit_code == 0, result.output
    assert (served["host"], served["port"]) == ("127.0.0.1", 8000)
    assert served["settings"].data_dir == Path("data")


def test_serve_with_a_bad_variable_exits_2_with_one_line_naming_it(served, monkeypatch):
    monkeypatch.setenv("YRELAY_METRICS", "maybe")
    result = CliRunner().invoke(cli_module.cli, ["serve", "--insecure-no-auth"])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "YRELAY_METRICS='maybe'" in lines[0] and "Traceback" not in result.output
    assert "settings" not in served


@pytest.mark.parametrize("module", ["yrelay", "yrelay.cli"])
def test_python_dash_m_runs_the_token_subcommand(module):
    env = {**os.environ, "YRELAY_AUTH_SECRET": "s" * 32}
    result = subprocess.run(
        [sys.executable, "-m", module, "token", "issue", "--sub", "ci", "--doc", "a"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(".") == 2  # a JWT: header.payload.signature


def test_a_socket_holds_few_unread_messages(monkeypatch):
    """uvicorn's default queue (32 messages of up to ws_max_size, 16 MiB) let
    one connection that stopped reading pin 512 MiB; the served options
    carry the small queue, and the environment can change it."""
    options = Settings.from_env().uvicorn_options()
    assert options["ws_max_queue"] == 2
    assert options["ws_max_queue"] * options["ws_max_size"] <= 40 * 1024 * 1024
    monkeypatch.setenv("YRELAY_WS_MAX_QUEUE", "8")
    assert Settings.from_env().uvicorn_options()["ws_max_queue"] == 8


@pytest.mark.parametrize(
    "variable, raw, expected",
    [
        ("YRELAY_MAX_UPDATE_BYTES", "-1", "max_update_bytes must not be negative"),
        ("YRELAY_GC_INTERVAL", "-0.5", "gc_interval must not be negative"),
        ("YRELAY_YWS_ECHO_AFTER", "0", "yws_echo_after must be more than 0: .*busy loop"),
        ("YRELAY_RESEND_CHECK_INTERVAL", "0", "resend_check_interval must be more than 0"),
        ("YRELAY_BLOCK_MS", "0", "block_ms must be more than 0: Redis reads BLOCK 0 as waiting for ever"),
        ("YRELAY_CHUNK_BYTES", "0", "chunk_bytes must be more than 0"),
    ],
)
def test_a_negative_number_or_a_period_of_0_is_refused_naming_the_setting(monkeypatch, variable, raw, expected):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ValueError, match=expected):
        Settings.from_env()


def test_0_still_means_off_or_no_cap_where_the_docs_say_so(monkeypatch):
    for variable in ("YRELAY_GC_INTERVAL", "YRELAY_HELLO_TIMEOUT", "YRELAY_MAX_CONNECTIONS_PER_ADDRESS"):
        monkeypatch.setenv(variable, "0")
    settings = Settings.from_env()
    assert (settings.gc_interval, settings.hello_timeout, settings.max_connections_per_address) == (0, 0, 0)
