"""A document's state vector in Redis, rebuilt when entries were written without it.

The append script keeps ``yrelay:{doc}:clocks`` exact for every entry it
appends and marks ``meta.clocks_through``. Entries written without it (by a
server from before causal admission, during a rolling upgrade or on data
from before it) leave ``clocks_through`` behind ``last_id``: the script then
answers ``stale`` and the caller rebuilds here, from the snapshot and the
stream, integrating as Yjs does (:class:`yrelay.yjs.admission.StateBuilder`),
then stores the result by compare-and-set (``lua/clocks_set.lua``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from redis.asyncio import Redis

from yrelay.storage.entries import Entry, HistoryTrimmed, Snapshot
from yrelay.storage.keys import clocks_key, meta_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.replies import stream_id
from yrelay.storage.scripts import Scripts
from yrelay.yjs.admission import Blocked, StateBuilder

log = logging.getLogger(__name__)


class EntryStore(Protocol):
    """What the rebuild reads and writes through: :class:`yrelay.storage.reads.DocumentStore`,
    which calls the rebuild when an append answers ``stale`` (so this module
    names what it needs instead of importing the store: no import cycle)."""

    @property
    def redis(self) -> Redis: ...

    @property
    def scripts(self) -> Scripts: ...

    async def load_snapshot(self, doc: str) -> Snapshot: ...

    def iter_entries(
        self, doc: str, after: StreamId, until: StreamId | None = None, page_size: int = 500, *, held: bool = False
    ) -> AsyncIterator[list[Entry]]: ...


async def bring_clocks_up_to_date(store: EntryStore, doc: str, page_size: int = 500) -> list[Blocked]:
    """Account for every stored entry in the clocks hash; returns the entries
    no replica can apply (stored before admission existed)."""
    while True:
        async with store.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(meta_key(doc), "clocks_through", "last_id", "trimmed_through")
            pipe.hgetall(clocks_key(doc))
            (raw_through, raw_last, raw_trimmed), raw_clocks = await pipe.execute()
        through, last = stream_id(raw_through), stream_id(raw_last) or ZERO
        trimmed = stream_id(raw_trimmed) or ZERO
        if through is not None and through >= last:
            return []
        if through is None or through < trimmed:  # start from the snapshot
            builder, start = await _from_snapshot(store, doc)
            for client, clock in raw_clocks.items():
                builder.clocks[int(client)] = max(builder.clocks.get(int(client), 0), int(clock))
        else:
            builder = StateBuilder({int(c): int(v) for c, v in raw_clocks.items()})
            start = through
        stored = await _read_into(store, doc, builder, start, last, page_size)
        if stored is None:
            continue  # trimmed while reading
        args: list[str | int] = [str(raw_through.decode() if raw_through else ""), str(last)]
        for client, clock in builder.clocks.items():
            args += [client, clock]
        if await store.scripts.clocks_set(keys=[meta_key(doc), clocks_key(doc)], args=args):
            blocked = builder.blocked
            log.info(
                "document %s: state vector rebuilt through %s (%d entries not applicable)", doc, last, len(blocked)
            )
            return blocked


def _add_all(builder: StateBuilder, entries: list[Entry]) -> None:
    for entry in entries:
        builder.add(str(entry.id), entry.update)


async def _from_snapshot(store: EntryStore, doc: str) -> tuple[StateBuilder, StreamId]:
    snapshot = await store.load_snapshot(doc)
    builder = StateBuilder()
    if snapshot.update:
        await asyncio.to_thread(builder.add, "snapshot", snapshot.update)
    return builder, snapshot.offset


async def _read_into(
    store: EntryStore, doc: str, builder: StateBuilder, start: StreamId, last: StreamId, page_size: int
) -> bool | None:
    try:
        async for page in store.iter_entries(doc, start, last, page_size=page_size):
            await asyncio.to_thread(_add_all, builder, page)  # pure Python: off the event loop
    except HistoryTrimmed:
        return None
    return True
