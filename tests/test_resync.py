"""Resync: the client's offset is not in the stream, so it exchanges state vectors."""

from conftest import eventually
from wsraw import RawPeer
from yrelay import protocol
from yrelay.storage.offsets import StreamId
from yrelay.yjs import crdt


async def test_offset_ahead_of_the_stream_triggers_resync_both_ways(server_url, make_client, redis_client):
    """A lost tail (failover, restore): the client's offset is past the stream's
    last id. It resyncs, gets what it lacks and sends back what the server lost."""
    writer = await make_client(server_url)
    doc = await writer.subscribe("lost-tail")
    crdt.insert_text(doc.ydoc, 0, "server has this")
    await writer.wait_idle()
    survivor = await make_client(server_url)
    replica = await survivor.subscribe("lost-tail")
    await eventually(lambda: replica.text == "server has this")
    # the client also holds an edit the server "lost" and an offset past the end
    crdt.insert_text(replica.ydoc, 0, "client kept this; ")
    await survivor.wait_idle()
    await redis_client.xtrim("yrelay:{lost-tail}:stream", maxlen=1)  # the tail is gone
    last = StreamId.parse((await redis_client.xrevrange("yrelay:{lost-tail}:stream", count=1))[0][0].decode())
    await redis_client.hset("yrelay:{lost-tail}:meta", "last_id", str(last))
    replica.offset = str(StreamId(last.ms + 10_000, 0))
    await survivor.drop_connection()
    await eventually(lambda: survivor.resyncs >= 1, timeout=10)
    await survivor.wait_idle()
    fresh = await make_client(server_url)
    check = await fresh.subscribe("lost-tail")
    await eventually(lambda: check.text == replica.text == "client kept this; server has this")


async def test_trimmed_history_triggers_resync(server_url, redis_client):
    writer = await RawPeer.connect(server_url)
    await writer.send({"op": "subscribe", "doc": "t"})
    await writer.expect("subscribed")
    doc = crdt.new_doc(5)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for i in range(5):
        crdt.insert_text(doc, 0, str(i))
    ids = [(await writer.update("t", i, u))["id"] for i, u in enumerate(updates)]
    # what GC will do: fold the first three into a snapshot, then trim them
    await redis_client.set("yrelay:{t}:snapshot", crdt.merge_updates(updates[:3]))
    await redis_client.hset("yrelay:{t}:meta", mapping={"snapshot_offset": ids[2], "trimmed_through": ids[2]})
    await redis_client.xtrim("yrelay:{t}:stream", minid=ids[3])
    # a client that holds only the first entry must resync
    reader = await RawPeer.connect(server_url)
    await reader.send({"op": "subscribe", "doc": "t", "offset": ids[0]})
    assert (await reader.expect("resync_required"))["reason"] == "trimmed"
    partial = crdt.new_doc(6)
    crdt.apply_update(partial, updates[0])
    await reader.send({"op": "sync", "doc": "t", "state_vector": protocol.b64encode(crdt.state_vector(partial))})
    reply = await reader.expect("sync_reply")
    assert reply["offset"] == ids[-1] and reply["parts"] == 1
    crdt.apply_update(partial, protocol.b64decode(reply["update"]))
    assert crdt.text_of(partial) == crdt.text_of(doc) == "43210"
    # a new client gets snapshot + the remaining stream, with no gap
    fresh = await RawPeer.connect(server_url)
    await fresh.send({"op": "subscribe", "doc": "t"})
    assert (await fresh.expect("subscribed"))["offset"] == ids[2]
    snap = await fresh.expect("snapshot")
    rebuilt = crdt.new_doc(7)
    crdt.apply_update(rebuilt, protocol.b64decode(snap["update"]))
    delivered = await fresh.expect("deliver")
    assert [e["id"] for e in delivered["entries"]] == ids[3:]
    for entry in delivered["entries"]:
        crdt.apply_update(rebuilt, protocol.b64decode(entry["update"]))
    assert crdt.text_of(rebuilt) == "43210"


async def test_large_sync_reply_is_chunked(redis_url, make_client):
    from conftest import running_server

    async with running_server(redis_url, chunk_bytes=4096) as url:
        writer = await make_client(url)
        doc = await writer.subscribe("large")
        crdt.insert_text(doc.ydoc, 0, "y" * 50_000)
        await writer.wait_idle()
        reader = await RawPeer.connect(url)
        await reader.send({"op": "subscribe", "doc": "large", "offset": "9999999999999-0"})
        assert (await reader.expect("resync_required"))["reason"] == "ahead"
        await reader.send({"op": "sync", "doc": "large", "state_vector": protocol.b64encode(b"\x00")})
        parts = [await reader.expect("sync_reply")]
        while len(parts) < parts[0]["parts"]:
            parts.append(await reader.expect("sync_reply"))
        assert len(parts) > 1
        rebuilt = crdt.new_doc()
        crdt.apply_update(rebuilt, b"".join(protocol.b64decode(p["update"]) for p in parts))
        assert crdt.text_of(rebuilt) == "y" * 50_000
