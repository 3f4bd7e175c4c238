"""Issue 36's hostile client, from the outside, against one real server
process with JWT auth: what ``tests/test_core_attacks.py`` does not try.

The findings fixed here. Updates in parts left half-sent: All connections of
a process hold at most 256 MiB of parts, but nothing bounded one user's
share: 17 connections of one token, each holding 15 MiB of an update it
never finished, took the whole budget (the server's RSS went from 79 MB to
424 MB) for as long as they stayed open, and every other user's update in
parts was refused ``unavailable`` all that time. Now one user holds at most
four updates' worth (``SUBJECT_UPDATES_IN_PARTS`` x ``max_update_bytes``);
past it only its own parts are refused. And ``/ops`` bodies: one that was
not UTF-8 was answered 500 with a traceback in the log (FastAPI's 422
encoder decodes the echoed body as UTF-8), and unknown fields were ignored,
so ``POST /ops/gc {"docs": ["a"]}`` (a misspelt ``doc``) collected every
document.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from redis.asyncio import Redis

from test_update_parts import SLICE, big_update, part_frames
from yrelay.app.core.update_parts import SUBJECT_UPDATES_IN_PARTS
from yrelay.auth import issue_token
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.keys import session_documents_key, tracker_key
from yrelay_tools.testing.processes import ServerProcess

SECRET = "attacks36-secret-0123456789abcdef0123456"
MAX_UPDATE_BYTES = 20_000
ENV = {
    "YRELAY_INSECURE_NO_AUTH": "0",
    "YRELAY_AUTH_SECRET": SECRET,
    "YRELAY_GC_INTERVAL": "0",
    "YRELAY_MAX_FRAME_BYTES": "4096",  # a few kilobytes need parts (SLICE fits a frame)
    "YRELAY_MAX_UPDATE_BYTES": str(MAX_UPDATE_BYTES),
    "YRELAY_OPS_TOKEN": "attacks36-ops-token-0123456789abcdef",
}


@pytest.fixture(scope="module")
def server(redis_process: RedisProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(redis_process.url, tmp_path_factory.mktemp("attacks36"), env=ENV).start()
    try:
        yield process
    finally:
        process.stop()


async def opened(server: ServerProcess, subject: str, doc: str) -> Any:
    """A socket of ``subject`` (a token for every document), subscribed to ``doc``."""
    ws = await websockets.connect(server.ws_url)
    await ws.send(json.dumps({"op": "hello", "token": issue_token(SECRET, subject, ["*"], "write", 600)}))
    assert json.loads(await ws.recv())["op"] == "welcome"
    await ws.send(json.dumps({"op": "subscribe", "doc": doc}))
    while json.loads(await asyncio.wait_for(ws.recv(), 30))["op"] != "synced":
        pass
    return ws


async def answers(ws: Any, quiet: float = 0.5) -> list[dict[str, Any]]:
    """What the server sends until it is quiet for ``quiet`` s."""
    received: list[dict[str, Any]] = []
    try:
        while True:
            received.append(json.loads(await asyncio.wait_for(ws.recv(), quiet)))
    except TimeoutError:
        pass
    return received


async def test_one_user_holding_half_sent_updates_cannot_refuse_everyone_elses(server):
    held_parts = 7  # of 10 declared: never finished
    share = SUBJECT_UPDATES_IN_PARTS * MAX_UPDATE_BYTES
    assert SUBJECT_UPDATES_IN_PARTS * held_parts * SLICE <= share < (SUBJECT_UPDATES_IN_PARTS + 1) * held_parts * SLICE
    attackers = [await opened(server, "mallory", f"half-sent-{i}") for i in range(SUBJECT_UPDATES_IN_PARTS + 1)]
    try:
        refused: list[dict[str, Any]] = []
        for index, ws in enumerate(attackers):
            for part in range(held_parts):
                frame = {"op": "update", "doc": f"half-sent-{index}", "clock": 1, "part": part, "parts": 10}
                await ws.send(json.dumps({**frame, "update": base64.b64encode(os.urandom(SLICE)).decode()}))
            errors = [answer for answer in await answers(ws) if answer["op"] == "error"]
            if index < SUBJECT_UPDATES_IN_PARTS:
                assert errors == [], errors  # within the user's share: kept
            refused += errors
        assert [(e["code"], e["doc"], e["clock"]) for e in refused] == [("unavailable", "half-sent-4", 1)]
        assert refused[0]["message"] == "your connections hold too many updates in parts; resend later"

        victim = await opened(server, "victim", "victims-paste")  # another user: its parts fit
        try:
            update = big_update(12_000)
            for frame in part_frames("victims-paste", 1, update):
                await victim.send(json.dumps(frame))
            (answer,) = [a for a in await answers(victim) if a["op"] != "deliver"]
            assert (answer["op"], answer["clock"]) == ("appended", 1), answer
        finally:
            await victim.close()
    finally:
        for ws in attackers:
            await ws.close()


@pytest.mark.parametrize(
    ("path", "misspelt"),
    [("/ops/gc", {"docs": ["a"]}), ("/ops/tokens/revoke", {"jti": "a", "expires": 2_000_000_000})],
)
async def test_ops_bodies_that_are_not_utf8_or_misspelt_are_refused_422(server, path, misspelt):
    headers = {"Authorization": f"Bearer {ENV['YRELAY_OPS_TOKEN']}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", headers=headers) as ops:
        for body in (b"\xff\xfe", b'"\xff"', b'{"jti": "\xff", "expires_at": 1}'):
            response = await ops.post(path, content=body)
            assert response.status_code == 422, (body, response.status_code, response.text)
            assert response.json()["detail"][0]["type"] == "json_invalid"
        response = await ops.post(path, json=misspelt)  # was: every document collected; kept 30 days, not until exp
        assert response.status_code == 422, response.text
        assert [error["loc"] for error in response.json()["detail"]] == [["body", list(misspelt)[-1]]]


async def test_a_reader_that_opens_empty_documents_and_leaves_leaves_nothing_in_redis(server, redis_process):
    """Every empty document a read-only token subscribed to and left kept a
    tracker entry and a session-set member for good (5,710 keys from 3
    connections in 30 s, none collected by GC). Now the tracking of a
    document nothing was written to goes with the connection; a document
    with entries keeps it, so a reconnect resumes from its offset."""
    writer = await opened(server, "writer", "kept-doc")
    await writer.send(json.dumps({"op": "update", "doc": "kept-doc", "clock": 1, "update": b64(big_update(50))}))
    assert [a["op"] for a in await answers(writer) if a["op"] == "appended"] == ["appended"]
    await writer.close()

    ghosts = [f"ghost-{i}" for i in range(40)]
    reader = await websockets.connect(server.ws_url)
    await reader.send(json.dumps({"op": "hello", "token": issue_token(SECRET, "reader", ["*"], "read", 600)}))
    session = json.loads(await reader.recv())["session"]
    for doc in [*ghosts, "kept-doc"]:
        await reader.send(json.dumps({"op": "subscribe", "doc": doc}))
    synced = {answer["doc"] for answer in await answers(reader) if answer["op"] == "synced"}
    assert synced == {*ghosts, "kept-doc"}
    redis = Redis.from_url(redis_process.url)
    try:
        assert await redis.zscore(tracker_key("ghost-0"), session) is not None  # tracked while connected
        await reader.close()
        deadline = asyncio.get_running_loop().time() + 30  # the disconnect is handled after the close: wait for it
        while await _tracked_documents(redis, session) != {b"kept-doc"}:
            assert asyncio.get_running_loop().time() < deadline, await _tracked_documents(redis, session)
            await asyncio.sleep(0.02)
        assert await redis.exists(*(tracker_key(doc) for doc in ghosts)) == 0
        assert await redis.zscore(tracker_key("kept-doc"), session) is not None
    finally:
        await redis.aclose()


async def _tracked_documents(redis: Redis, session: str) -> set[bytes]:
    return set(await redis.zrange(session_documents_key(session), 0, -1))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_the_server_survived_and_logged_no_traceback(server):
    assert server.running
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
