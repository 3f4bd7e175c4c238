"""Reading and writing one document's Redis keys: stream pages, snapshot, meta.

Appends go through the ``append`` Lua script (see :mod:`yrelay.app.appender`
for the batching); everything else a server needs to read lives here, so the
rest of the code never spells a Redis command against document keys.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import redis.exceptions
from redis.asyncio import Redis
from redis.typing import EncodableT

from . import crdt
from .admission import Needs, needs_of
from .change_feed import announce_in
from .clocks import bring_clocks_up_to_date
from .entries import Entry, HistoryTrimmed, Snapshot, StreamRewound, to_entry
from .keys import clocks_key, dedup_key, meta_key, snapshot_key, stream_key
from .listing import mark_changed
from .offsets import ZERO, StreamId
from .replies import stream_id, text
from .scripts import Scripts
from .tombstones import is_deleted_error, is_deletion, unlist
from .update_format import MalformedUpdate, read_layout

#: Entries, snapshots and the trimmed/rewound errors are defined in
#: :mod:`yrelay.entries` (below the clocks rebuild, which reads them); their
#: names stay importable here.
__all__ = [
    "LAYOUT",
    "DocumentStore",
    "Entry",
    "HistoryTrimmed",
    "NotAdmitted",
    "Snapshot",
    "StreamRewound",
    "append_args",
    "append_keys",
    "flat_clocks",
    "held_offset",
    "needs_or_nothing",
    "to_entry",
]


class DocumentStore:
    """Typed access to the keys of documents; one per process."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self.scripts = Scripts(redis)

    async def load_scripts(self) -> None:
        await self.scripts.load(self.redis)

    async def append(
        self, doc: str, session: str, clock: int, update: bytes, needs: Needs | None = None
    ) -> tuple[str, bool]:
        """Append one update, unbatched and unvalidated (servers validate and
        use the Appender; tools and tests use this). ``needs`` defaults to
        what the update needs when it decodes, to nothing when it does not.
        Raises :class:`NotAdmitted` when the document cannot apply it."""
        if needs is None:
            needs = needs_or_nothing(update)
        async with self.redis.pipeline(transaction=False) as pipe:
            await self.scripts.append(
                keys=append_keys(doc), args=append_args([(session, clock, update, needs)]), client=pipe
            )
            mark_changed(pipe, [doc])
            announce_in(pipe, [doc])
            [reply, *_] = await pipe.execute(raise_on_error=False)  # the bookkeeping's errors are not the append's
        if isinstance(reply, redis.exceptions.ResponseError):
            if is_deleted_error(reply):  # refused, but mark_changed listed it again
                await unlist(self.redis, doc)
            raise reply
        if reply == [b"stale"]:
            await bring_clocks_up_to_date(self, doc)
            return await self.append(doc, session, clock, update, needs)
        [(entry_id, code, *rest)] = reply
        if code == 2:
            raise NotAdmitted(flat_clocks(rest[0]), flat_clocks(rest[1]))
        return text(entry_id), bool(code)

    async def last_id(self, doc: str) -> StreamId:
        """The last id ever appended to ``doc`` (``0-0`` for a new document)."""
        return stream_id(await self.redis.hget(meta_key(doc), "last_id")) or ZERO

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
        (pycrdt by default; :mod:`yrelay.crdt`) and its offset (tools and
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


def append_keys(doc: str) -> list[str]:
    """KEYS of the append script, in its order."""
    return [stream_key(doc), meta_key(doc), dedup_key(doc), clocks_key(doc)]


#: The key layout this server writes (``meta.layout``); the append script
#: refuses a document written by a newer one (rolling upgrades).
LAYOUT = 2


def append_args(items: list[tuple[str, int, bytes, Needs]]) -> list[EncodableT]:
    """ARGV of the append script for ``(session, clock, update, needs)`` items."""
    args: list[EncodableT] = [LAYOUT]
    for session, clock, update, needs in items:
        args += [session, clock, update, *needs.script_args()]
    return args


class NotAdmitted(Exception):
    """The document cannot apply the update (causal admission refused it)."""

    def __init__(self, lacking: dict[int, int], state: dict[int, int]):
        super().__init__(f"missing content of Yjs clients {sorted(lacking)}")
        #: Clients whose content the update lacks -> the document's clock.
        self.lacking = lacking
        #: Every client the update involves -> the document's clock.
        self.state = state


def flat_clocks(flat: list[bytes]) -> dict[int, int]:
    """``[client, clock, client, clock, ...]`` from the script -> a dict."""
    return {int(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def needs_or_nothing(update: bytes) -> Needs:
    """What ``update`` needs to apply; nothing when it does not decode (for
    tools that append without the server's validation: benches, seeding)."""
    try:
        return needs_of(read_layout(update))
    except MalformedUpdate:
        return Needs()
