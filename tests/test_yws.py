"""/yws/{doc}: the y-websocket protocol over the same write path, stream
and presence relay as /ws (issue 19)."""

from __future__ import annotations

import asyncio

import pycrdt
import pytest
import websockets

from conftest import eventually, running_server
from yrelay.auth import issue_token
from yrelay.storage.append import append_one
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt, yprotocol
from ywspeer import REFUSED_AFTER_ACCEPT, YwsPeer, untracked_subscription

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
        with pytest.raises(REFUSED_AFTER_ACCEPT):
            await YwsPeer.connect(base, "ro-doc?token=not-a-jwt")
        with pytest.raises(REFUSED_AFTER_ACCEPT):  # this token may not read that document
            await YwsPeer.connect(base, f"other?token={tokens['write']}")
        await writer.close()
        await reader.close()


async def test_an_update_that_cannot_be_stored_closes_the_socket(redis_url):
    async with running_server(redis_url) as url:
        base = http(url)
        peer = await YwsPeer.connect(base, "refused")
        await peer.ws.send(yprotocol.sync_update(b"\x01\x01\x05\x00\x99\x99"))  # not a Yjs update
        await eventually(lambda: peer.closed is not None)
        assert peer.closed[0] == 4500 and peer.closed[1].startswith("invalid_update")
        # An update that builds on content the document lacks: missing_dependency, nothing stored.
        source = pycrdt.Doc(client_id=7)
        text = source.get("text", type=pycrdt.Text)
        text += "first"
        state = source.get_state()
        text += " second"
        gap = await YwsPeer.connect(base, "refused")
        await gap.ws.send(yprotocol.sync_update(source.get_update(state)))
        await eventually(lambda: gap.closed is not None)
        assert gap.closed[0] == 4500 and gap.closed[1].startswith("missing_dependency"), gap.closed
        assert await stored(redis_url, "refused") == ""
        # The reconnect sync sends what the socket lost: a step 2 of everything the server lacks.
        again = await YwsPeer.connect(base, "refused")
        again.doc.apply_update(source.get_update())
        await again.ws.send(yprotocol.sync_step2(again.doc.get_update(b"\x00")))
        await eventually(lambda: False if again.closed else True)
        for _ in range(100):
            if await stored(redis_url, "refused") == "first second":
                break
            await asyncio.sleep(0.05)
        assert await stored(redis_url, "refused") == "first second"


async def test_hostile_messages_close_cleanly_and_store_nothing(redis_url):
    hostile = [
        b"",
        b"\x80",
        b"\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f",
        b"\x09",
        b"\x00\x07\x00",
        b"\x00\x00\x05\x01\xff\xff\xff\xff\x0f",  # a state vector with a huge count
        b"\x00\x00\x0a\x01\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # a clock past 2^53
        b"\x00\x02\x03\x01\x01\x01",
        "text, not binary",
    ]
    async with running_server(redis_url) as url:
        for message in hostile:
            async with websockets.connect(f"{http(url)}/yws/hostile") as ws:
                await ws.send(message)
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    while True:
                        await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd.code in (1002, 1003, 4500), (message, closed.value.rcvd)
        survivor = await YwsPeer.connect(http(url), "hostile")  # the server still serves
        await survivor.edit("fine")
        await eventually(lambda: str(survivor.text) == "fine")
        for _ in range(100):
            if await stored(redis_url, "hostile") == "fine":
                break
            await asyncio.sleep(0.05)
        assert await stored(redis_url, "hostile") == "fine"
        await survivor.close()


def test_the_token_parameter_is_taken_out_of_the_scope() -> None:
    from yrelay.app.wire.yws_endpoint import take_token

    scope = {"query_string": b"a=1&token=eyJsecret&b=2"}
    assert take_token(scope) == "eyJsecret"
    assert scope["query_string"] == b"a=1&b=2"
    assert take_token({"query_string": b""}) is None


