"""One member's read loop: every document it holds, in one blocking XREAD.

A member holds a handful to thousands of documents; most are quiet. The
loop therefore never polls a document: one ``XREAD BLOCK`` over all of
them (from each one's cursor) waits for the first new entry anywhere, like
the server's fan-out (:mod:`yrelay.app.fanout`). Documents newly assigned
are claimed first (:mod:`yrelay.consumers.progress`): read from the group's
last ack, or from the snapshot when the group has none. After each read the
trim marks of the documents read are checked in one round trip: a stream
trimmed past a cursor (GC evicted the group) is never read across silently,
the document starts again from its snapshot.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import redis.exceptions
from redis.asyncio import Redis

from ..backoff import Reconnect
from ..events import EventSink
from ..deletion import is_deletion
from ..keys import meta_key, stream_key
from ..offsets import StreamId
from ..replies import stream_id, text
from ..store import DocumentStore, to_entry
from .batch import Batch
from .progress import AckResult, Progress, StaleClaim

log = logging.getLogger(__name__)

_STREAM_PREFIX, _STREAM_SUFFIX = stream_key("\0").split("\0")


def _doc_of_stream(key: bytes | str) -> str:
    name = text(key)
    return name[len(_STREAM_PREFIX):-len(_STREAM_SUFFIX)]


@dataclass
class Held:
    """One document this member holds."""

    version: int
    #: Everything up to here was handed out; None until claimed.
    cursor: StreamId | None = None
    #: Why the next claim must start from the snapshot (a hole was seen).
    restart: str | None = None
    #: The last offset the group acked.
    acked: StreamId | None = None
    #: (first id, last id, entries) of batches handed out and not acked yet.
    unacked: deque[tuple[StreamId, StreamId, int]] = field(default_factory=deque)


class Reader:
    def __init__(self, redis: Redis, progress: Progress, events: EventSink, *, member: str,
                 batch_size: int, block_ms: int, valid: Callable[[], bool]):
        self.redis = redis
        self.progress = progress
        self.events = events
        self.member = member
        self.store = DocumentStore(redis)
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.valid = valid
        self.held: dict[str, Held] = {}
        #: Held documents not read until :meth:`resume` (a webhook's dead letters).
        self.paused: set[str] = set()
        self._changed = asyncio.Event()
        #: Batches handed out again after a restart from the snapshot, acks refused.
        self.refused = 0

    # ------------------------------------------------ the assignment's side

    def assign(self, mine: dict[str, int]) -> None:
        """The documents (-> version) this member holds from now on."""
        for doc in [doc for doc in self.held if doc not in mine]:
            del self.held[doc]
        for doc, version in mine.items():
            if doc not in self.held or self.held[doc].version != version:
                self.held[doc] = Held(version)
        self.paused &= mine.keys()
        self._changed.set()

    def pause(self, doc: str) -> None:
        """Read nothing more of ``doc`` (its position stays at the last ack)."""
        self.paused.add(doc)

    def resume(self, doc: str) -> None:
        """Read ``doc`` again, from the group's last ack (claimed anew)."""
        self.paused.discard(doc)
        if (held := self.held.get(doc)) is not None:
            self.held[doc] = Held(held.version)
        self._changed.set()

    def lag(self) -> tuple[int, int]:
        """(entries handed out and not acked, the time of the oldest of
        them in ms, 0 when there is none) over the documents held."""
        entries = sum(n for held in self.held.values() for _, _, n in held.unacked)
        oldest = min((held.unacked[0][0].ms for held in self.held.values() if held.unacked), default=0)
        return entries, oldest

    # ------------------------------------------------------------- acking

    async def ack(self, batch: Batch) -> AckResult:
        result = await self.progress.ack(batch.doc, batch.version, batch.offset)
        held = self.held.get(batch.doc)
        mine = held is not None and held.version == batch.version
        if result is AckResult.ACKED and mine:
            held.acked = max(held.acked or batch.offset, batch.offset)  # type: ignore[union-attr]
            while held.unacked and held.unacked[0][1] <= batch.offset:  # type: ignore[union-attr]
                held.unacked.popleft()  # type: ignore[union-attr]
        elif result is not AckResult.ACKED:
            self.refused += 1
            self.events.emit("consumer_refused", batch.doc, group=self.progress.group, member=self.member,
                             reason=result.value, offset=str(batch.offset))
            if mine and result is AckResult.STALE:
                del self.held[batch.doc]
            elif mine:
                self.held[batch.doc] = Held(batch.version, restart="evicted")
        return result

    # ------------------------------------------------------------ reading

    async def batches(self) -> AsyncIterator[Batch]:
        """Batches for as long as the caller iterates. Redis failing does not
        end it: the loop waits (0.1 s doubling to 5 s) and reads on; past the
        lease the member holds nothing until its heartbeat is back."""
        reconnect = Reconnect()
        while True:
            try:
                ready = await self._step()
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("consumer group %s: read failed (%s); again in %.1fs", self.progress.group, exc,
                            reconnect.delay)
                await reconnect.wait()
                continue
            reconnect.succeeded()
            for batch in ready:
                if not self.valid():  # paused past our lease while reading: these may be another's now
                    self.held.clear()
                    break
                held = self.held.get(batch.doc)
                if held is not None and held.version == batch.version and batch.doc not in self.paused:
                    yield batch

    async def _step(self) -> list[Batch]:
        """Claim the documents new to us (their snapshot batches, if any),
        else one blocking read over every document held."""
        if not self.valid():  # our lease lapsed (a pause, Redis unreachable): hold nothing
            self.held.clear()
        starts = []
        for doc, held in list(self.held.items()):
            if held.cursor is None and doc not in self.paused and (batch := await self._start(doc, held)) is not None:
                starts.append(batch)
        if starts:
            return starts
        cursors = {doc: held.cursor for doc, held in self.held.items()
                   if held.cursor is not None and doc not in self.paused}
        if cursors:
            return await self._read(cursors)
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), self.block_ms / 1000)
        except asyncio.TimeoutError:
            pass
        return []

    async def _start(self, doc: str, held: Held) -> Batch | None:
        """Claim ``doc``; the snapshot batch when the group starts from it."""
        try:
            start = await self.progress.claim(doc, held.version)
        except StaleClaim:
            self.held.pop(doc, None)
            return None
        if start.mode == "resume" and held.restart is None:
            held.cursor = held.acked = start.offset
            return None
        snapshot = await self.store.load_snapshot(doc)
        held.cursor = snapshot.offset
        reason = "evicted" if start.evicted else (held.restart or "new")
        held.restart = None
        self.events.emit("consumer_restart", doc, group=self.progress.group, member=self.member, reason=reason,
                         offset=str(snapshot.offset))
        if reason == "new" and not snapshot.update:
            return None  # nothing folded yet: the stream holds the whole document
        held.unacked.append((snapshot.offset, snapshot.offset, 0))
        return Batch(doc, [], held.version, snapshot.offset, snapshot.update, reason, self.ack)

    async def _read(self, cursors: dict[str, StreamId]) -> list[Batch]:
        reply = await self.redis.xread({stream_key(doc): str(cursor) for doc, cursor in cursors.items()},
                                       count=self.batch_size, block=self.block_ms)
        if not reply:
            return []
        read = [(_doc_of_stream(key), entries) for key, entries in reply]
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc, _ in read:
                pipe.hget(meta_key(doc), "trimmed_through")
            marks = await pipe.execute()
        batches = []
        for (doc, raw_entries), mark in zip(read, marks):
            held = self.held.get(doc)
            if held is None or held.cursor != cursors[doc] or not raw_entries:
                continue  # taken from us, or restarted, while we read
            trimmed = stream_id(mark)
            if trimmed is not None and cursors[doc] < trimmed:
                held.cursor, held.restart = None, "trimmed"
                continue
            entries = [to_entry(entry_id, fields) for entry_id, fields in raw_entries]
            held.cursor = entries[-1].id
            held.unacked.append((entries[0].id, held.cursor, len(entries)))
            deleted = is_deletion(entries[-1])  # the marker ends the stream (yrelay/deletion.py)
            batches.append(Batch(doc, entries[:-1] if deleted else entries, held.version, held.cursor,
                                 deleted=deleted, _ack=self.ack))
        return batches
