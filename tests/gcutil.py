"""Helpers for GC tests: documents with known history, and what Redis holds."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from yrelay.storage.append import append_one
from yrelay.storage.keys import dedup_key, document_keys, meta_key, stream_key, tracker_key
from yrelay.storage.listing import mark_changed
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt

#: Server settings under which GC folds and trims within about a second.
FAST_GC = {"gc_interval": 0.2, "gc_relative_delta": 1.0, "gc_absolute_delta": 5.0}


def text_updates(count: int, client_id: int = 1, word: str = "w") -> tuple[list[bytes], str]:
    """``count`` Yjs updates, each appending ``word<i> `` to one text; and the final text."""
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(count):
        crdt.insert_text(doc, len(crdt.text_of(doc)), f"{word}{index} ")
    return updates, crdt.text_of(doc)


async def append_all(
    store: DocumentStore, doc: str, updates: list[bytes], session: str = "writer", unchecked: bool = False
) -> list[StreamId]:
    """Append through the real append script; the ids it chose. ``unchecked``
    stores them as a server from before causal admission did (no state
    vector, whether the document can apply them or not)."""
    if unchecked:
        start = max(int(time.time() * 1000), (await store.last_id(doc)).ms + 1)
        return await append_at(store.redis, doc, [start + i for i in range(len(updates))], updates, session)
    ids = []
    for clock, update in enumerate(updates):
        entry_id, _ = await append_one(store, doc, session, clock, update)
        ids.append(StreamId.parse(entry_id))
    return ids


async def append_at(
    redis: Redis, doc: str, times_ms: list[int], updates: list[bytes], session: str = "writer"
) -> list[StreamId]:
    """Entries with chosen times (history from the past), laid out exactly as
    the append script lays them out: stream entry, dedup field, meta last_id."""
    ids = []
    for clock, (ms, update) in enumerate(zip(times_ms, updates, strict=True)):
        entry_id = StreamId(ms, 0)
        await redis.xadd(stream_key(doc), {"u": update, "s": session, "c": clock}, id=str(entry_id))
        await redis.hset(dedup_key(doc), f"{session}:{clock}", str(entry_id))
        ids.append(entry_id)
    await redis.hset(meta_key(doc), "last_id", str(ids[-1]))
    async with redis.pipeline(transaction=False) as pipe:
        mark_changed(pipe, [doc])
        await pipe.execute()
    return ids


async def track(redis: Redis, doc: str, offsets: dict[str, StreamId]) -> None:
    await redis.zadd(tracker_key(doc), {session: offset.score() for session, offset in offsets.items()})


async def tracked(redis: Redis, doc: str) -> set[str]:
    return {member.decode() for member in await redis.zrange(tracker_key(doc), 0, -1)}


async def server_text(store: DocumentStore, doc: str) -> str:
    ydoc, _ = await store.load_document(doc)
    return crdt.text_of(ydoc)


async def dump_document(redis: Redis, doc: str) -> dict[str, bytes | None]:
    """Every key of ``doc``, serialized: equal dumps mean nothing changed."""
    return {key: await redis.dump(key) for key in document_keys(doc)}
