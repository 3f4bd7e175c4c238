"""Entries no replica can apply, stored before causal admission existed.

A stream written by an older server can hold an update stored behind a gap
(its Yjs client's earlier update was never stored): it is in nobody's
document, and GC's fold stops before it for ever, so the stream never
shrinks. GC reports such a document (``meta.blocked_at``, ``blocked_since``);
an operator resolves it with :func:`drop_blocked` (``POST
/ops/docs/{doc}/drop-blocked``): the entries that still cannot apply are
listed in ``yrelay:{doc}:dropped``, the event log records them, and the next
fold reads them as empty updates, so it passes them and the trim removes
them like any folded entry (dedup fields and drift digest included). Their
content was never visible to anyone; it is gone for good.
"""

from __future__ import annotations

from redis.asyncio import Redis

from yrelay.observability.events import EventSink
from yrelay.storage.keys import dropped_key
from yrelay.storage.reads import DocumentStore, HistoryTrimmed
from yrelay.yjs.admission import StateBuilder


async def find_blocked(store: DocumentStore, doc: str) -> list[str]:
    """The ids of the stored entries that no replica can apply (snapshot +
    stream integrated as Yjs would; the ones still waiting at the end)."""
    while True:
        snapshot = await store.load_snapshot(doc)
        builder = StateBuilder()
        if snapshot.update:
            builder.add("snapshot", snapshot.update)
        try:
            async for page in store.iter_entries(doc, snapshot.offset):
                for entry in page:
                    builder.add(str(entry.id), entry.update)
        except HistoryTrimmed:
            continue  # GC trimmed while we read: from its new snapshot
        return [blocked.entry_id for blocked in builder.blocked if blocked.entry_id != "snapshot"]


async def drop_blocked(redis: Redis, doc: str, events: EventSink) -> list[str]:
    """Mark the document's blocked entries to be folded as empty; returns them."""
    ids = await find_blocked(DocumentStore(redis), doc)
    if ids:
        await redis.sadd(dropped_key(doc), *ids)
        events.emit("drop_blocked", doc, entries=len(ids), first=ids[0], last=ids[-1])
    return ids
