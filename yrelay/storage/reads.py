"""Reads of one document's Redis keys: stream pages, snapshot, meta.

Appends go through the ``append`` Lua script, only from
:mod:`yrelay.storage.append`; everything else a server needs to read lives
here, so the rest of the code never spells a Redis command against document keys.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from redis.asyncio import Redis

from yrelay.storage.entries import Entry, HistoryTrimmed, Snapshot, StreamRewound, to_entry
from yrelay.storage.keys import meta_key, snapshot_key, stream_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.replies import stream_id
from yrelay.storage.scripts import Scripts
from yrelay.storage.tombstones import is_deletion
from yrelay.yjs import crdt

#: Entries, snapshots and the trimmed/rewound errors are defined in
#: :mod:`yrelay.storage.entries` (below the clocks rebuild, which reads them); their
#: names stay importable here.
__all__ = ["DocumentStore", "Entry", "HistoryTrimmed", "Snapshot", "StreamRewound", "held_offset", "to_entry"]


class DocumentStore:
    """Typed access to the keys of documents; one per process."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self.scripts = Scripts(redis)

    async def load_scripts(self) -> None:
        await self.scripts.load(self.redis)

    async def last_id(self, doc: str) -> StreamId:
        """The last id ever appended to ``doc`` (``0-0`` for a new document)."""
        return stream_id(await self.redis.hget(meta_key(doc), "last_id")) or ZERO

    async def never_written(self, docs: list[str]) -> list[str]:
        """Those of ``docs`` nothing was ever written to: no stream, meta or
        snapshot (a deleted one's tombstone counts as written until it
        expires). One pipelined read for all of them."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                pipe.exists(stream_key(doc), meta_key(doc), snapshot_key(doc))
            found = await pipe.execute()
        return [doc for doc, count in zip(docs, found, strict=True) if not count]

    async def trimmed_through(self, doc: str) -> StreamId:
        return stream_id(await self.redis.hget(meta_key(doc), "trimmed_through")) or ZERO

    async def read_page(self, doc: str, after: StreamId, count: int, *, held: bool = False) -> list[Entry]:
        """Up to ``count`` entries with ids greater than ``after``.

        Reads the trim mark in the same transaction, and raises
        :class:`HistoryTrimmed` when entries right after ``after`` are gone:
        a client must never be told it is caught up across a hole.

        ``held``: ``after`` is the id of an entry the reader was sent (not an
        offset a client named); the same transaction checks that the entry
        is still there, or trimmed, and raises :class:`StreamRewound` when it
        is not: a stream that went back would otherwise hand the reader the
        entries appended since as if they followed what it holds.
        """
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(meta_key(doc), "trimmed_through")
            pipe.xrange(stream_key(doc), min=f"({after}", max="+", count=count)
            check = held and after > ZERO
            if check:
                pipe.xrange(stream_key(doc), min=str(after), max=str(after), count=1)
            raw_trimmed, raw_entries, *raw_held = await pipe.execute()
        trimmed = stream_id(raw_trimmed)
        if trimmed is not None and after < trimmed:
            raise HistoryTrimmed(doc, after, trimmed)
        entries = [to_entry(entry_id, fields) for entry_id, fields in raw_entries]
        if check and not raw_held[0] and after > (trimmed or ZERO):
            if not any(map(is_deletion, entries)):  # a deletion removed it: the marker tells the reader
                raise StreamRewound(doc, after)
        return entries

    async def iter_entries(
        self, doc: str, after: StreamId, until: StreamId | None = None, page_size: int = 500, *, held: bool = False
    ) -> AsyncIterator[list[Entry]]:
        """Pages of entries in ``(after, until]`` (to the end when ``until`` is
        None); ``held``: as for :meth:`read_page` (the first page checks it)."""
        cursor = after
        while until is None or cursor < until:
            page = await self.read_page(doc, cursor, page_size, held=held and cursor == after)
            if until is not None:
                page = [entry for entry in page if entry.id <= until]
            if not page:
                return
            yield page
            cursor = page[-1].id

    async def load_snapshot(self, doc: str) -> Snapshot:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(meta_key(doc), "snapshot_offset")
            pipe.get(snapshot_key(doc))
            raw_offset, raw_update = await pipe.execute()
        return Snapshot(stream_id(raw_offset) or ZERO, raw_update or b"")

    async def load_entries(self, doc: str, page_size: int = 500) -> tuple[Snapshot, list[Entry]]:
        """The snapshot and every stream entry after it (the bytes a sync
        answer integrates, in the server's engine workers).

        Retries from a fresh snapshot if a compaction trims entries while the
        stream is being read.
        """
        while True:
            snapshot = await self.load_snapshot(doc)
            entries: list[Entry] = []
            try:
                async for page in self.iter_entries(doc, snapshot.offset, page_size=page_size):
                    entries.extend(page)
            except HistoryTrimmed:
                continue
            return snapshot, entries

    async def load_document(
        self, doc: str, page_size: int = 500, engine: str = crdt.PYCRDT
    ) -> tuple[crdt.Doc, StreamId]:
        """Snapshot + every stream entry after it, as a document of ``engine``
        (pycrdt by default; :mod:`yrelay.yjs.crdt`) and its offset (tools and
        tests; the server answers syncs from :meth:`load_entries` in its
        engine workers).

        The offset is that of the last entry the document holds *with every
        entry before it*: an entry whose dependencies are not in the stream yet
        (a resent update appended after a later one) stays pending and out of
        every encoding of the document, so a reader told "you have all up to
        here" must be told so only up to the entry before it, and be sent the
        rest again.
        """
        snapshot, entries = await self.load_entries(doc, page_size)
        updates = [entry.update for entry in entries]
        ydoc = crdt.new_doc(engine=engine)
        crdt.apply_updates(ydoc, ([snapshot.update] if snapshot.update else []) + updates)
        return ydoc, held_offset(snapshot, entries, crdt.held_prefix(ydoc, updates))


def held_offset(snapshot: Snapshot, entries: list[Entry], held: int) -> StreamId:
    """The offset of a document holding ``snapshot`` and the first ``held`` of ``entries``."""
    return entries[held - 1].id if held else snapshot.offset
