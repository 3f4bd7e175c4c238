"""Bugs the fault-injection suite found, each pinned by a small test."""

from __future__ import annotations

import redis.exceptions

from conftest import eventually, running_server
from gcutil import append_all
from wsraw import RawPeer
from yrelay import protocol
from yrelay.storage.append import append_one
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt


async def test_a_sync_that_meets_a_redis_error_is_answered_when_redis_is_back(redis_url, make_client, monkeypatch):
    """Found by a chaos run (redis-kill right after a GC trim): the server took
    the client's sync request, failed to load the document, and forgot the
    request; the client, which sends ``sync`` once and waits, stayed
    unsynced for good."""
    async with running_server(redis_url, gc_interval=0) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("doc"), await reader.subscribe("doc")
        crdt.insert_text(wdoc.ydoc, 0, "<before>")
        await writer.wait_idle()
        await eventually(lambda: rdoc.text == "<before>")

        load_entries = DocumentStore.load_entries  # what a sync answer reads
        failures = []

        async def fails_once(self, doc, page_size=500):
            if not failures:
                failures.append(doc)
                raise redis.exceptions.ConnectionError("Connection closed by server.")
            return await load_entries(self, doc, page_size)

        monkeypatch.setattr(DocumentStore, "load_entries", fails_once)
        synced: list[dict] = []
        reader.on_event = lambda name, data: synced.append(data) if name == "synced" else None
        rdoc.synced.clear()
        reader._request_sync(rdoc)
        await eventually(lambda: synced and rdoc.synced.is_set(), timeout=15)
        assert failures == ["doc"]
        crdt.insert_text(wdoc.ydoc, 0, "<after>")
        await eventually(lambda: rdoc.text == "<after><before>")


def dependent_updates() -> list[bytes]:
    """Two updates of one Yjs client; the second builds on the first."""
    doc = crdt.new_doc(7)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    crdt.insert_text(doc, 0, "<first>")
    crdt.insert_text(doc, 7, "<second>")
    return updates


async def test_a_loaded_document_stops_its_offset_before_an_entry_it_cannot_hold_yet(redis_client):
    store = DocumentStore(redis_client)
    first, second = dependent_updates()
    [early] = [StreamId.parse((await append_one(store, "d", "other", 1, b"\x00\x00"))[0])]
    await append_all(store, "d", [second], unchecked=True)  # stored ahead of its dependency, before admission
    ydoc, offset = await store.load_document("d")
    assert crdt.text_of(ydoc) == "" and offset == early
    last, _ = await append_one(store, "d", "writer", 1, first)
    ydoc, offset = await store.load_document("d")
    assert crdt.text_of(ydoc) == "<first><second>" and str(offset) == last


async def test_a_resync_between_an_update_and_its_late_dependency_misses_nothing(redis_url, redis_client):
    """Found by a chaos run (redis-kill): a client resynced while the stream
    held an update whose dependency was appended only later (it had been
    resent); the sync reply left the pending update out but claimed its
    offset, so the client never got it and diverged for good."""
    store = DocumentStore(redis_client)
    first, second = dependent_updates()
    async with running_server(redis_url, gc_interval=0) as url:
        await append_one(store, "doc", "other", 1, b"\x00\x00")
        [entry] = map(str, await append_all(store, "doc", [second], unchecked=True))  # stored before admission
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "doc", "offset": "9999999999999-0"})  # ahead: no deliveries
        assert (await peer.expect("resync_required"))["reason"] == "ahead"
        await peer.send({"op": "sync", "doc": "doc", "state_vector": protocol.b64encode(b"\x00")})
        reply = await peer.expect("sync_reply")
        assert StreamId.parse(reply["offset"]) < StreamId.parse(entry)
        delivered = await peer.expect("deliver")  # the pending update is sent again
        assert [item["id"] for item in delivered["entries"]] == [entry]
        await peer.close()
