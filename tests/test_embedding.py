"""yrelay inside another FastAPI app: docs/examples/embed_fastapi.py itself
(the example docs/embedding.md shows) served by uvicorn on a real Redis,
with its own users and routes, yrelay under ``/collab``; and the Relay's
own contract (prefixes, lifespan, the host's authenticate function)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import websockets
from fastapi import FastAPI, HTTPException
from websockets.exceptions import ConnectionClosed, InvalidStatus

from conftest import FAST_BACKOFF, eventually
from conftest import serving as serving_app
from yrelay import Relay
from yrelay.auth import AuthError, HostAuthenticator, Principal
from yrelay.client import YrelayClient
from yrelay.config import Settings
from yrelay.storage.embedded import free_port
from yrelay.yjs import crdt

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "embed_fastapi.py"
OPS = {"Authorization": "Bearer ops-secret"}


def load_example() -> ModuleType:
    """A fresh copy of the example module (its Relay reads the environment)."""
    spec = importlib.util.spec_from_file_location("embed_fastapi_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@contextlib.asynccontextmanager
async def serving(app: FastAPI, **options: object) -> AsyncIterator[str]:
    """``app`` under uvicorn in this event loop; yields its http base URL."""
    port = free_port()
    async with serving_app(app, port, **options):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def host(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    monkeypatch.setenv("YRELAY_REDIS_URL", redis_url)
    monkeypatch.setenv("YRELAY_OPS_TOKEN", "ops-secret")
    monkeypatch.setenv("YRELAY_INSECURE_NO_AUTH", "0")  # as a deployed host: its own auth only
    example = load_example()
    async with serving(example.app, **example.relay.settings.uvicorn_options()) as base:
        yield base


async def hello(url: str, token: str | None = None, **connect: object) -> tuple[object, dict]:
    ws = await websockets.connect(url, **connect)  # type: ignore[arg-type]
    await ws.send(json.dumps({"op": "hello", "token": token}))
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 5))


async def close_code(ws: object) -> int:
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 5)  # type: ignore[attr-defined]
    except ConnectionClosed as closed:
        assert closed.rcvd is not None
        return closed.rcvd.code


async def test_two_clients_sync_through_the_host_app_under_its_prefix(host):
    ws_url = host.replace("http://", "ws://") + "/collab/ws"
    async with (
        YrelayClient(ws_url, backoff=FAST_BACKOFF, token="key-ada") as writer,
        YrelayClient(ws_url, backoff=FAST_BACKOFF, token="key-bob") as reader,
    ):
        mine, theirs = await writer.subscribe("research/plan"), await reader.subscribe("research/plan")
        crdt.insert_text(mine.ydoc, 0, "written by ada")
        await writer.wait_idle()
        await eventually(lambda: theirs.text == "written by ada")
    async with httpx.AsyncClient(base_url=host) as http:
        listed = await http.get("/collab/ops/docs", headers=OPS)
        assert listed.status_code == 200
        assert [doc["doc"] for doc in listed.json()["documents"]] == ["research/plan"]
        assert (await http.get("/collab/ops/docs")).status_code == 401
        assert (await http.get("/collab/metrics", headers=OPS)).status_code == 200
        assert (await http.get("/collab/readyz")).json()["status"] == "ready"


async def test_the_hosts_own_routes_and_session_cookie_still_work(host):
    async with httpx.AsyncClient(base_url=host) as http:
        assert (await http.get("/me")).status_code == 401
        assert (await http.get("/me", headers={"Authorization": "Bearer key-bob"})).json()["user"] == "bob"
        assert (await http.post("/login", json={"name": "ada"})).status_code == 200
        assert (await http.get("/me")).json() == {"user": "ada", "documents": "research/*", "editor": True}
        cookie = f"session={http.cookies['session']}"
    ws_url = host.replace("http://", "ws://") + "/collab/ws"
    ws, welcome = await hello(ws_url, additional_headers={"Cookie": cookie})  # what a browser on the origin sends
    assert welcome["op"] == "welcome"
    assert welcome["auth"] == {"mode": "custom", "subject": "ada", "permission": "write"}
    await ws.close()  # type: ignore[attr-defined]


async def test_a_client_without_the_hosts_credentials_is_refused(host):
    ws_url = host.replace("http://", "ws://") + "/collab/ws"
    ws, refused = await hello(ws_url)
    assert refused["op"] == "error" and refused["code"] == "unauthorized" and refused["message"] == "log in first"
    assert await close_code(ws) == 4401
    ws, refused = await hello(ws_url, token="stolen-guess")
    assert refused["code"] == "unauthorized" and await close_code(ws) == 4401
    with pytest.raises(InvalidStatus):  # the relay lives under the prefix only
        await websockets.connect(host.replace("http://", "ws://") + "/ws")


async def test_read_only_users_of_the_host_cannot_write(host):
    ws_url = host.replace("http://", "ws://") + "/collab/ws"
    ws, welcome = await hello(ws_url, token="key-bob")
    assert welcome["auth"]["permission"] == "read"
    await ws.send(json.dumps({"op": "subscribe", "doc": "sales/q3"}))  # type: ignore[attr-defined]
    refused = json.loads(await asyncio.wait_for(ws.recv(), 5))  # type: ignore[attr-defined]
    assert refused["op"] == "error" and refused["code"] == "forbidden"
    await ws.close()  # type: ignore[attr-defined]


async def test_a_relay_whose_lifespan_was_not_entered_says_so(redis_url):
    relay = Relay(Settings(ops_token="t"), redis_url=redis_url)
    app = FastAPI()  # no lifespan: the host forgot relay.lifespan()
    app.include_router(relay.router, prefix="/deep/er")
    async with serving(app) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            answer = await http.get("/deep/er/ops/docs", headers={"Authorization": "Bearer t"})
        assert answer.status_code == 503 and "relay.lifespan()" in answer.text
        with pytest.raises(InvalidStatus):
            await websockets.connect(base.replace("http://", "ws://") + "/deep/er/ws")


async def test_two_relays_in_one_app_each_serve_their_own_settings(redis_url):
    first = Relay(Settings(ops_token="one", insecure_no_auth=True), redis_url=redis_url)
    second = Relay(Settings(ops_token="two", insecure_no_auth=True), redis_url=redis_url)
    app = FastAPI()
    app.include_router(first.router, prefix="/a")
    app.include_router(second.router, prefix="/b")
    async with first.lifespan(), second.lifespan(), serving(app) as base:
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/a/ops/docs", headers={"Authorization": "Bearer one"})).status_code == 200
            assert (await http.get("/a/ops/docs", headers={"Authorization": "Bearer two"})).status_code == 403
            assert (await http.get("/b/ops/docs", headers={"Authorization": "Bearer two"})).status_code == 200
        ws, welcome = await hello(base.replace("http://", "ws://") + "/b/ws")  # routed: include_router only
        assert welcome["op"] == "welcome"
        await ws.close()  # type: ignore[attr-defined]


async def test_the_hosts_middleware_still_sees_the_installed_websocket(redis_url):
    seen: list[str] = []

    def tenant_middleware(app):
        async def middleware(scope, receive, send):
            if scope["type"] == "websocket":
                seen.append(scope["path"])
                scope.setdefault("state", {})["tenant"] = "acme"
            await app(scope, receive, send)

        return middleware

    async def authenticate(connection, token):
        return Principal.of(connection.state.tenant, [f"{connection.state.tenant}/*"], "write")

    relay = Relay(Settings(), redis_url=redis_url, authenticate=authenticate)
    app = FastAPI()
    relay.install(app, prefix="/collab")
    app.add_middleware(tenant_middleware)  # added after install: still outside the websocket
    async with relay.lifespan(), serving(app) as base:
        ws, welcome = await hello(base.replace("http://", "ws://") + "/collab/ws")
        assert welcome["auth"]["subject"] == "acme" and seen == ["/collab/ws"]
        await ws.close()  # type: ignore[attr-defined]


async def test_the_hosts_function_refuses_with_auth_error_or_http_401_403():
    async def check(connection, token):
        if token == "forbidden":
            raise HTTPException(403, "not your team")
        if token == "broken":
            raise HTTPException(500, "database down")
        if connection.headers.get("x-user") != "ada":
            raise AuthError("who are you?")
        return Principal.of("ada", ["*"], "write")

    authenticator = HostAuthenticator(check)
    assert (await authenticator.authenticate(None, {"X-User": "ada"})).subject == "ada"
    with pytest.raises(AuthError, match="who are you"):
        await authenticator.authenticate(None, {})
    with pytest.raises(AuthError, match="not your team"):
        await authenticator.authenticate("forbidden", {"X-User": "ada"})
    with pytest.raises(HTTPException):  # not a refusal: an internal error frame, logged
        await authenticator.authenticate("broken", {"X-User": "ada"})


def test_a_relay_needs_a_redis_and_one_kind_of_auth(monkeypatch):
    monkeypatch.delenv("YRELAY_REDIS_URL", raising=False)
    with pytest.raises(ValueError, match="YRELAY_REDIS_URL"):
        Relay(Settings())
    with pytest.raises(ValueError, match="not both"):
        Relay(Settings(), redis_url="redis://x", authenticator=HostAuthenticator(None), authenticate=lambda c, t: None)  # type: ignore[arg-type]


def test_docs_embedding_md_shows_the_example_that_runs():
    """The walk-through's listing is this very file, so it cannot drift."""
    doc = (EXAMPLE.parents[1] / "embedding.md").read_text()
    listing = doc.split("<!-- example: docs/examples/embed_fastapi.py -->\n```python\n", 1)[1].split("```\n", 1)[0]
    assert listing == EXAMPLE.read_text()


def test_install_refuses_an_app_that_started():
    app = FastAPI()
    app.middleware_stack = app.build_middleware_stack()  # what its first call does
    with pytest.raises(RuntimeError, match="before the app starts"):
        Relay(Settings(), redis_url="redis://unused").install(app, prefix="/collab")


async def test_a_plain_function_runs_in_the_thread_pool():
    loop_thread = threading.get_ident()
    ran_in: list[int] = []

    def check(connection, token):  # a blocking user lookup, as a sync FastAPI dependency would do
        ran_in.append(threading.get_ident())
        if token != "ok":
            raise HTTPException(401, "no such key")
        return Principal.of("sync-user", ["*"], "read")

    authenticator = HostAuthenticator(check)
    assert (await authenticator.authenticate("ok", {})).subject == "sync-user"
    with pytest.raises(AuthError, match="no such key"):
        await authenticator.authenticate("bad", {})
    assert ran_in and loop_thread not in ran_in
