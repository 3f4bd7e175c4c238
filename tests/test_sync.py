"""Core delivery over a real server and a real redis-server."""

import asyncio

from conftest import eventually, running_server
from wsraw import RawPeer
from yrelay.storage.offsets import StreamId
from yrelay.yjs import crdt
from yrelay_tools.testing.checker import check_delivery


def make_update(text: str, client_id: int = 1) -> bytes:
    doc = crdt.new_doc(client_id)
    crdt.insert_text(doc, 0, text)
    return crdt.encode_state(doc)


async def test_two_clients_converge_and_a_late_joiner_gets_everything(server_url, make_client):
    alice, bob = await make_client(server_url), await make_client(server_url)
    a, b = await alice.subscribe("notes"), await bob.subscribe("notes")
    for i in range(20):
        crdt.insert_text(a.ydoc, 0, f"a{i} ")
        crdt.insert_text(b.ydoc, 0, f"b{i} ")
    await alice.wait_idle(), await bob.wait_idle()
    await eventually(lambda: a.text == b.text and len(a.text) > 100)
    carol = await make_client(server_url)
    c = await carol.subscribe("notes")
    await eventually(lambda: c.text == a.text)
    report = check_delivery(
        {"alice": a.ydoc, "bob": b.ydoc, "carol": c.ydoc},
        [u.update for u in alice.acked + bob.acked],
    )
    assert report.acked_updates == 40 and "a19" in report.content and "b19" in report.content


async def test_ack_only_after_append(server_url, redis_client):
    """While Redis refuses writes, no ack; once it accepts, the ack names an
    entry that is in the stream."""
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "d"})
    await peer.expect("subscribed")
    await redis_client.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    await peer.send({"op": "update", "doc": "d", "clock": 1, "update": crdt_b64(make_update("x"))})
    await peer.nothing(timeout=0.6)
    appended = await peer.expect("appended", timeout=5)
    stream = await redis_client.xrange("yrelay:{d}:stream")
    assert [entry_id.decode() for entry_id, _ in stream] == [appended["id"]]
    await peer.close()


def crdt_b64(update: bytes) -> str:
    import base64

    return base64.b64encode(update).decode()


async def test_duplicate_sends_are_appended_once(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "d"})
    await peer.expect("subscribed")
    first = await peer.update("d", 7, make_update("once"))
    again = await peer.update("d", 7, make_update("once"))
    assert first["duplicate"] is False and again["duplicate"] is True
    assert again["id"] == first["id"]
    assert await redis_client.xlen("yrelay:{d}:stream") == 1
    # same clock from another session is another update
    other = await RawPeer.connect(server_url)
    await other.send({"op": "subscribe", "doc": "d"})
    await other.expect("subscribed")
    assert (await other.update("d", 7, make_update("twice", 2)))["duplicate"] is False
    assert await redis_client.xlen("yrelay:{d}:stream") == 2


async def test_unacked_entries_are_resent_on_reconnect_and_on_a_timer(server_url):
    writer = await RawPeer.connect(server_url)
    reader = await RawPeer.connect(server_url)
    for peer in (writer, reader):
        await peer.send({"op": "subscribe", "doc": "d"})
        await peer.expect("subscribed")
    first = await writer.update("d", 1, make_update("one"))
    delivered = await reader.expect("deliver")
    assert [e["id"] for e in delivered["entries"]] == [first["id"]]
    # no ack: the quiet-document timer resends it (resend_after = 0.5 s)
    again = await reader.expect("deliver", timeout=3)
    assert [e["id"] for e in again["entries"]] == [first["id"]]
    # disconnect without acking, reconnect with the same session and no newer offset
    session = reader.session
    await reader.close()
    second = await writer.update("d", 2, make_update("two", 2))
    reader = await RawPeer.connect(server_url, session=session)
    await reader.send({"op": "subscribe", "doc": "d", "offset": "0-0"})
    await reader.expect("subscribed")
    ids = []
    while len(ids) < 2:
        ids += [e["id"] for e in (await reader.expect("deliver"))["entries"]]
    assert ids == [first["id"], second["id"]]
    await reader.send({"op": "ack", "doc": "d", "offset": second["id"]})
    await reader.nothing(timeout=1.2)  # acked: no more resends


