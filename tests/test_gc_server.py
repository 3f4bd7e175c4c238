"""GC inside running servers: a stalled client, eviction seen by a live
session, fresh clients after compaction, two processes collecting at once."""

from __future__ import annotations

import asyncio
import random

from conftest import FAST_BACKOFF, eventually, running_server
from gcutil import FAST_GC
from wsraw import RawPeer
from yrelay.client import YrelayClient
from yrelay.storage.keys import stream_key, tracker_key
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt
from yrelay_tools.testing.checker import check_delivery
from yrelay_tools.testing.processes import ServerProcess


class Stall:
    """Freeze a client's handling of frames (a hung tab: the socket still
    receives, nothing is applied or acked), then replay them in order."""

    def __init__(self, client: YrelayClient):
        self.client = client
        self.frames: list[dict] = []

    def __enter__(self) -> Stall:
        self.client._handle = self.frames.append  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.client._handle  # back to the class's method
        for frame in self.frames:
            self.client._handle(frame)


async def type_steadily(doc, count: int, tag: str, pause: float) -> None:
    for index in range(count):
        crdt.insert_text(doc.ydoc, len(doc.text), f"{tag}{index} ")
        await asyncio.sleep(pause)


async def test_a_stalled_client_is_evicted_the_stream_stays_bounded_and_it_resyncs(
    redis_url, redis_client, make_client
):
    async with running_server(redis_url, **FAST_GC) as url:
        writers = [await make_client(url) for _ in range(2)]
        stalled = await make_client(url)
        docs = [await client.subscribe("pad") for client in writers]
        frozen_doc = await stalled.subscribe("pad")
        lengths: list[int] = []

        async def sample() -> None:
            while True:
                lengths.append(await redis_client.xlen(stream_key("pad")))
                await asyncio.sleep(0.05)

        with Stall(stalled) as stall:
            sampler = asyncio.create_task(sample())
            await asyncio.gather(*(type_steadily(doc, 100, f"w{i}-", 0.04) for i, doc in enumerate(docs)))
            sampler.cancel()
            assert stalled.session not in {m.decode() for m in await redis_client.zrange(tracker_key("pad"), 0, -1)}
            assert stall.frames  # it was sent things it never handled
        appended = 200
        # Without eviction the stalled session would pin all 200 entries.
        assert max(lengths[-10:]) < appended / 2, lengths
        for client in writers:
            await client.wait_idle()
        await eventually(lambda: frozen_doc.text == docs[0].text == docs[1].text, timeout=20)
        assert stalled.resyncs >= 1
        check_delivery(
            {"a": docs[0].ydoc, "b": docs[1].ydoc, "stalled": frozen_doc.ydoc},
            [u.update for c in writers for u in c.acked],
        )


async def test_a_live_session_evicted_by_hand_is_told_to_resync_on_its_next_ack(redis_url, redis_client, server_url):
    writer = await RawPeer.connect(server_url)
    reader = await RawPeer.connect(server_url)
    for peer in (writer, reader):
        await peer.send({"op": "subscribe", "doc": "d", "offset": None})
        await peer.expect("subscribed")
    source = crdt.new_doc(5)
    updates: list[bytes] = []
    crdt.observe_updates(source, updates.append)
    crdt.insert_text(source, 0, "hello")
    assert (await writer.update("d", 0, updates[0]))["op"] == "appended"
    delivered = await reader.expect("deliver")
    await redis_client.zrem(tracker_key("d"), reader.session)
    await reader.send({"op": "ack", "doc": "d", "offset": delivered["entries"][-1]["id"]})
    resync = await reader.expect("resync_required")
    assert resync["reason"] == "evicted"
    await reader.send({"op": "sync", "doc": "d", "state_vector": "AA=="})
    reply = await reader.expect("sync_reply")
    assert reader.session in {m.decode() for m in await redis_client.zrange(tracker_key("d"), 0, -1)}
    assert reply["offset"] == delivered["entries"][-1]["id"]
    for peer in (writer, reader):
        await peer.close()


async def test_a_new_client_after_compaction_loads_snapshot_and_stream(redis_url, redis_client, make_client):
    async with running_server(redis_url, **FAST_GC) as url:
        first = await make_client(url)
        doc = await first.subscribe("book")
        await type_steadily(doc, 30, "x", 0.0)
        await first.wait_idle()
        store = DocumentStore(redis_client)
        for _ in range(100):  # wait until GC folded something
            if (await store.load_snapshot("book")).update:
                break
            await asyncio.sleep(0.05)
        assert (await store.load_snapshot("book")).update
        late = await make_client(url)
        late_doc = await late.subscribe("book")
        await eventually(lambda: late_doc.text == doc.text)


async def test_gc_in_two_server_processes_during_edits_loses_nothing(redis_url, redis_client, tmp_path):
    env = {
        "YRELAY_GC_INTERVAL": "0.1",
        "YRELAY_GC_RELATIVE_DELTA": "0.3",
        "YRELAY_GC_ABSOLUTE_DELTA": "2",
        "YRELAY_RESEND_AFTER": "0.5",
    }
    one = ServerProcess(redis_url, tmp_path, env=env).start()
    two = ServerProcess(redis_url, tmp_path, env=env).start()
    clients = [YrelayClient([one.ws_url, two.ws_url][:: 1 - 2 * (i % 2)], backoff=FAST_BACKOFF) for i in range(4)]
    try:
        for client in clients:
            await client.connect()
        docs = [await client.subscribe(name) for client in clients for name in ("alpha", "beta")]

        async def edit(doc, tag: str) -> None:
            rng = random.Random(tag)
            for index in range(60):
                crdt.insert_text(doc.ydoc, rng.randint(0, len(doc.text)), f"<{tag}{index}>")
                await asyncio.sleep(rng.uniform(0, 0.02))

        async def disrupt() -> None:  # reconnects make lagging sessions and resyncs
            for round_ in range(4):
                await asyncio.sleep(0.4)
                await clients[round_ % 4].drop_connection()

        await asyncio.gather(*(edit(doc, f"c{i}-") for i, doc in enumerate(docs)), disrupt())
        for client in clients:
            await client.wait_idle(timeout=60)
        acked = {"alpha": [], "beta": []}
        for client in clients:
            for update in client.acked:
                acked[update.doc].append(update.update)
        store = DocumentStore(redis_client)
        for name in ("alpha", "beta"):
            mine = [doc for doc in docs if doc.name == name]
            await eventually(lambda: len({doc.text for doc in mine}) == 1, timeout=30)  # noqa: B023 - called within this iteration, never after it
            server_doc, _ = await store.load_document(name)
            replicas = {f"client-{i}": doc.ydoc for i, doc in enumerate(mine)}
            replicas["server"] = server_doc
            report = check_delivery(replicas, acked[name])
            # Every edit is there exactly once (acked updates also include
            # resync diffs, so count characters rather than updates).
            typed = sum(len(f"<c{i}-{k}>") for i, doc in enumerate(docs) if doc.name == name for k in range(60))
            assert len(report.content) == typed
            meta = await redis_client.hgetall(f"yrelay:{{{name}}}:meta")
            assert int(meta[b"gc_folded"]) > 0  # GC really ran during the edits
    finally:
        for client in clients:
            await client.close()
        one.stop()
        two.stop()
