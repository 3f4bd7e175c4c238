"""One member's read loop: the documents it holds, handed out in batches.

A member holds a handful to thousands of documents; most are quiet. Which
have something new, and reading them, is the reader loop's, shared with
the server's fan-out (:mod:`yrelay.storage.reader`: the change stream on
one Redis, per-bucket wake-ups on a cluster, a sweep every ``block_ms``, a
document Redis cannot read set aside); this module is its
:class:`~yrelay.storage.reader.Follower` and keeps the group's part.
Documents newly assigned
are claimed first (:mod:`yrelay.consumers.progress`): read from the group's
last ack, or from the snapshot when the group has none. After each read the
trim marks of the documents read are checked in one round trip: a stream
trimmed past a cursor (GC evicted the group) is never read across silently,
the document starts again from its snapshot. A document being handed
over (:mod:`yrelay.consumers.handover`) is read no more; it is released
once every batch handed out of it was acked.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from yrelay.consumers.batch import Batch
from yrelay.consumers.progress import AckResult, Progress, StaleClaim
from yrelay.observability.events import EventSink
from yrelay.storage import packed
from yrelay.storage.offsets import MAX_SEQ, StreamId
from yrelay.storage.reader import DocEntries, DocumentReader, retrying
from yrelay.storage.reads import DocumentStore, Entry, to_entry
from yrelay.storage.replies import stream_id, text
from yrelay.storage.tombstones import is_deletion
from yrelay.tasks import lost_redis

log = logging.getLogger(__name__)

#: Hand-outs are recorded (``<group>:out``) this many batches at a time, in
#: one round trip before the first of them is handed out: a takeover's
#: redelivery count is high by at most this many batches minus one (read,
#: recorded, not handed out yet). 1: exact, for one round trip per batch
#: (a batch holds up to ``batch_size`` entries; an ack costs one too).
MARK_AHEAD = 1


def _before(entry_id: StreamId) -> StreamId:
    """The greatest id below ``entry_id``: XREAD from it reads ``entry_id`` again."""
    return StreamId(entry_id.ms, entry_id.seq - 1) if entry_id.seq else StreamId(entry_id.ms - 1, MAX_SEQ)


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
    #: The leader is handing the document to another member: read no more,
    #: release it once ``unacked`` is empty.
    releasing: bool = False
    #: After a takeover: entries up to here were handed out by the previous
    #: owner and not acked; handing them out again counts as redelivery.
    redeliver_through: StreamId | None = None
    #: The document's newest entry, as of our last read (for the lag in ``consumer_ack``).
    head: StreamId | None = None


class Reader:
    def __init__(
        self,
        redis: Redis,
        progress: Progress,
        events: EventSink,
        *,
        member: str,
        batch_size: int,
        block_ms: int,
        valid: Callable[[], bool],
        release: Callable[[str, str, int], Awaitable[bool]],
    ):
        self.redis = redis
        self.progress = progress
        self.events = events
        self.member = member
        self.store = DocumentStore(redis)
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.valid = valid
        self.release = release
        self.held: dict[str, Held] = {}
        #: Held documents not read until :meth:`resume` (a webhook's dead letters).
        self.paused: set[str] = set()
        #: Held documents being handed over (:meth:`release_finished`).
        self._releasing: set[str] = set()
        #: Held documents to claim (no cursor yet: new, resumed, restarted);
        #: a round looks at these, not at every document held.
        self._unclaimed: set[str] = set()
        #: The group was deleted: ``batches()`` ends.
        self.closed = False
        #: Documents were assigned to us since the last claims: claim them
        #: before handing out more of what was read (a takeover waits for
        #: one batch of the application, not for all the batches read).
        self._to_claim = False
        #: Acks refused (stale or evicted).
        self.refused = 0
        #: Entries read again that a previous owner had read and not acked
        #: (since start; ``unreported_redelivered`` not yet in the group's meta).
        self.redelivered = 0
        self.unreported_redelivered = 0
        #: Which held documents have something new, and reading them.
        self.documents = DocumentReader(
            redis,
            self,
            block_ms=block_ms,
            name=f"yrelay-consumer-{progress.group}",
            label=f"consumer group {progress.group}",
        )

    def start(self) -> None:
        self.documents.start()

    async def stop(self) -> None:
        await self.documents.stop()

    # ------------------------------------------------ the assignment's side

    def assign(self, mine: dict[str, int], releasing: set[str] | frozenset[str] = frozenset()) -> None:
        """The documents (-> version) this member holds from now on, and
        those of them it is to release."""
        for doc in [doc for doc in self.held if doc not in mine]:
            del self.held[doc]
            self.documents.removed(doc)
        for doc, version in mine.items():
            if doc not in self.held or self.held[doc].version != version:
                self.held[doc] = Held(version)
                self._unclaimed.add(doc)
                self._to_claim = True
            elif self.held[doc].releasing and doc not in releasing:
                self.documents.wake(doc)  # the handover was cancelled: what was announced meanwhile was not read
            self.held[doc].releasing = doc in releasing
        self._releasing = set(releasing) & mine.keys()
        self.paused &= mine.keys()
        self.documents.changed.set()

    def pause(self, doc: str) -> None:
        """Read nothing more of ``doc`` (its position stays at the last ack)."""
        self.paused.add(doc)

    def resume(self, doc: str) -> None:
        """Read ``doc`` again, from the group's last ack (claimed anew)."""
        self.paused.discard(doc)
        if (held := self.held.get(doc)) is not None:
            self.held[doc] = Held(held.version)
            self._unclaimed.add(doc)
            self.held[doc].releasing = held.releasing
            self._to_claim = True
        self.documents.changed.set()

    def close(self) -> None:
        """Hold nothing and end :meth:`batches` (the group was deleted)."""
        self.closed = True
        self.held.clear()
        self.documents.changed.set()

    async def release_finished(self) -> None:
        """Release every document being handed over that has nothing unacked
        (called every round: it looks at those being handed over only)."""
        for doc in list(self._releasing):
            held = self.held.get(doc)
            if held is None or not held.releasing:
                self._releasing.discard(doc)
            else:
                await self._release_if_finished(doc, held)

    async def _release_if_finished(self, doc: str, held: Held) -> None:
        if not held.releasing or held.unacked or self.held.get(doc) is not held:
            return
        del self.held[doc]  # read no more, whatever the answer (the next assignment read tells)
        try:
            # All read was acked (or dropped): its next owner reads nothing again.
            await self._marks([(doc, held.version, held.acked or StreamId(0, 0))])
            released = await self.release(doc, self.member, held.version)
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.warning(
                "consumer group %s: could not release %s (%s); the leader moves it at the deadline",
                self.progress.group,
                doc,
                exc,
            )
            return
        if released:
            self.events.emit("consumer_handover", doc, group=self.progress.group, member=self.member)

    def lag(self) -> tuple[int, int]:
        """(entries handed out and not acked, the time of the oldest of
        them in ms, 0 when there is none) over the documents held."""
        entries = sum(n for held in self.held.values() for _, _, n in held.unacked)
        oldest = min((held.unacked[0][0].ms for held in self.held.values() if held.unacked), default=0)
        return entries, oldest

    # ------------------------------------------------------------- acking

    async def ack(self, batch: Batch) -> AckResult:
        result = await self.progress.ack(batch.doc, batch.version, batch.offset)
        held = self.holding(batch)
        if result is AckResult.ACKED and held is not None:
            head = max(held.head or batch.offset, batch.offset)
            self.events.emit(
                "consumer_ack",
                batch.doc,
                group=self.progress.group,
                member=self.member,
                offset=str(batch.offset),
                head=str(head),
                entries=len(batch.entries),
            )
            held.acked = max(held.acked or batch.offset, batch.offset)
            while held.unacked and held.unacked[0][1] <= batch.offset:
                held.unacked.popleft()
            await self._release_if_finished(batch.doc, held)
        elif result is not AckResult.ACKED:
            self.refused += 1
            self.events.emit(
                "consumer_refused",
                batch.doc,
                group=self.progress.group,
                member=self.member,
                reason=result.value,
                offset=str(batch.offset),
            )
            if held is not None and result is AckResult.STALE:
                del self.held[batch.doc]
            elif held is not None:
                self.held[batch.doc] = Held(batch.version, restart="evicted", releasing=held.releasing)
                self._unclaimed.add(batch.doc)
        return result

    # ------------------------------------------------------------ reading

    async def batches(self) -> AsyncIterator[Batch]:
        """Batches for as long as the caller iterates. Redis failing does not
        end it: the loop waits (0.1 s doubling to 5 s) and reads on; past the
        lease the member holds nothing until its heartbeat is back."""
        rounds = retrying(
            self._step,
            lost=f"consumer group {self.progress.group}: read failed",
            until=lambda: self.closed,
            failed=self.documents.failed,  # what was read and woken may not have been handed out: sweep next
        )
        async for ready in rounds:
            for index, batch in enumerate(ready):
                if self._to_claim:  # claim the new documents first; these are read again after
                    for rest in ready[index:]:
                        self._unread(rest)
                    break
                if index % MARK_AHEAD == 0 and not await self._mark_handed_out(ready[index : index + MARK_AHEAD]):
                    break  # Redis failed: read again (nothing was handed out of these)
                if not self.valid():  # paused past our lease while reading: these may be another's now
                    self.held.clear()
                    break
                held = self.holding(batch)
                if held is not None and held.releasing:
                    await self._drop(batch, held)  # read before the handover was seen: not handed out
                elif held is not None and batch.doc not in self.paused:  # else moved away meanwhile
                    self._count_redelivered(batch.doc, held, batch.entries)
                    yield batch

    async def _mark_handed_out(self, batches: list[Batch]) -> bool:
        """Before handing ``batches`` out: record per document how far its
        application is given entries (a takeover counts what it reads again
        up to there), and stop at once for documents another member claimed.
        False when Redis failed (the documents read again from their cursor)."""
        batches = [
            batch for batch in batches if (held := self.holding(batch)) is not None and not held.releasing
        ]  # the others are not handed out
        if not batches:
            return True
        try:
            replies = await self._marks([(batch.doc, batch.version, batch.offset) for batch in batches])
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.warning("consumer group %s: read failed (%s)", self.progress.group, exc)
            for batch in batches:
                self._unread(batch)
            return False
        for batch, (fence, _, _) in zip(batches, replies, strict=True):
            if text(fence) == "stale" and self.holding(batch) is not None:
                del self.held[batch.doc]  # claimed by another since we read: hand nothing out
        return True

    async def _marks(self, marks: list[tuple[str, int, StreamId | None]]) -> list[Any]:
        """:meth:`~.progress.Progress.mark_read` for each (doc, version,
        through), in one round trip: packed by hand on one Redis (redis-py's
        pipeline sends a ``SCRIPT EXISTS`` first, a second round trip per
        batch: :mod:`yrelay.storage.packed`), redis-py's on a cluster."""
        async with packed.pipeline(self.redis) as pipe:
            for doc, version, through in marks:
                await self.progress.mark_read(pipe, doc, version, through)
            if isinstance(pipe, packed.Batch):
                return await pipe.execute(scripts=[self.progress.scripts.consumer_read])
            return await pipe.execute()

    def holding(self, batch: Batch) -> Held | None:
        """``batch``'s document, if still held at the version it was read at."""
        held = self.held.get(batch.doc)
        return held if held is not None and held.version == batch.version else None

    def _unread(self, batch: Batch) -> None:
        """Forget a batch read and not handed out: it is read again (a
        snapshot batch: the document is claimed again from its snapshot)."""
        held = self.holding(batch)
        if held is not None and held.unacked and held.unacked[-1][1] == batch.offset:
            first, _, _ = held.unacked.pop()
            self.documents.wake(batch.doc)
            if batch.entries:
                held.cursor = _before(first)
            else:
                held.cursor, held.restart = None, batch.restart
                self._unclaimed.add(batch.doc)

    async def _drop(self, batch: Batch, held: Held) -> None:
        """Forget a batch read and not handed out (the document is being
        handed over); the document's next owner reads it."""
        self._unread(batch)  # read again should the handover be cancelled
        await self._release_if_finished(batch.doc, held)

    async def _step(self) -> list[Batch]:
        """Claim the documents new to us (their snapshot batches, if any),
        else one round of the reader loop over the documents due."""
        if not self.valid():  # our lease lapsed (a pause, Redis unreachable): hold nothing
            self.held.clear()
        starts = []
        await self.release_finished()  # those handed over before they were claimed
        self._to_claim = False
        try:
            for doc in list(self._unclaimed):
                held = self.held.get(doc)
                if held is None or held.cursor is not None:
                    self._unclaimed.discard(doc)
                elif doc not in self.paused and (batch := await self._start(doc, held)) is not None:
                    starts.append(batch)
        except BaseException:  # the snapshot batches made so far are not handed out: claim them again
            for batch in starts:
                self._unread(batch)
            raise
        if starts:
            return starts
        if not self.held:
            await self.documents.idle(self.block_ms / 1000)
            return []
        reads = await self.documents.read(self.batch_size)
        return await self._read(reads) if reads else []

    def cursor(self, doc: str) -> StreamId | None:
        """Where ``doc`` is read from; None when it is not read now (not
        held, not claimed yet, paused, being handed over)."""
        held = self.held.get(doc)
        if held is None or held.cursor is None or held.releasing or doc in self.paused:
            return None
        return held.cursor

    def cursors(self) -> dict[str, StreamId]:
        """:meth:`cursor` of every document held (for a sweep)."""
        return {doc: cursor for doc in self.held if (cursor := self.cursor(doc)) is not None}

    def set_aside(self, doc: str, reason: str) -> None:
        """Nobody to tell: the reader loop logged it (an operator repairs the key)."""

    async def _start(self, doc: str, held: Held) -> Batch | None:
        """Claim ``doc``; the snapshot batch when the group starts from it
        (read at once, nothing of it set aside)."""
        self.documents.added(doc)
        try:
            start = await self.progress.claim(doc, held.version)
        except StaleClaim:
            self.held.pop(doc, None)
            return None
        if start.mode == "resume" and held.restart is None:
            held.cursor = held.acked = start.offset
            held.redeliver_through = start.read_through
            return None
        snapshot = await self.store.load_snapshot(doc)
        held.cursor = snapshot.offset
        reason = "evicted" if start.evicted else (held.restart or "new")
        held.restart = None
        self.events.emit(
            "consumer_restart",
            doc,
            group=self.progress.group,
            member=self.member,
            reason=reason,
            offset=str(snapshot.offset),
        )
        if reason == "new" and not snapshot.update:
            return None  # nothing folded yet: the stream holds the whole document
        held.unacked.append((snapshot.offset, snapshot.offset, 0))
        return Batch(doc, [], held.version, snapshot.offset, snapshot.update, reason, self.ack)

    async def _read(self, reads: list[DocEntries]) -> list[Batch]:
        """Batches of ``reads``: each document's fence and trim mark checked
        in one round trip first."""
        versions = {read.doc: self.held[read.doc].version for read in reads if read.doc in self.held}
        reads = [read for read in reads if read.entries and read.doc in versions]
        marks = await self._marks([(read.doc, versions[read.doc], None) for read in reads])
        batches = []
        for (doc, after, raw_entries), (fence, mark, head) in zip(reads, marks, strict=True):
            held = self.held.get(doc)
            if held is None or held.cursor != after or held.version != versions[doc]:
                continue  # taken from us, or restarted, while we read
            if text(fence) == "stale":  # another member claimed it: hand nothing out
                del self.held[doc]
                continue
            trimmed = stream_id(mark or None)
            if trimmed is not None and after < trimmed:
                held.cursor, held.restart = None, "trimmed"
                self._unclaimed.add(doc)
                continue
            entries = [to_entry(entry_id, fields) for entry_id, fields in raw_entries]
            held.cursor = entries[-1].id
            held.unacked.append((entries[0].id, held.cursor, len(entries)))
            held.head = max(stream_id(head or None) or held.cursor, held.cursor)
            deleted = is_deletion(entries[-1])  # the marker ends the stream (yrelay/gc/deletion.py)
            batches.append(
                Batch(
                    doc, entries[:-1] if deleted else entries, held.version, held.cursor, deleted=deleted, _ack=self.ack
                )
            )
        return batches

    def _count_redelivered(self, doc: str, held: Held, entries: list[Entry]) -> None:
        """Count the entries of a batch about to be handed out that the
        document's previous owner had handed out and not acked (the
        duplicates of a takeover)."""
        through = held.redeliver_through
        if through is None or not entries:
            return
        again = sum(1 for entry in entries if entry.id <= through)
        if entries[-1].id >= through:
            held.redeliver_through = None
        if again:
            self.redelivered += again
            self.unreported_redelivered += again
            self.events.emit("consumer_redelivered", doc, group=self.progress.group, member=self.member, entries=again)