async def test_own_updates_are_not_echoed_and_do_not_hold_the_offset_back(server_url, redis_client):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "solo"})
    await peer.expect("subscribed")
    ids = [(await peer.update("solo", clock, make_update(f"u{clock}", clock)))["id"] for clock in range(1, 6)]
    await peer.nothing(timeout=0.5)  # never echoed
    score = lambda: redis_client.zscore("yrelay:{solo}:tracker", peer.session)  # noqa: E731
    deadline = asyncio.get_running_loop().time() + 5
    while await score() != StreamId.parse(ids[-1]).score():
        assert asyncio.get_running_loop().time() < deadline, "tracker never reached the writer's last entry"
        await asyncio.sleep(0.05)


async def test_a_fresh_subscribe_gets_the_sessions_own_earlier_entries(server_url):
    """A subscribe without an offset holds nothing, not even what this session
    wrote before (a document unbound and bound again, a page that lost its
    state): it gets its own entries already in the stream, and only those."""
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "rebound"})
    await peer.expect("subscribed")
    first = await peer.update("rebound", 1, make_update("mine", 1))
    await peer.send({"op": "unsubscribe", "doc": "rebound"})
    await peer.expect("unsubscribed")
    await peer.send({"op": "subscribe", "doc": "rebound"})
    await peer.expect("subscribed")
    delivered = await peer.expect("deliver")
    assert [entry["id"] for entry in delivered["entries"]] == [first["id"]]
    await peer.send({"op": "ack", "doc": "rebound", "offset": first["id"]})  # else resent 0.5 s on: not an echo
    await peer.update("rebound", 2, make_update("later", 2))
    await peer.nothing(timeout=0.5)  # what it writes from now on is not echoed


async def test_several_documents_on_one_socket(server_url, make_client):
    alice, bob = await make_client(server_url), await make_client(server_url)
    docs_a = [await alice.subscribe(f"doc-{i}") for i in range(5)]
    docs_b = [await bob.subscribe(f"doc-{i}") for i in range(5)]
    for i, doc in enumerate(docs_a):
        crdt.insert_text(doc.ydoc, 0, f"content of {i}")
    await eventually(lambda: [d.text for d in docs_b] == [f"content of {i}" for i in range(5)])


async def test_catch_up_is_paginated(redis_url, make_client):
    async with running_server(redis_url, page_size=100) as url:
        writer = await make_client(url)
        doc = await writer.subscribe("big")
        for _ in range(1000):
            crdt.insert_text(doc.ydoc, 0, "x")
        await writer.wait_idle()
        frames: list[int] = []
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "big", "offset": "0-0"})
        await peer.expect("subscribed")
        received = 0
        while received < 1000:
            frame = await peer.expect("deliver")
            frames.append(len(frame["entries"]))
            received += len(frame["entries"])
            await peer.send({"op": "ack", "doc": "big", "offset": frame["entries"][-1]["id"]})
        assert received == 1000 and max(frames) <= 100 and len(frames) >= 10


async def test_session_resume_keeps_the_session_id(server_url, make_client):
    client = await make_client(server_url)
    doc = await client.subscribe("r")
    session = client.session
    crdt.insert_text(doc.ydoc, 0, "before")
    await client.wait_idle()
    await client.drop_connection()
    await eventually(lambda: not client.connected.is_set(), timeout=5)
    await asyncio.wait_for(client.connected.wait(), 10)
    assert client.session == session
    crdt.insert_text(doc.ydoc, 0, "after ")
    await client.wait_idle()
    other = await make_client(server_url)
    seen = await other.subscribe("r")
    await eventually(lambda: seen.text == "after before")
