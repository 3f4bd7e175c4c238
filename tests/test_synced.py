"""The ``synced`` frame (feature ``synced``): sent once a subscriber has been
sent everything the document had admitted when its subscribe was answered,
and after a sync reply; never before."""

from __future__ import annotations

import base64

from conftest import eventually, running_server
from gcutil import append_all, text_updates
from wsraw import RawPeer
from yrelay.gc import Collector, GcPolicy
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt


async def write(peer: RawPeer, doc: str, updates: list[bytes], first_clock: int = 1) -> list[str]:
    ids = []
    for clock, update in enumerate(updates, first_clock):
        reply = await peer.update(doc, clock, update)
        assert reply["op"] == "appended", reply
        ids.append(reply["id"])
    return ids


async def read_until_synced(peer: RawPeer) -> tuple[list[dict], dict]:
    """Frames before ``synced``, and ``synced``."""
    before = []
    while True:
        frame = await peer.recv(wanted="synced")
        if frame["op"] == "synced":
            return before, frame
        before.append(frame)


def delivered_ids(frames: list[dict]) -> list[str]:
    return [entry["id"] for frame in frames if frame["op"] == "deliver" for entry in frame["entries"]]


async def test_synced_follows_the_catch_up_through_the_head(redis_url):
    updates, text = text_updates(600)
    async with running_server(redis_url, page_size=100) as url:
        writer = await RawPeer.connect(url)
        await writer.send({"op": "subscribe", "doc": "s"})
        await writer.expect("subscribed")
        ids = await write(writer, "s", updates)
        reader = await RawPeer.connect(url)
        await reader.send({"op": "subscribe", "doc": "s"})
        before, synced = await read_until_synced(reader)
        assert before[0]["op"] == "subscribed"
        assert synced == {"op": "synced", "doc": "s", "offset": ids[-1]}
        assert delivered_ids(before) == ids  # all of it, before synced
        doc = crdt.new_doc()
        for frame in before:
            for entry in frame.get("entries", []):
                crdt.apply_update(doc, base64.b64decode(entry["update"]))
        assert crdt.text_of(doc) == text


async def test_an_empty_document_is_synced_at_once(server_url):
    peer = await RawPeer.connect(server_url)
    await peer.send({"op": "subscribe", "doc": "empty"})
    before, synced = await read_until_synced(peer)
    assert [frame["op"] for frame in before] == ["subscribed"] and synced["offset"] == "0-0"


async def test_a_resumed_subscription_is_synced_past_its_own_entries(redis_url):
    """The session's own entries are not delivered back on a resume; the
    head is still reached (the cursor covers them)."""
    updates, _ = text_updates(6)
    async with running_server(redis_url) as url:
        other, own = await RawPeer.connect(url), await RawPeer.connect(url)
        for peer in (other, own):
            await peer.send({"op": "subscribe", "doc": "r"})
            await peer.expect("subscribed")
        first = await write(other, "r", updates[:2])
        mine = await write(own, "r", updates[2:], first_clock=1)
        await own.close()
        again = await RawPeer.connect(url, session=own.session)
        await again.send({"op": "subscribe", "doc": "r", "offset": first[0]})
        before, synced = await read_until_synced(again)
        assert synced["offset"] == mine[-1]
        assert delivered_ids(before) == [first[1]]  # its own four were not sent back


async def test_synced_follows_a_sync_reply(redis_url):
    updates, text = text_updates(3)
    async with running_server(redis_url) as url:
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "y"})
        await peer.expect("subscribed")
        ids = await write(peer, "y", updates)
        last = StreamId.parse(ids[-1])
        ahead = str(StreamId(last.ms + 1, 0))
        again = await RawPeer.connect(url)
        await again.send({"op": "subscribe", "doc": "y", "offset": ahead})  # past the stream: resync
        assert (await again.expect("resync_required"))["reason"] == "ahead"
        await again.nothing(0.3)
        await again.send({"op": "sync", "doc": "y", "state_vector": base64.b64encode(b"\x00").decode()})
        before, synced = await read_until_synced(again)
        assert [frame["op"] for frame in before] == ["sync_reply"] and synced["offset"] == ids[-1]
        doc = crdt.new_doc()
        crdt.apply_update(doc, base64.b64decode(before[0]["update"]))
        assert crdt.text_of(doc) == text


# ------------------------------------------------------------ the Python client


async def text_when_synced(url: str, make_client, doc: str, expected: str) -> str:
    """A new client subscribes: the text its document held the moment it
    reported synced (it ends with ``expected``)."""
    seen: list[str] = []
    client = await make_client(
        url,
        on_event=lambda name, data: (
            seen.append(client.docs[doc].text) if name == "synced" and data["doc"] == doc else None
        ),
    )
    assert "synced" in client.features
    subscribed = await client.subscribe(doc, timeout=60)
    at_return = subscribed.text  # a client without the synced frame emits no event on `subscribed`
    await eventually(lambda: subscribed.text == expected, timeout=30)
    return seen[0] if seen else at_return


async def test_synced_waits_for_5000_prior_updates(redis_url, redis_client, make_client):
    updates, text = text_updates(5_000)
    store = DocumentStore(redis_client)
    await store.load_scripts()
    await append_all(store, "long", updates)
    async with running_server(redis_url, gc_interval=0) as url:
        at_synced = await text_when_synced(url, make_client, "long", text)
    assert len(text) > 25_000 and at_synced == text


async def test_synced_waits_for_the_snapshot_and_the_newer_updates(redis_url, redis_client, make_client):
    updates, text = text_updates(5_000)
    store = DocumentStore(redis_client)
    await store.load_scripts()
    await append_all(store, "folded", updates[:3_000])
    [report] = await Collector(redis_client, GcPolicy()).collect(["folded"])
    assert report.folded == 3_000
    await append_all(store, "folded", updates[3_000:])
    async with running_server(redis_url, gc_interval=0) as url:
        at_synced = await text_when_synced(url, make_client, "folded", text)
    assert at_synced == text
