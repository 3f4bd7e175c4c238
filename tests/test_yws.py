"""/yws/{doc}: the y-websocket protocol over the same write path, stream
and presence relay as /ws (issue 19)."""

from __future__ import annotations

import pycrdt
import pytest
import websockets
from conftest import eventually, running_server
from ywspeer import YwsPeer

from yrelay import crdt, yprotocol
from yrelay.auth import issue_token
from yrelay.store import DocumentStore

SECRET = "yws-test-secret-0123456789abcdef0123456"


def http(url: str) -> str:
    return url.removesuffix("/ws")


async def stored(redis_url: str, doc: str) -> str:
    from redis.asyncio import Redis
    redis = Redis.from_url(redis_url)
    try:
        ydoc, _ = await DocumentStore(redis).load_document(doc)
        return crdt.text_of(ydoc)
    finally:
        await redis.aclose()


async def test_stock_peers_and_a_ws_client_converge(redis_url, make_client):
    async with running_server(redis_url) as url:
        base = http(url)
        a = await YwsPeer.connect(base, "team/notes")
        b = await YwsPeer.connect(base, "team/notes")
        client = await make_client(url)
        c = await client.subscribe("team/notes")
        await a.edit("hello ")
        await eventually(lambda: str(b.text) == "hello " and c.text == "hello ")
        crdt.insert_text(c.ydoc, len(c.text), "from ws ")
        await b.edit("and b")
        await eventually(lambda: str(a.text) == str(b.text) == c.text and len(c.text) == 19)
        assert await stored(redis_url, "team/notes") == c.text  # stored before anyone saw it
        for peer in (a, b):
            assert peer.closed is None
            await peer.close()


async def test_step1_is_answered_with_exactly_the_diff(redis_url):
    async with running_server(redis_url) as url:
        a = await YwsPeer.connect(http(url), "diff")
        await a.edit("one ")
        await a.edit("two")
        b = await YwsPeer.connect(http(url), "diff")
        await eventually(lambda: str(b.text) == "one two")  # stored: b has it from the stream
        held = pycrdt.Doc()
        async with websockets.connect(f"{http(url)}/yws/diff") as ws:
            await ws.send(yprotocol.sync_step1(held.get_state()))
            full = yprotocol.decode(await ws.recv())
        held.apply_update(full.payload)
        assert str(held.get("text", type=pycrdt.Text)) == "one two"
        before = held.get_state()
        await a.edit(" three")
        await eventually(lambda: str(b.text) == "one two three")
        async with websockets.connect(f"{http(url)}/yws/diff") as ws:
            await ws.send(yprotocol.sync_step1(before))
            diff = yprotocol.decode(await ws.recv())
        assert diff.step is yprotocol.SyncStep.STEP2
        assert diff.payload == a.doc.get_update(before)  # only " three"
        assert len(diff.payload) < len(full.payload)
        await a.close()
        await b.close()


async def test_read_only_token_is_denied_and_nothing_stored(redis_url):
    tokens = {p: issue_token(SECRET, p, ["ro*"], p) for p in ("read", "write")}
    async with running_server(redis_url, insecure_no_auth=False, auth_secret=SECRET) as url:
        base = http(url)
        writer = await YwsPeer.connect(base, f"ro-doc?token={tokens['write']}")
        reader = await YwsPeer.connect(base, "ro-doc", subprotocols=["yrelay.yws", f"yrelay.auth.{tokens['read']}"])
        assert reader.ws.subprotocol == "yrelay.yws"
        await writer.edit("kept")
        await eventually(lambda: str(reader.text) == "kept")
        await reader.edit(" never")
        await eventually(lambda: reader.denied)
        assert "read-only" in reader.denied[0]
        await writer.edit("!")
        await eventually(lambda: "!" in str(reader.text))  # stored after the refused one
        assert await stored(redis_url, "ro-doc") == "kept!"
        assert reader.closed is None  # refused, not cut off
        with pytest.raises(Exception):
            await YwsPeer.connect(base, "ro-doc?token=not-a-jwt")
        with pytest.raises(Exception):  # this token may not read that document
            await YwsPeer.connect(base, f"other?token={tokens['write']}")
        await writer.close()
        await reader.close()
