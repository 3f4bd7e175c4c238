"""Log lines name their document and session, come as text or JSON, and
never carry a secret (the ops token, a bearer token, a JWT, a Redis password)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import signal
import subprocess
import sys

import httpx
import pytest
import redis
import websockets

from conftest import running_server
from wsraw import RawPeer
from yrelay.auth import issue_token
from yrelay.observability import logs
from yrelay.storage.embedded import RedisProcess, free_port
from yrelay_tools.testing.processes import wait_ready

OPS_TOKEN = "ops-token-never-logged-41"
REDIS_PASSWORD = "redis-password-never-logged-42"
AUTH_SECRET = "auth-secret-never-logged-43-0123456789"
JWT = issue_token(AUTH_SECRET, "alice", ["logged"])
AHEAD = "99999999999999-0"


@pytest.fixture
def captured():
    """Every record (DEBUG and up) through the JSON handler, into a string."""
    stream = io.StringIO()
    handler = logs.handler("json", stream)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def test_secrets_are_redacted():
    logs.add_secret(OPS_TOKEN)
    logs.add_secret("abc")  # too short to be taken for a secret: ordinary words stay readable
    lines = [
        f"configured with token {OPS_TOKEN}",
        f"request header Authorization: Bearer {'x' * 20}",
        f"hello with {JWT} inside",
        f"connecting to redis://:{REDIS_PASSWORD}@10.0.0.5:6379/0",
        f"connecting to rediss://user:{REDIS_PASSWORD}@redis.internal:6380",
        f'"WebSocket /ws?doc=a&token={"t" * 16}" [accepted]',
    ]
    for line in lines:
        redacted = logs.redact(line)
        assert logs.REDACTED in redacted
        for secret in (OPS_TOKEN, "x" * 20, JWT, "eyJ", REDIS_PASSWORD, "t" * 16):
            assert secret not in redacted, redacted
    assert logs.redact("abc at http://127.0.0.1:8000/ws, 5 entries") == "abc at http://127.0.0.1:8000/ws, 5 entries"
    assert "10.0.0.5:6379" in logs.redact(lines[3])  # where it connects stays readable


def test_text_lines_carry_doc_and_session_and_json_lines_are_objects():
    stream = io.StringIO()
    text, as_json = logs.handler("text", stream), logs.handler("json", stream)
    log = logging.getLogger("yrelay.test")
    record = lambda: log.makeRecord(log.name, logging.WARNING, __file__, 1, "token %s seen", (OPS_TOKEN,), None)  # noqa: E731
    logs.add_secret(OPS_TOKEN)
    doc, session = logs.doc.set("notes/1"), logs.session.set("s-123")
    try:
        text.handle(record())
        as_json.handle(record())
    finally:
        logs.doc.reset(doc)
        logs.session.reset(session)
    text.handle(record())
    first, second, third = stream.getvalue().splitlines()
    assert first.endswith(f"WARNING yrelay.test: token {logs.REDACTED} seen doc=notes/1 session=s-123")
    entry = json.loads(second)
    assert entry["doc"] == "notes/1" and entry["session"] == "s-123" and entry["level"] == "WARNING"
    assert entry["message"] == f"token {logs.REDACTED} seen" and entry["ts"].endswith("Z")
    assert third.endswith(f"token {logs.REDACTED} seen")  # outside a connection: no pairs
    with pytest.raises(ValueError):
        logs.handler("xml")


async def test_lines_about_a_document_name_it_and_the_session(redis_url, captured):
    async with running_server(redis_url, gc_interval=0) as url:
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "logged", "offset": AHEAD})
        assert (await peer.expect("resync_required"))["reason"] == "ahead"
        await peer.send(
            {"op": "update", "doc": "logged", "clock": 1, "update": base64.b64encode(b"\xff\xff\xff").decode()}
        )
        assert (await peer.expect("error"))["code"] == "invalid_update"
        await peer.close()
    lines = captured()
    resync = [line for line in lines if line["message"] == "resync required: ahead"]
    rejected = [line for line in lines if line["message"].startswith("rejected a frame: invalid_update")]
    assert resync and rejected
    for line in resync + rejected:
        assert (line["doc"], line["session"]) == ("logged", peer.session), line
    for line in lines:
        if line["logger"].startswith("yrelay.app.") and line["doc"] is not None:
            assert line["session"] == peer.session, line


def test_serve_logs_json_without_secrets(tmp_path):
    """`yrelay serve --log-format json` with an ops token and a Redis password;
    a client puts a JWT in its URL (as browsers must) and an operator sends a
    wrong token: no line carries any of them, and every line is JSON."""
    with RedisProcess(tmp_path / "redis") as private:
        redis.Redis.from_url(private.url).config_set("requirepass", REDIS_PASSWORD)
        url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{private.port}/0"
        port = free_port()
        env = {
            "YRELAY_OPS_TOKEN": OPS_TOKEN,
            "YRELAY_DATA_DIR": str(tmp_path / "data"),
            "YRELAY_GC_INTERVAL": "0",
            "YRELAY_AUTH_SECRET": AUTH_SECRET,
        }
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "yrelay",
                "serve",
                "--port",
                str(port),
                "--redis-url",
                url,
                "--log-level",
                "info",
                "--log-format",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**_environ(), **env},
        )
        try:
            wait_ready(port, process)
            session = asyncio.run(_traffic(port))
            response = httpx.get(f"http://127.0.0.1:{port}/ops/docs", headers={"Authorization": f"Bearer {JWT}"})
            assert response.status_code == 403
            assert (
                httpx.get(
                    f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {OPS_TOKEN}"}
                ).status_code
                == 200
            )
        finally:
            process.send_signal(signal.SIGINT)
            output, _ = process.communicate(timeout=20)
    for secret in (OPS_TOKEN, REDIS_PASSWORD, JWT, AUTH_SECRET, "eyJ"):
        assert secret not in output
    lines = [json.loads(line) for line in output.splitlines()]
    assert any(line["message"] == f"using Redis at redis://:[redacted]@127.0.0.1:{private.port}/0" for line in lines)
    assert any("/ws?token=[redacted]" in line["message"] for line in lines), "uvicorn's lines go through it too"
    [resync] = [line for line in lines if line["message"] == "resync required: ahead"]
    assert (resync["doc"], resync["session"]) == ("logged", session)


async def _traffic(port: int) -> str:
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws?token={JWT}") as ws:
        await ws.send(json.dumps({"op": "hello", "session": None, "token": JWT}))
        session = json.loads(await ws.recv())["session"]
        await ws.send(json.dumps({"op": "subscribe", "doc": "logged", "offset": AHEAD}))
        assert json.loads(await ws.recv())["op"] == "resync_required"
    return session


def _environ() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("YRELAY_")}


def test_the_auth_packages_own_logger_names_are_not_taken_for_a_token():
    """The subprotocol rule (``yrelay.auth.<token>``) once redacted the
    revocation loop's own logger name: ``yrelay.auth.[redacted]: could not
    refresh revoked tokens`` (seen in a chaos run's logs)."""
    from yrelay.observability.logs import redact

    assert (
        redact("WARNING yrelay.auth.revocation: could not refresh")
        == "WARNING yrelay.auth.revocation: could not refresh"
    )
    assert redact('{"logger": "yrelay.auth.revocation"}') == '{"logger": "yrelay.auth.revocation"}'
    assert "eyJ" not in redact("sec-websocket-protocol: yrelay.yws, yrelay.auth.eyJhbGciOi.x.y")
    assert redact("yrelay.auth.revocation-token-9") == "yrelay.auth.[redacted]"
