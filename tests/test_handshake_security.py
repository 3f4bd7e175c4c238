"""The handshake and token findings of issue 16, each against a real server
where it can be: DNS rebinding and the origin's scheme, the token leeway and
revocations kept past it, revocations of tokens already refused, tokens
without ``jti``, deep JSON, log injection through ``Origin``, the connection
timer surviving a failing check, and what ``/readyz`` tells strangers."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from pathlib import Path

import httpx
import jwt
import pytest
import websockets
from typer.testing import CliRunner

from conftest import running_server
from test_auth import AUTH, SECRET, Peer, token
from test_deadlines import upgrade_request
from yrelay.app.core.subscription import Subscription
from yrelay.auth import own_origins
from yrelay.auth.origins import normalize_origin, origin_allowed
from yrelay.cli import cli
from yrelay.config import Settings
from yrelay.observability import logs
from yrelay.protocol import ErrorCode, ProtocolError, parse_client_frame
from yrelay.storage.embedded import RedisProcess


async def handshake(port: int, *headers: str) -> bytes:
    """The status line of a websocket upgrade sent with ``headers`` (raw,
    so ``Host`` can lie like a DNS-rebinding page's does)."""
    request = upgrade_request(port).replace(f"Host: 127.0.0.1:{port}\r\n".encode(), b"")
    extra = "".join(f"{header}\r\n" for header in headers).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request.replace(b"\r\n\r\n", b"\r\n" + extra + b"\r\n"))
    status = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return status


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].removesuffix("/ws"))


# -- origins -----------------------------------------------------------------


async def test_dns_rebinding_and_a_foreign_scheme_are_refused(redis_url):
    """The finding: ``Host: rebind.evil.example:P`` with the same Origin was
    upgraded, because the own origin came from ``Host``."""
    async with running_server(redis_url) as url:
        port = _port(url)
        rebind = f"rebind.evil.example:{port}"
        assert (await handshake(port, f"Host: {rebind}", f"Origin: http://{rebind}")).startswith(b"HTTP/1.1 403")
        host = f"Host: 127.0.0.1:{port}"
        assert (await handshake(port, host, f"Origin: https://127.0.0.1:{port}")).startswith(b"HTTP/1.1 403")
        for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"HTTP://LOCALHOST:{port}"):
            assert (await handshake(port, host, f"Origin: {own}")).startswith(b"HTTP/1.1 101"), own
        assert (await handshake(port, host)).startswith(b"HTTP/1.1 101")  # no Origin: not a browser


async def test_public_url_is_the_servers_own_origin(redis_url):
    async with running_server(redis_url, public_url="https://relay.example.com") as url:
        port = _port(url)
        host = "Host: relay.example.com"
        assert (await handshake(port, host, "Origin: https://relay.example.com")).startswith(b"HTTP/1.1 101")
        assert (await handshake(port, host, "Origin: https://relay.example.com:443")).startswith(b"HTTP/1.1 101")
        for other in ("http://relay.example.com", f"http://127.0.0.1:{port}"):
            assert (await handshake(port, host, f"Origin: {other}")).startswith(b"HTTP/1.1 403"), other


def test_origins_compare_by_scheme_host_and_port():
    assert normalize_origin("HTTPS://Example.COM") == "https://example.com:443"
    assert normalize_origin("http://[::1]:8000") == "http://[::1]:8000"
    for junk in ("null", "", "ftp://x", "http://", "http://x:99999", "javascript:alert(1)"):
        assert normalize_origin(junk) is None, junk
    own = own_origins(None, "0.0.0.0", 8000)
    assert "http://localhost:8000" in own and "http://127.0.0.1:8000" in own
    assert own_origins(None, "relay.internal", 80) == frozenset({"http://relay.internal:80"})
    assert origin_allowed("https://app.example", own, ["https://app.example:443"])
    assert not origin_allowed("null", own, [])
    with pytest.raises(ValueError):
        Settings(public_url="ftp://relay.example.com")


# -- tokens ------------------------------------------------------------------


def test_the_leeway_is_a_bounded_setting():
    assert Settings().auth_leeway == 5.0
    with pytest.raises(ValueError):
        Settings(auth_leeway=3600)
    with pytest.raises(ValueError):
        Settings(auth_leeway=-1)


async def test_a_revocation_outlives_the_leeway_so_a_revoked_token_stays_refused(redis_url):
    """The finding: revoked with ``expires_at`` = exp, the entry was purged
    at exp, but hello accepts tokens 5 s past exp: welcome 2.7 s after exp."""
    settings = {**AUTH, "auth_leeway": 5.0}
    async with running_server(redis_url, **settings) as url:
        credential = token(["a"], ttl=1, token_id="short-lived")
        expires_at = jwt.decode(credential, options={"verify_signature": False})["exp"]
        async with httpx.AsyncClient(base_url=url.replace("ws://", "http://").removesuffix("/ws")) as ops:
            response = await ops.post(
                "/ops/tokens/revoke",
                json={"jti": "short-lived", "expires_at": expires_at},
                headers={"Authorization": "Bearer ops"},
            )
            assert response.status_code == 204
        await asyncio.sleep(max(0.0, expires_at - time.time()) + 1.5)  # past exp, inside the leeway
        peer, answer = await Peer.open(url, credential)
        assert (answer["op"], answer.get("message")) == ("error", "the token was revoked")
        assert await peer.closed_with() == 4401
        fresh, welcome = await Peer.open(url, token(["a"], ttl=1, now=time.time() - 3))  # expired 2 s ago
        assert welcome["op"] == "welcome", "the leeway still admits an unrevoked token"


