"""Authentication and authorization over a real server: tokens scoped to
documents and permissions, expiry and revocation cutting connections off,
browser origins, the ops token, sessions bound to their subject, and the
explicit development switch."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Mapping

import httpx
import pytest
import websockets
from typer.testing import CliRunner
from websockets.exceptions import ConnectionClosed, InvalidStatus

from conftest import FAST_BACKOFF, eventually, running_server
from yrelay.auth import AuthConfigurationError, AuthError, Principal, authenticator_for, issue_token
from yrelay.cli import cli
from yrelay.client import Unauthorized, YrelayClient
from yrelay.config import Settings
from yrelay.storage.keys import stream_key
from yrelay.yjs import crdt

SECRET = "test-secret-0123456789abcdef0123456789"
AUTH = {
    "insecure_no_auth": False,
    "auth_secret": SECRET,
    "revocation_refresh": 0.1,
    "ops_token": "ops",
    "auth_leeway": 0,
}


def token(docs: list[str], perm: str = "write", ttl: float = 600, subject: str = "alice", **kwargs: object) -> str:
    return issue_token(SECRET, subject, docs, perm, ttl, **kwargs)


def update_of(text: str) -> str:
    doc = crdt.new_doc(7)
    crdt.insert_text(doc, 0, text)
    return base64.b64encode(crdt.encode_state(doc)).decode()


class Peer:
    """A raw connection that sends its token in hello."""

    def __init__(self, ws):
        self.ws = ws

    @classmethod
    async def open(cls, url: str, credential: str | None, session: str | None = None, **connect) -> tuple[Peer, dict]:
        peer = cls(await websockets.connect(url, **connect))
        await peer.send({"op": "hello", "token": credential, "session": session})
        return peer, await peer.recv()

    async def send(self, frame: dict) -> None:
        await self.ws.send(json.dumps(frame))

    async def recv(self, timeout: float = 5.0) -> dict:
        while (frame := json.loads(await asyncio.wait_for(self.ws.recv(), timeout)))["op"] == "synced":
            pass  # an additive frame these tests do not look at
        return frame

    async def until(self, op: str) -> dict:
        while (frame := await self.recv())["op"] != op:
            pass
        return frame

    async def closed_with(self, timeout: float = 5.0) -> int:
        """Read until the server closes; its close code."""
        try:
            while True:
                await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code


@pytest.fixture
async def auth_url(redis_url):
    async with running_server(redis_url, **AUTH) as url:
        yield url


async def test_a_token_for_one_document_cannot_read_or_write_another(auth_url, redis_client):
    peer, welcome = await Peer.open(auth_url, token(["a"]))
    assert welcome["op"] == "welcome" and welcome["auth"] == {"mode": "jwt", "subject": "alice", "permission": "write"}
    await peer.send({"op": "subscribe", "doc": "b"})
    refused = await peer.recv()
    assert (refused["op"], refused["code"], refused["doc"]) == ("error", "forbidden", "b")
    await peer.send({"op": "update", "doc": "b", "clock": 1, "update": update_of("x")})
    assert (await peer.recv())["code"] == "forbidden"
    await peer.send({"op": "subscribe", "doc": "a"})
    assert (await peer.until("subscribed"))["doc"] == "a"
    await peer.send({"op": "update", "doc": "a", "clock": 2, "update": update_of("y")})
    assert (await peer.until("appended"))["clock"] == 2
    assert await redis_client.xlen(stream_key("b")) == 0
    assert await redis_client.xlen(stream_key("a")) == 1


async def test_prefix_grants_cover_their_prefix_only(auth_url):
    peer, _ = await Peer.open(auth_url, token(["team-7/*"]))
    await peer.send({"op": "subscribe", "doc": "team-7/plan"})
    assert (await peer.recv())["op"] == "subscribed"
    await peer.send({"op": "subscribe", "doc": "team-70/plan"})
    assert (await peer.recv())["code"] == "forbidden"


async def test_a_read_only_token_receives_but_every_update_is_refused(auth_url, redis_client):
    writer, _ = await Peer.open(auth_url, token(["doc"], subject="writer"))
    reader, welcome = await Peer.open(auth_url, token(["doc"], perm="read", subject="reader"))
    assert welcome["auth"]["permission"] == "read"
    for peer in (writer, reader):
        await peer.send({"op": "subscribe", "doc": "doc"})
        await peer.until("subscribed")
    await writer.send({"op": "update", "doc": "doc", "clock": 1, "update": update_of("from the writer")})
    delivered = await reader.until("deliver")
    assert len(delivered["entries"]) == 1
    for clock in (1, 2, 3):
        await reader.send({"op": "update", "doc": "doc", "clock": clock, "update": update_of(f"no {clock}")})
        refused = await reader.until("error")
        assert (refused["code"], refused["clock"]) == ("forbidden", clock)
        assert "read-only" in refused["message"]
    assert await redis_client.xlen(stream_key("doc")) == 1


@pytest.mark.parametrize(
    "credential, reason",
    [
        (None, "token is required"),
        ("not-a-jwt", "invalid token"),
        (issue_token("another-secret-0123456789abcdef012345", "eve", ["a"]), "invalid token"),
        (issue_token(SECRET, "late", ["a"], ttl=-60), "expired"),
    ],
)
async def test_a_missing_invalid_or_expired_token_is_refused_with_4401(auth_url, credential, reason):
    peer, answer = await Peer.open(auth_url, credential)
    assert answer["op"] == "error" and answer["code"] == "unauthorized"
    assert reason in answer["message"]
    assert credential is None or credential not in answer["message"]
    assert await peer.closed_with() == 4401


async def test_a_connection_is_cut_off_when_its_token_expires(auth_url):
    peer, welcome = await Peer.open(auth_url, token(["a"], ttl=1.5))
    assert welcome["op"] == "welcome"
    await peer.send({"op": "subscribe", "doc": "a"})
    await peer.until("subscribed")
    error = await peer.until("error")  # nothing else happens on this socket until the expiry
    assert (error["code"], error["message"]) == ("unauthorized", "the token has expired")
    assert await peer.closed_with() == 4401


async def test_a_revoked_token_is_cut_off_and_refused_afterwards(auth_url):
    credential = token(["a"], token_id="tok-1")
    peer, _ = await Peer.open(auth_url, credential)
    other, _ = await Peer.open(auth_url, token(["a"], token_id="tok-2"))
    base = auth_url.replace("ws://", "http://").removesuffix("/ws")
    async with httpx.AsyncClient(base_url=base) as ops:
        assert (await ops.post("/ops/tokens/revoke", json={"jti": "tok-1"})).status_code == 401
        response = await ops.post(
            "/ops/tokens/revoke",
            json={"jti": "tok-1", "expires_at": time.time() + 600},
            headers={"Authorization": "Bearer ops"},
        )
        assert response.status_code == 204
    error = await peer.until("error")
    assert (error["code"], error["message"]) == ("unauthorized", "the token was revoked")
    assert await peer.closed_with() == 4401
    again, answer = await Peer.open(auth_url, credential)
    assert answer["code"] == "unauthorized" and await again.closed_with() == 4401
    await other.send({"op": "ping"})  # another token of the same subject is untouched
    assert (await other.recv())["op"] == "pong"


async def test_the_token_may_travel_as_a_websocket_subprotocol(auth_url):
    ws = await websockets.connect(auth_url, subprotocols=["yrelay.v1", f"yrelay.auth.{token(['a'])}"])
    assert ws.subprotocol == "yrelay.v1"
    await ws.send(json.dumps({"op": "hello"}))
    welcome = json.loads(await ws.recv())
    assert welcome["op"] == "welcome" and welcome["auth"]["subject"] == "alice"
    await ws.close()


async def test_a_foreign_browser_origin_is_refused_before_the_handshake(redis_url):
    async with running_server(redis_url, **AUTH, allowed_origins=("https://app.example",)) as url:
        host = url.removeprefix("ws://").removesuffix("/ws")
        with pytest.raises(InvalidStatus) as refused:
            await websockets.connect(url, origin="https://evil.example")
        assert refused.value.response.status_code == 403
        for origin in ("https://app.example", f"http://{host}", None):  # allowed, the server's own page, no browser
            peer, welcome = await Peer.open(url, token(["a"]), origin=origin)
            assert welcome["op"] == "welcome", origin


async def test_a_session_id_only_resumes_for_the_subject_that_opened_it(auth_url):
    alice, welcome = await Peer.open(auth_url, token(["a"], subject="alice"))
    session = welcome["session"]
    await alice.ws.close()
    _, stolen = await Peer.open(auth_url, token(["a"], subject="mallory"), session=session)
    assert stolen["resumed"] is False and stolen["session"] != session
    _, resumed = await Peer.open(auth_url, token(["a"], subject="alice"), session=session)
    assert resumed["resumed"] is True and resumed["session"] == session


async def test_the_python_client_sends_its_token_and_reports_a_refusal(auth_url):
    refused: list[dict] = []
    bad = YrelayClient(
        auth_url,
        backoff=FAST_BACKOFF,
        token="garbage",
        on_event=lambda event, data: refused.append(data) if event == "error" else None,
    )
    with pytest.raises(Unauthorized, match="invalid token"):  # at once: not a timeout (tests/test_client_refusals.py)
        await bad.connect(timeout=60.0)
    await bad.close()
    assert refused and refused[0]["code"] == "unauthorized"
    async with YrelayClient(auth_url, backoff=FAST_BACKOFF, token=lambda: token(["notes"])) as client:
        notes = await client.subscribe("notes")
        crdt.insert_text(notes.ydoc, 0, "signed")
        await client.wait_idle()


async def test_a_custom_authenticator_is_the_hook_for_an_apps_own_users(redis_url):
    class HeaderSessions:
        """An app that trusts its own session cookie (a stand-in for a user service)."""

        async def authenticate(self, credential: str | None, headers: Mapping[str, str]) -> Principal:
            if headers.get("cookie") != "sid=valid":
                raise AuthError("please log in")
            return Principal.of("cookie-user", ["shared/*"], "read")

    import uvicorn

    from yrelay.app import create_app
    from yrelay.storage.embedded import free_port

    port = free_port()
    app = create_app(Settings.from_env(insecure_no_auth=False), redis_url, authenticator=HeaderSessions())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started or task.done())
    try:
        url = f"ws://127.0.0.1:{port}/ws"
        _, welcome = await Peer.open(url, None, additional_headers={"Cookie": "sid=valid"})
        assert welcome["auth"] == {"mode": "custom", "subject": "cookie-user", "permission": "read"}
        peer, refused = await Peer.open(url, None)
        assert refused["message"] == "please log in" and await peer.closed_with() == 4401
    finally:
        server.should_exit = True
        await task


def test_without_any_auth_configured_the_server_refuses_to_start(monkeypatch):
    monkeypatch.delenv("YRELAY_INSECURE_NO_AUTH", raising=False)
    with pytest.raises(AuthConfigurationError):
        authenticator_for(Settings.from_env())
    result = CliRunner().invoke(cli, ["serve", "--port", "1"])
    assert result.exit_code == 2
    assert "YRELAY_AUTH_SECRET" in result.output + (result.stderr if result.stderr_bytes is not None else "")


async def test_development_mode_is_announced_loudly(redis_url, caplog):
    with caplog.at_level(logging.WARNING, logger="yrelay"):
        async with running_server(redis_url, insecure_no_auth=True) as url:
            _, welcome = await Peer.open(url, None)
    assert welcome["auth"]["mode"] == "disabled"
    assert any("AUTHENTICATION IS OFF" in record.getMessage() for record in caplog.records)


def test_yrelay_token_issue_prints_a_token_the_server_accepts():
    result = CliRunner().invoke(
        cli,
        ["token", "issue", "--sub", "ci", "--doc", "a", "--doc", "team/*", "--perm", "read"],
        env={"YRELAY_AUTH_SECRET": SECRET},
    )
    assert result.exit_code == 0, result.output
    principal = asyncio.run(authenticator_for(Settings(auth_secret=SECRET)).authenticate(result.output.strip(), {}))
    assert principal.subject == "ci" and principal.can_read("team/x") and not principal.can_write("a")
