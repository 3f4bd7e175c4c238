"""One member's read loop: the documents it holds, woken by the change stream.

A member holds a handful to thousands of documents; most are quiet. The
loop therefore never polls a document, nor names every one of them in
every read: like the server's fan-out (:mod:`yrelay.app.fanout`), it blocks
in one ``XREAD`` over the change stream and the documents the announcements
read the round before named (and those with more to read), and a sweep
every ``block_ms`` reads every document held, for what nothing announced
(:mod:`yrelay.change_feed`). Documents newly assigned
are claimed first (:mod:`yrelay.consumers.progress`): read from the group's
last ack, or from the snapshot when the group has none. After each read the
trim marks of the documents read are checked in one round trip: a stream
trimmed past a cursor (GC evicted the group) is never read across silently,
the document starts again from its snapshot. A document being handed
over (:mod:`yrelay.consumers.handover`) is read no more; it is released
once every batch handed out of it was acked.

On a Redis Cluster one XREAD over documents of different slots is refused
(``CROSSSLOT``): there the reader is woken per bucket and reads per document,
the way the server's fan-out does (:mod:`yrelay.cluster_reads`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis.exceptions
from redis.asyncio import Redis
from redis.typing import KeyT, StreamIdT

from .. import redis_packed
from ..backoff import Reconnect
from ..change_feed import ChangeFeed
from ..cluster_reads import BucketWakeups, read_each
from ..deletion import is_deletion
from ..events import EventSink
from ..keys import changes_key, stream_key
from ..offsets import MAX_SEQ, StreamId
from ..redis_client import is_cluster, lost_redis
from ..replies import RawEntry, is_wrong_type, stream_id, text
from ..store import DocumentStore, Entry, to_entry
from ..tasks import raise_lost_cancel, wait_event
from .batch import Batch
from .progress import AckResult, Progress, StaleClaim

log = logging.getLogger(__name__)

_STREAM_PREFIX, _STREAM_SUFFIX = stream_key("\0").split("\0")


#: How long a change stream that cannot be read (a key of the wrong type)
#: is left aside, every round sweeping meanwhile; and a document whose
#: stream cannot be read, the others read on meanwhile.
SET_ASIDE_SECONDS = 30.0


def _doc_of_stream(key: bytes | str) -> str:
    name = text(key)
    return name[len(_STREAM_PREFIX) : -len(_STREAM_SUFFIX)]


#: Hand-outs are recorded (``<group>:out``) this many batches at a time, in
#: one round trip before the first of them is handed out: a takeover's
#: redelivery count is high by at most this many batches minus one (read,
#: recorded, not handed out yet). 1: exact, for one round trip per batch
#: (a batch holds up to ``batch_size`` entries; an ack costs one too).
MARK_AHEAD = 1


def _before(entry_id: StreamId) -> StreamId:
    """The greatest id below ``entry_id``: XREAD from it reads ``entry_id`` again."""
    return StreamId(entry_id.ms, entry_id.seq - 1) if entry_id.seq else StreamId(entry_id.ms - 1, MAX_SEQ)


#: An XREAD reply (``(stream key, entries)`` per stream), or what stands for one.
StreamReads = list[tuple[bytes, list[RawEntry]]]


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
    #: Redis refused to read the document's stream (a key of the wrong
    #: type): not read until then (``time.monotonic()``).
    set_aside_until: float = 0.0
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
        self._changed = asyncio.Event()
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
        #: On a Redis Cluster: the per-bucket wake-ups and the sweep (else None).
        self.wakeups = (
            BucketWakeups(
                redis, block_ms=block_ms, wanted=lambda doc: doc in self.held, name=f"yrelay-consumer-{progress.group}"
            )
            if is_cluster(redis)
            else None
        )
        #: On one Redis: the change stream's announcements and the sweep.
        self.changes = ChangeFeed(block_ms)

    def start(self) -> None:
        """Start the wake-up watchers (a Redis Cluster only)."""
        if self.wakeups is not None:
            self.wakeups.start()

    async def stop(self) -> None:
        if self.wakeups is not None:
            await self.wakeups.stop()

    # ------------------------------------------------ the assignment's side

    def assign(self, mine: dict[str, int], releasing: set[str] | frozenset[str] = frozenset()) -> None:
        """The documents (-> version) this member holds from now on, and
        those of them it is to release."""
        for doc in [doc for doc in self.held if doc not in mine]:
            del self.held[doc]
        for doc, version in mine.items():
            if doc not in self.held or self.held[doc].version != version:
                self.held[doc] = Held(version)
                self._unclaimed.add(doc)
                self._to_claim = True
            elif self.held[doc].releasing and doc not in releasing:
                self._read_soon(doc)  # the handover was cancelled: what was announced meanwhile was not read
            self.held[doc].releasing = doc in releasing
        self._releasing = set(releasing) & mine.keys()
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
            self._unclaimed.add(doc)
            self.held[doc].releasing = held.releasing
            self._to_claim = True
        self._changed.set()

    def close(self) -> None:
        """Hold nothing and end :meth:`batches` (the group was deleted)."""
        self.closed = True
        self.held.clear()
        self._changed.set()

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
        held = self.held.get(batch.doc)
        mine = held is not None and held.version == batch.version
        if result is AckResult.ACKED and held is not None and mine:
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
            if mine and result is AckResult.STALE:
                del self.held[batch.doc]
            elif mine:
                self.held[batch.doc] = Held(batch.version, restart="evicted", releasing=self.held[batch.doc].releasing)
                self._unclaimed.add(batch.doc)
        return result

    # ------------------------------------------------------------ reading

    async def batches(self) -> AsyncIterator[Batch]:
        """Batches for as long as the caller iterates. Redis failing does not
        end it: the loop waits (0.1 s doubling to 5 s) and reads on; past the
        lease the member holds nothing until its heartbeat is back."""
        reconnect = Reconnect()
        while not self.closed:
            raise_lost_cancel()
            try:
                ready = await self._step()
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.warning(
                    "consumer group %s: read failed (%s); again in %.1fs", self.progress.group, exc, reconnect.delay
                )
                self.changes.lost()  # what was read and woken may not have been handed out: sweep next
                await reconnect.wait()
                continue
            reconnect.succeeded()
            for index, batch in enumerate(ready):
                if self._to_claim:  # claim the new documents first; these are read again after
                    for rest in ready[index:]:
                        if (held := self.held.get(rest.doc)) is not None and held.version == rest.version:
                            self._unread(rest, held)
                    break
                if index % MARK_AHEAD == 0 and not await self._mark_handed_out(ready[index : index + MARK_AHEAD]):
                    break  # Redis failed: read again (nothing was handed out of these)
                if not self.valid():  # paused past our lease while reading: these may be another's now
                    self.held.clear()
                    break
                held = self.held.get(batch.doc)
                if held is not None and held.version == batch.version and held.releasing:
                    await self._drop(batch, held)  # read before the handover was seen: not handed out
                elif (
                    held is not None and held.version == batch.version and batch.doc not in self.paused
                ):  # else moved away meanwhile
                    self._count_redelivered(batch.doc, held, batch.entries)
                    yield batch

    async def _mark_handed_out(self, batches: list[Batch]) -> bool:
        """Before handing ``batches`` out: record per document how far its
        application is given entries (a takeover counts what it reads again
        up to there), and stop at once for documents another member claimed.
        False when Redis failed (the documents read again from their cursor)."""
        batches = [
            batch
            for batch in batches
            if (held := self.held.get(batch.doc)) is not None and held.version == batch.version and not held.releasing
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
                if (held := self.held.get(batch.doc)) is not None and held.version == batch.version:
                    self._unread(batch, held)
            return False
        for batch, (fence, _, _) in zip(batches, replies, strict=True):
            held = self.held.get(batch.doc)
            if text(fence) == "stale" and held is not None and held.version == batch.version:
                del self.held[batch.doc]  # claimed by another since we read: hand nothing out
        return True

    async def _marks(self, marks: list[tuple[str, int, StreamId | None]]) -> list[Any]:
        """:meth:`~.progress.Progress.mark_read` for each (doc, version,
        through), in one round trip: packed by hand on one Redis (redis-py's
        pipeline sends a ``SCRIPT EXISTS`` first, a second round trip per
        batch: :mod:`yrelay.redis_packed`), redis-py's on a cluster."""
        async with redis_packed.pipeline(self.redis) as pipe:
            for doc, version, through in marks:
                await self.progress.mark_read(pipe, doc, version, through)
            if isinstance(pipe, redis_packed.Batch):
                return await pipe.execute(scripts=[self.progress.scripts.consumer_read])
            return await pipe.execute()

    def _unread(self, batch: Batch, held: Held) -> None:
        """Forget a batch read and not handed out: it is read again (a
        snapshot batch: the document is claimed again from its snapshot)."""
        if held.unacked and held.unacked[-1][1] == batch.offset:
            first, _, _ = held.unacked.pop()
            self._read_soon(batch.doc)
            if batch.entries:
                held.cursor = _before(first)
            else:
                held.cursor, held.restart = None, batch.restart
                self._unclaimed.add(batch.doc)

    async def _drop(self, batch: Batch, held: Held) -> None:
        """Forget a batch read and not handed out (the document is being
        handed over); the document's next owner reads it."""
        self._unread(batch, held)  # read again should the handover be cancelled
        await self._release_if_finished(batch.doc, held)

    async def _step(self) -> list[Batch]:
        """Claim the documents new to us (their snapshot batches, if any),
        else one blocking read over the documents due (:meth:`_xread`)."""
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
                if (held := self.held.get(batch.doc)) is not None and held.version == batch.version:
                    self._unread(batch, held)
            raise
        if starts:
            return starts
        if not self.held:
            self._changed.clear()
            await wait_event(self._changed, self.block_ms / 1000)
            return []
        due, reply = await self._xread()
        return await self._read(due, reply) if reply else []

    def _cursor(self, doc: str) -> StreamId | None:
        """Where ``doc`` is read from; None when it is not read now (not
        held, not claimed yet, paused, being handed over)."""
        held = self.held.get(doc)
        if held is None or held.cursor is None or held.releasing or doc in self.paused:
            return None
        if held.set_aside_until and held.set_aside_until > time.monotonic():
            return None
        return held.cursor

    def _cursors(self) -> dict[str, StreamId]:
        """:meth:`_cursor` of every document held (for a sweep)."""
        return {doc: cursor for doc in self.held if (cursor := self._cursor(doc)) is not None}

    def _read_soon(self, doc: str) -> None:
        """Read ``doc`` in the next round, not at the next sweep."""
        if self.wakeups is not None:
            self.wakeups.wake(doc)
        else:
            self.changes.wake(doc)

    async def _start(self, doc: str, held: Held) -> Batch | None:
        """Claim ``doc``; the snapshot batch when the group starts from it."""
        self._read_soon(doc)
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

    async def _xread(self) -> tuple[dict[str, StreamId], StreamReads]:
        """The documents due (-> the cursor read from), and their new
        entries as ``(stream key, entries)``, within ``block_ms``: those
        woken, all of them on a sweep; one blocking XREAD with the change
        stream on one Redis, per-document reads on a cluster."""
        if self.wakeups is None:
            return await self._xread_announced()
        due = await self.wakeups.next_round(self._cursors, self._cursor)
        if not due:
            return due, []
        reads = await self.wakeups.read(due, self.batch_size)
        for doc, exc in reads.refused.items():  # the others go on
            self._set_aside(doc, exc)
        return due, reads.pairs

    async def _xread_announced(self) -> tuple[dict[str, StreamId], StreamReads]:
        """One Redis: XREAD BLOCK over the change stream and the documents
        due (:class:`~yrelay.change_feed.ChangeFeed`); a Redis failure
        loses our place in the change stream (the round after sweeps)."""
        changes = self.changes
        await changes.follow(self.redis, SET_ASIDE_SECONDS)
        now = time.monotonic()
        due = changes.due(now, self._cursors, self._cursor)
        streams: dict[KeyT, StreamIdT] = {stream_key(doc): str(cursor) for doc, cursor in due.items()}
        if changes.listening(now):
            assert changes.cursor is not None
            streams = {changes_key(): changes.cursor, **streams}
        if not streams:  # nothing to read now (paused, being handed over)
            self._changed.clear()
            await wait_event(self._changed, changes.block_ms_left(now) / 1000)
            return due, []
        try:
            # RESP2 (ConsumerGroup refuses a RESP3 client): a list of (key, entries)
            reply = cast(
                StreamReads,
                await self.redis.xread(streams, count=self.batch_size, block=changes.block_ms_left(now)) or [],
            )
        except redis.exceptions.ResponseError as exc:
            changes.lost()  # a change stream of the wrong type is set aside at the next follow()
            if not is_wrong_type(exc):  # BUSY, MASTERDOWN...: Redis's passing state, retried
                raise
            reads = await read_each(self.redis, due, self.batch_size)  # each on its own: whose key is it?
            for doc, refused in reads.refused.items():
                self._set_aside(doc, refused)
            reply = reads.pairs
        except Exception as exc:
            if not lost_redis(exc):
                raise
            changes.lost()
            raise
        documents: StreamReads = []
        for key, entries in reply:  # RESP2: ConsumerGroup refuses a RESP3 client
            if text(key) == changes_key():
                changes.take(entries, self.held.__contains__, self.batch_size)
                continue
            documents.append((key, entries))
            if len(entries) >= self.batch_size:  # there may be more
                changes.wake(_doc_of_stream(key))
        return due, documents

    def _set_aside(self, doc: str, exc: Exception) -> None:
        """Redis refused to read ``doc`` (a key of the wrong type): read it
        no more for :data:`SET_ASIDE_SECONDS` (then again, at a sweep:
        someone may have repaired the key). Without this, on one Redis, one
        broken stream stopped the member for every document it holds."""
        if (held := self.held.get(doc)) is not None:
            held.set_aside_until = time.monotonic() + SET_ASIDE_SECONDS
            log.error(
                "consumer group %s: document %s cannot be read (%s); set aside for %ss",
                self.progress.group,
                doc,
                exc,
                SET_ASIDE_SECONDS,
                extra={"doc": doc},
            )

    async def _read(self, cursors: dict[str, StreamId], reply: StreamReads) -> list[Batch]:
        """Batches of ``reply``, read from ``cursors``: each document's fence
        and trim mark checked in one round trip first."""
        read = [(_doc_of_stream(key), entries) for key, entries in reply if entries]
        versions = {doc: self.held[doc].version for doc, _ in read if doc in self.held}
        read = [(doc, entries) for doc, entries in read if doc in versions]
        marks = await self._marks([(doc, versions[doc], None) for doc, _ in read])
        batches = []
        for (doc, raw_entries), (fence, mark, head) in zip(read, marks, strict=True):
            held = self.held.get(doc)
            if held is None or held.cursor != cursors[doc] or held.version != versions[doc]:
                continue  # taken from us, or restarted, while we read
            if text(fence) == "stale":  # another member claimed it: hand nothing out
                del self.held[doc]
                continue
            trimmed = stream_id(mark or None)
            if trimmed is not None and cursors[doc] < trimmed:
                held.cursor, held.restart = None, "trimmed"
                self._unclaimed.add(doc)
                continue
            entries = [to_entry(entry_id, fields) for entry_id, fields in raw_entries]
            held.cursor = entries[-1].id
            held.unacked.append((entries[0].id, held.cursor, len(entries)))
            held.head = max(stream_id(head or None) or held.cursor, held.cursor)
            deleted = is_deletion(entries[-1])  # the marker ends the stream (yrelay/deletion.py)
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