async def test_the_query_token_never_reaches_a_log_line(redis_url, tmp_path):
    """The server's own log at info level, uvicorn's websocket lines included."""
    import os
    import subprocess
    import sys

    from yrelay_tools.testing.processes import free_port, terminate, wait_ready

    token = issue_token(SECRET, "logger", ["*"], "write")
    port, log_path = free_port(), tmp_path / "server.log"
    env = {**os.environ, "YRELAY_INSECURE_NO_AUTH": "0", "YRELAY_AUTH_SECRET": SECRET}
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: ASYNC220 - started, not waited on: the test talks to it over HTTP
            [
                sys.executable,
                "-m",
                "yrelay",
                "serve",
                "--port",
                str(port),
                "--redis-url",
                redis_url,
                "--log-level",
                "debug",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_ready(port, process, 20, log_path)
        base = f"ws://127.0.0.1:{port}"
        peer = await YwsPeer.connect(base, f"logged?room=1&token={token}")
        await peer.edit("x")
        await peer.close()
        with pytest.raises(REFUSED_AFTER_ACCEPT):  # refused: a wrong token, and a foreign origin
            await YwsPeer.connect(base, f"logged?token={token}x")
        with pytest.raises(websockets.InvalidStatus):
            await YwsPeer.connect(base, f"logged?token={token}", origin="https://evil.example")
        await asyncio.sleep(0.3)
    finally:
        terminate(process, 10)
    text = log_path.read_text()
    assert token not in text and token.split(".")[2] not in text
    # uvicorn's "[accepted]" line: the token taken out of the URL, not merely masked by the formatter
    # (at debug level the websockets library logs the raw request line: that one is masked)
    accepted = [line for line in text.splitlines() if "/yws/logged" in line and "[accepted]" in line]
    assert accepted and all("token" not in line for line in accepted), text[-3000:]
    assert any("/yws/logged?room=1" in line for line in accepted)


async def test_a_trim_past_the_feeds_cursor_closes_the_connection(redis_url):
    """GC trimmed entries this (untracked) connection was never sent: it
    must close, so the client resyncs, never skip them silently."""
    from yrelay.app.context import ServerContext
    from yrelay.app.core.subscription import SubscriptionState
    from yrelay.app.wire.yws import CLOSE_TRIMMED
    from yrelay.config import Settings
    from yrelay.storage.keys import meta_key
    from yrelay.storage.offsets import StreamId

    ctx = await ServerContext.open(Settings.from_env(insecure_no_auth=True), redis_url)
    try:
        source = pycrdt.Doc(client_id=5)
        text = source.get("text", type=pycrdt.Text)
        ids = []
        for word in ("a", "b", "c"):
            state = source.get_state()
            text += word
            ids.append((await append_one(ctx.store, "trimmed", "writer", len(ids), source.get_update(state)))[0])

        await ctx.redis.hset(meta_key("trimmed"), "trimmed_through", ids[1])  # as GC's trim leaves it
        feed, socket = untracked_subscription(ctx, "trimmed")
        await eventually(lambda: feed.state is SubscriptionState.RESYNC_REQUIRED)  # waits for the client's sync
        feed.live_from(StreamId.parse(ids[0]))  # its sync answer: the client holds only the first entry
        await eventually(lambda: socket.closed)
        assert socket.closed[0][0] == CLOSE_TRIMMED and not socket.sent
        await feed.close()
        # Not trimmed past the cursor: the rest is sent, in order.
        ok, socket = untracked_subscription(ctx, "trimmed")
        await eventually(lambda: ok.state is SubscriptionState.RESYNC_REQUIRED)
        ok.live_from(StreamId.parse(ids[1]))
        await eventually(lambda: socket.sent)
        assert yprotocol.decode(socket.sent[0]).payload.endswith(b"c\x00") and not socket.closed
        await ok.close()
    finally:
        await ctx.close()


async def test_a_connection_over_the_limit_is_closed_with_the_reason(redis_url):
    async with running_server(redis_url, max_connections_per_address=1) as url:
        first = await YwsPeer.connect(http(url), "limited")
        async with websockets.connect(f"{http(url)}/yws/limited") as ws:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)  # no JSON frame a stock client would choke on
        assert ws.close_code == 1008 and "connections per address" in ws.close_reason
        assert first.closed is None
        await first.close()


async def test_each_connection_counts_as_a_live_subscription_of_its_subject(redis_url):
    async with running_server(redis_url, max_subscriptions_per_subject=1) as url:
        first = await YwsPeer.connect(http(url), "counted-a")
        async with websockets.connect(f"{http(url)}/yws/counted-b") as ws:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
        assert ws.close_code == 1013 and "live subscriptions" in ws.close_reason
        await first.close()
        await asyncio.sleep(0.2)
        again = await YwsPeer.connect(http(url), "counted-b")  # released with the connection
        await again.close()


async def test_an_update_while_redis_is_down_closes_and_the_reconnect_sync_stores_it(tmp_path):
    from yrelay.storage.embedded import RedisProcess

    redis = RedisProcess(tmp_path / "redis").start()
    try:
        async with running_server(redis.url) as url:
            peer = await YwsPeer.connect(http(url), "down")
            await asyncio.sleep(0.3)  # its feed's first read of the stream is done
            redis.kill()
            await peer.edit("while down")
            await eventually(lambda: peer.closed is not None, timeout=30)
            assert peer.closed[0] == 4500 and peer.closed[1].startswith("unavailable"), peer.closed
            redis.start()  # same port, same AOF
            again = await YwsPeer.connect(http(url), "down", ydoc=peer.doc)  # y-websocket's reconnect
            reader = await YwsPeer.connect(http(url), "down")
            await eventually(lambda: str(reader.text) == "while down", timeout=30)
            assert await stored(redis.url, "down") == "while down"
            await again.close()
            await reader.close()
    finally:
        redis.stop()


async def test_a_stream_that_went_back_closes_and_the_reconnect_sync_gives_it_back(redis_url, redis_client):
    """Redis comes back older (a restore, a failover to a lagging replica)
    while a stock peer stays connected: its connection closes (a stock
    client answers no resync request), and its reconnect sync gives the
    server back the update it lost."""
    from gcutil import dump_document
    from test_drift import restore_document
    from yrelay.app.wire.yws import CLOSE_REWOUND

    async with running_server(redis_url, gc_interval=0) as url:
        peer = await YwsPeer.connect(http(url), "back")
        await peer.edit("<before>")
        await stored_eventually(redis_url, "back", "<before>")
        backup = await dump_document(redis_client, "back")
        await peer.edit("<lost>")
        await stored_eventually(redis_url, "back", "<before><lost>")
        await restore_document(redis_client, "back", backup)
        await redis_client.client_kill_filter(_type="normal", skipme=True)  # as a restart drops them
        assert await stored(redis_url, "back") == "<before>"
        await eventually(lambda: peer.closed is not None, timeout=20)
        assert peer.closed[0] == CLOSE_REWOUND, peer.closed
        again = await YwsPeer.connect(http(url), "back", ydoc=peer.doc)  # y-websocket's reconnect
        await stored_eventually(redis_url, "back", "<before><lost>")
        await again.close()


async def stored_eventually(redis_url: str, doc: str, text: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (held := await stored(redis_url, doc)) != text:
        assert asyncio.get_running_loop().time() < deadline, f"Redis holds {held!r}, not {text!r}"
        await asyncio.sleep(0.05)