async def test_revoking_a_token_that_is_refused_already_is_an_error(redis_url):
    async with running_server(redis_url, **AUTH) as url:
        async with httpx.AsyncClient(base_url=url.replace("ws://", "http://").removesuffix("/ws")) as ops:
            response = await ops.post(
                "/ops/tokens/revoke",
                json={"jti": "old", "expires_at": time.time() - 100},
                headers={"Authorization": "Bearer ops"},
            )
            assert response.status_code == 422 and "refused already" in response.json()["detail"]


def test_the_cli_refuses_to_revoke_a_token_that_is_refused_already(redis_url):
    result = CliRunner().invoke(
        cli, ["token", "revoke", "old", "--expires-at", str(time.time() - 100), "--redis-url", redis_url]
    )
    assert result.exit_code == 2 and "refused already" in result.output


async def test_a_token_without_jti_cannot_be_revoked_so_it_is_refused(redis_url):
    claims = {"sub": "alice", "docs": ["a"], "perm": "write", "exp": int(time.time()) + 600}
    async with running_server(redis_url, **AUTH) as url:
        peer, answer = await Peer.open(url, jwt.encode(claims, SECRET, algorithm="HS256"))
        assert answer["code"] == "unauthorized" and "jti" in answer["message"]
        assert await peer.closed_with() == 4401
        _, welcome = await Peer.open(url, jwt.encode({**claims, "jti": "t-1"}, SECRET, algorithm="HS256"))
        assert welcome["op"] == "welcome"


# -- frames, logs, timer, readiness -----------------------------------------


def test_deep_json_is_a_malformed_frame_not_a_recursion_error():
    for text in ('{"op":"ping","x":' + "[" * 1000 + "]" * 1000 + "}", "[" * 100_000, '{"a":' * 50_000):
        with pytest.raises(ProtocolError) as refused:
            parse_client_frame(text)
        assert refused.value.code is ErrorCode.MALFORMED_FRAME
    nested_in_a_string = json.dumps({"op": "hello", "session": "[" * 5000})
    assert parse_client_frame(nested_in_a_string).session == "[" * 5000


async def test_deep_json_over_the_wire_gets_malformed_frame_and_no_traceback(redis_url, caplog):
    async with running_server(redis_url) as url:
        async with websockets.connect(url) as ws:
            await ws.send(json.dumps({"op": "hello"}))
            assert json.loads(await ws.recv())["op"] == "welcome"
            await ws.send('{"op":"ping","x":' + "[" * 1000 + "]" * 1000 + "}")
            answer = json.loads(await ws.recv())
            assert (answer["op"], answer["code"]) == ("error", "malformed_frame")
            await ws.send(json.dumps({"op": "ping"}))
            assert json.loads(await ws.recv())["op"] == "pong"
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_an_origin_with_c1_bytes_is_logged_escaped(redis_url, caplog):
    """The finding: bytes 0x80-0xFF of Origin reached the log as they came
    (U+0085 is a line break to many log readers, U+009B a terminal escape)."""
    async with running_server(redis_url) as url:
        port = _port(url)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(upgrade_request(port).replace(b"\r\n\r\n", b"\r\nOrigin: http://x\x85FAKE\x9b[31m\r\n\r\n"))
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 403")
        writer.close()
    lines = [record.getMessage() for record in caplog.records if "origin" in record.getMessage()]
    assert lines and all("\x85" not in line and "\x9b" not in line for line in lines), lines
    assert "\\x85FAKE\\x9b[31m" in lines[0]


def test_the_formatters_escape_every_string_argument():
    for format in ("text", "json"):
        stream = io.StringIO()
        logger = logging.getLogger(f"test.escape.{format}")
        logger.addHandler(logs.handler(format, stream))
        logger.propagate = False
        logger.warning("GET %s %d", "/a\nFORGED line\x1b[2J\u2028", 200)
        logger.warning("a message\non two lines, as written")
        out = stream.getvalue()
        assert "\x1b" not in out and "\u2028" not in out and "FORGED line" in out
        assert "\\x0aFORGED" in out or "\\\\x0aFORGED" in out  # JSON escapes the backslash again
        assert len(out.strip().splitlines()) == 3 if format == "text" else 2


async def test_a_failing_resend_check_does_not_end_the_tokens_expiry(redis_url, monkeypatch, caplog):
    """The connection timer caught nothing: one exception ended its resend,
    expiry and revocation checks for good, silently."""

    def broken(self: Subscription) -> None:
        raise RuntimeError("resend check broke")

    monkeypatch.setattr(Subscription, "check_resend", broken)
    async with running_server(redis_url, **AUTH) as url:
        peer, welcome = await Peer.open(url, token(["a"], ttl=1.5))
        assert welcome["op"] == "welcome"
        await peer.send({"op": "subscribe", "doc": "a"})
        error = await peer.until("error")
        assert error["message"] == "the token has expired"
        assert await peer.closed_with() == 4401
    assert any("resend check broke" in (record.exc_text or "") or record.exc_info for record in caplog.records)


async def test_readyz_tells_why_only_to_operators(tmp_path: Path):
    redis = RedisProcess(tmp_path / "redis").start()
    try:
        async with running_server(redis.url, ops_token="ops-secret", metrics_token="metrics-secret") as url:
            base = url.replace("ws://", "http://").removesuffix("/ws")
            redis.stop()
            async with httpx.AsyncClient(base_url=base, timeout=20) as http:
                stranger = await http.get("/readyz")
                assert stranger.status_code == 503 and stranger.json() == {"status": "unavailable"}
                for credential in ("ops-secret", "metrics-secret"):
                    told = await http.get("/readyz", headers={"Authorization": f"Bearer {credential}"})
                    assert told.status_code == 503 and told.json()["reason"]
                wrong = await http.get("/readyz", headers={"Authorization": "Bearer guess"})
                assert "reason" not in wrong.json()
    finally:
        redis.stop()
