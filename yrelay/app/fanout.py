"""One reader per server process: a blocking XREAD over the streams of the
documents subscribed here that have something new, handing each batch of new
entries to those subscribers.

Which have something new, the change stream says (:mod:`yrelay.change_feed`):
each round reads it, with the documents its announcements named the round
before; every ``block_ms`` a sweep reads every subscribed document, for what
no announcement named.

Fan-out goes through Redis streams, never through process memory, so any
number of server processes can serve one document. Batches of one document are
contiguous (each starts exactly where the previous one ended), which lets a
subscription tell whether it can take a batch as is or must first read the
gap from the stream.

Whom to feed is the process's :class:`~.acks.SubscriptionRegistry`, shared
with the ack path (evictions reach the same subscriptions). Subscriptions
call :meth:`Fanout.register` and :meth:`Fanout.unregister`; the fan-out
talks back only through the small :class:`Subscriber` protocol, so it never
depends on the subscription's module.

Isolation: if Redis rejects the multi-stream XREAD because a key has the
wrong type, every document is probed on its own, the broken ones are set aside
for a while and reported to their subscribers, and the rest carry on. Any other
refusal (``BUSY`` while a script runs long, ``MASTERDOWN``) is Redis's, not a
document's: the loop retries, nothing is set aside.

Streams that went back: after the reader saw Redis fail, and before it reads
again, it checks that the entries it had seen (and those this process's
appends were acked with, and each subscriber's cursor) are still there
(:mod:`.rewind`); the subscribers of a document that lost some resync, which
gives the server back what it lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, cast

import redis.exceptions
from redis.asyncio import Redis

from ..backoff import Reconnect
from ..change_feed import ChangeFeed
from ..cluster_reads import read_each
from ..keys import changes_key, stream_key
from ..offsets import ZERO, StreamId
from ..redis_client import UNREACHABLE, lost_redis
from ..redis_packed import bulk as _bulk
from ..replies import is_wrong_type
from ..store import DocumentStore, Entry, to_entry
from ..tasks import BackgroundTask, spawn, wait_event
from . import sizing
from .acks import Member, SubscriptionRegistry
from .rewind import find_rewound

log = logging.getLogger(__name__)

QUARANTINE_SECONDS = 30.0


@dataclass(frozen=True)
class Batch:
    """Entries of one document with ids in ``(after, last]``, all of them.

    ``frames``: deliver frames already encoded from this batch, shared by
    every subscriber that sends the same entries (encode once, send to many);
    ``prepared``: the same, framed for the websocket.
    """

    after: StreamId
    entries: list[Entry]
    frames: dict[tuple[object, ...], str] = field(default_factory=dict, compare=False, repr=False)
    #: The same frames as websocket frames (:func:`yrelay.transport.prepared_frames.text_frame`), by the same keys.
    prepared: dict[tuple[object, ...], bytes] = field(default_factory=dict, compare=False, repr=False)

    @property
    def last(self) -> StreamId:
        return self.entries[-1].id

    @cached_property
    def nbytes(self) -> int:
        """The updates' size: what holding this batch keeps alive."""
        return sum(len(entry.update) for entry in self.entries)


class Subscriber(Member, Protocol):
    """What the fan-out calls on a subscription (synchronous, for every subscriber)."""

    def offer(self, batch: Batch) -> None:
        """New entries of the document."""

    def document_failed(self, reason: str) -> None:
        """The document's stream cannot be read (set aside for a while)."""

    def stream_rewound(self) -> None:
        """The document's stream lost entries this process had seen (a
        failover, a restore): the client may hold what the server lost."""

    @property
    def cursor(self) -> StreamId | None:
        """Everything up to here was sent to the client (None: nothing yet).
        It may be ahead of the fan-out's own cursor (a sync answer reads the
        stream itself), so the check after a failure looks for it too."""


@dataclass
class Feed:
    """Per-document fan-out state of this process."""

    cursor: StreamId
    broken_until: float = 0.0
    #: The newest id an append of this process was acked with (its writer
    #: holds it; the reader may not have read it yet).
    stored: StreamId = ZERO


class Fanout:
    def __init__(
        self,
        url_redis: Redis,
        store: DocumentStore,
        subscribers: SubscriptionRegistry[Subscriber],
        *,
        block_ms: int,
        count: int,
        max_bytes: int = 1024 * 1024,
    ):
        self.reader = url_redis  # a single-connection client, owned by this loop
        self.store = store
        self.subscribers = subscribers
        self.block_ms = block_ms
        #: Entries per stream per read, at most ``max_count``: fewer when they
        #: are large, so one read of a document stays near ``max_bytes``.
        self.max_count = count
        self.max_bytes = max_bytes
        self.count = sizing.first_count(count, max_bytes)
        self.feeds: dict[str, Feed] = {}
        self._changed = asyncio.Event()
        self._reader_id: int | None = None
        self._generation = 0  # bumped when the set of documents changes
        self._reading_generation = -1
        #: The one task waking the reader for new documents (a burst of
        #: subscribes shares it: it retries until the read covers the newest).
        self._interrupting: asyncio.Task[None] | None = None
        self._loop = BackgroundTask("yrelay-fanout", self._run)
        #: doc -> (cursor, its stream key and cursor packed as RESP bulk strings)
        self._packed: dict[str, tuple[StreamId, bytes, bytes]] = {}
        #: The documents to read next (:mod:`yrelay.change_feed`).
        self.changes = ChangeFeed(block_ms)
        #: Documents to check for a stream that went back before the next
        #: read, with the ids to look for (cursor, stored and the
        #: subscribers' cursors) as they were when the reader saw Redis fail
        #: (:mod:`.rewind`): appends acked since may be on a new master already.
        self._unverified: dict[str, set[StreamId]] = {}
        #: Redis failures the reader saw (each calls for a check): a
        #: subscriber that read the stream while one happened checks what it read.
        self.failures = 0

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        if self._interrupting is not None:
            self._interrupting.cancel()
        await self._loop.stop()
        await self.reader.aclose()

    def cursor(self, doc: str) -> StreamId | None:
        feed = self.feeds.get(doc)
        return feed.cursor if feed else None

    async def register(self, subscriber: Subscriber) -> StreamId:
        """Start feeding ``subscriber``; returns the feed's cursor: everything
        after it will be offered, everything up to it the subscriber reads itself."""
        feed = self.feeds.get(subscriber.doc)
        if feed is None:
            last = await self.store.last_id(subscriber.doc)
            feed = self.feeds.get(subscriber.doc)  # another task may have won the race
            if feed is None:
                feed = self.feeds[subscriber.doc] = Feed(cursor=last)
                self._documents_changed(subscriber.doc)
        self.subscribers.add(subscriber)
        return feed.cursor

    def stored(self, doc: str, entry_id: StreamId) -> None:
        """An append to ``doc`` by this process was acked with ``entry_id``:
        checked with what the reader read after a Redis failure."""
        feed = self.feeds.get(doc)
        if feed is not None and entry_id > feed.stored:
            feed.stored = entry_id

    def unregister(self, subscriber: Subscriber) -> None:
        if self.subscribers.discard(subscriber):  # the document's last one here
            self.feeds.pop(subscriber.doc, None)
            self._packed.pop(subscriber.doc, None)
            self._generation += 1

    def _documents_changed(self, added: str) -> None:
        """``added`` is followed from now on: read it now (an entry appended
        since its cursor may have been announced before it was followed)."""
        self.changes.wake(added)
        self._generation += 1
        self._changed.set()
        if self._interrupting is None or self._interrupting.done():
            self._interrupting = spawn(self._interrupt_read(), name="yrelay-fanout-interrupt")

    async def _interrupt_read(self) -> None:
        """Wake the blocking XREAD so it reads new documents now, not after
        ``block_ms``: until the reader has started a read that covers the
        newest change (it may be between two reads, or start one that
        misses a document added meanwhile), for at most 50 tries."""
        for _ in range(50):
            if self._reading_generation >= self._generation or self._reader_id is None:
                return
            try:
                await self.store.redis.client_unblock(self._reader_id)
            except Exception as exc:  # the reader reconnects by itself
                if not lost_redis(exc):
                    raise
                return
            await asyncio.sleep(0.005)

    async def _run(self) -> None:
        reconnect = Reconnect()
        while True:
            try:
                if self._unverified:
                    await self._check_rewound()
                await self._read_once()
                reconnect.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # lost, or refused for its own reasons (BUSY, MASTERDOWN), or a bug
                if lost_redis(exc):
                    log.warning("fan-out reader: Redis failed (%r); retrying in %.1fs", exc, reconnect.delay)
                else:
                    log.exception("fan-out reader failed; retrying in %.1fs", reconnect.delay)
                self._reader_id = None
                self._suspect_all()
                await reconnect.wait()

    def _suspect_all(self) -> None:
        """Redis failed: a failover may have lost entries this process had
        seen; check every document before reading on (the first marks kept),
        and follow the change stream again from its end (announcements may
        be lost: the round after sweeps)."""
        self.changes.lost()
        self.failures += 1
        for doc, feed in self.feeds.items():
            self._unverified.setdefault(doc, set()).update(self._marks(doc, feed))

    def _marks(self, doc: str, feed: Feed) -> set[StreamId]:
        """The ids ``doc``'s stream must still hold: what the reader read,
        what this process's appends were acked with, and what each
        subscriber was sent (a /yws feed's sync answer and its catch-up
        read ahead of the reader; so may a /ws sync answer)."""
        marks = {feed.cursor, feed.stored}
        for subscriber in self.subscribers.of(doc):
            if (cursor := subscriber.cursor) is not None:
                marks.add(cursor)
        return marks

    async def _check_rewound(self) -> None:
        """Before reading again after a failure: did a document's stream
        lose entries this process had seen, or that one of its subscribers
        was sent? Its cursor goes back to the stream's last id and its
        subscribers resync (:mod:`.rewind`)."""
        seen = {
            doc: marks | self._marks(doc, self.feeds[doc])  # with what the subscribers read meanwhile
            for doc, marks in self._unverified.items()
            if doc in self.feeds
        }
        try:
            rewound = await find_rewound(self.store.redis, seen)
        except Exception as exc:  # not back yet (a failover in progress): after the backoff
            if not (isinstance(exc, UNREACHABLE) or lost_redis(exc)):
                raise
            raise redis.exceptions.ConnectionError(f"checking the streams after a failure: {exc!r}") from exc
        self._unverified.clear()
        for doc, last in rewound.items():
            feed = self.feeds.get(doc)
            if feed is None:
                continue
            log.warning(
                "document %s lost entries this process had seen (up to %s; its last id is now %s): "
                "a failover to a replica that lagged, or a restore; its subscribers here resync",
                doc,
                max(seen[doc]),
                last,
                extra={"doc": doc},
            )
            feed.cursor, feed.stored = min(feed.cursor, last), ZERO
            for subscriber in self.subscribers.of(doc):
                subscriber.stream_rewound()

    def _readable(self) -> dict[str, StreamId]:
        now = time.monotonic()
        return {doc: feed.cursor for doc, feed in self.feeds.items() if feed.broken_until <= now}

    def _round(self, now: float) -> dict[str, StreamId]:
        """The documents (-> cursor) to read this round: every readable one
        on a sweep (every ``block_ms``, and every round while the change
        stream cannot be read), else those woken."""
        feeds = self.feeds
        return self.changes.due(
            now,
            self._readable,
            lambda doc: feed.cursor if (feed := feeds.get(doc)) is not None and feed.broken_until <= now else None,
        )

    async def _read_once(self) -> None:
        if self._reader_id is None:
            self._reader_id = await self.reader.client_id()
        if not self.feeds:
            self._reading_generation = self._generation
            self._changed.clear()
            await wait_event(self._changed, self.block_ms / 1000)
            return
        await self.changes.follow(self.reader, QUARANTINE_SECONDS)
        self._reading_generation = self._generation
        now = time.monotonic()
        readable = self._round(now)
        listening = self.changes.listening(now)
        if not readable and not listening:  # every document set aside
            self._changed.clear()
            await wait_event(self._changed, self.block_ms / 1000)
            return
        block_ms = self.changes.block_ms_left(now)
        count = self.count
        try:
            reply = await self._xread(readable, count, block_ms, listening)
        except redis.exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            await self._isolate_broken(readable, listening)
            return
        self._dispatch(self._take_changes(reply, count))

    async def _xread(self, readable: dict[str, StreamId], count: int, block_ms: int, listening: bool) -> StreamPairs:
        """XREAD BLOCK over the change stream (when ``listening``) and
        ``readable``, packed here: redis-py spends ~1.5 ms packing a command
        over 1,000 streams, more than Redis takes to answer it; each
        document's key and cursor are packed once and reused."""
        parts = (b"XREAD", b"COUNT", b"%d" % count, b"BLOCK", b"%d" % block_ms, b"STREAMS")
        keys, ids = [], []
        if listening:
            assert self.changes.cursor is not None
            keys.append(_CHANGES_KEY)
            ids.append(_bulk(self.changes.cursor.encode()))
        for doc, cursor in readable.items():
            packed = self._packed.get(doc)
            if packed is None or packed[0] != cursor:
                key = packed[1] if packed else _bulk(stream_key(doc).encode())
                packed = self._packed[doc] = (cursor, key, _bulk(str(cursor).encode()))
            keys.append(packed[1])
            ids.append(packed[2])
        connection = self.reader.connection  # a single-connection client, opened by client_id()
        assert connection is not None
        command = b"".join([b"*%d\r\n" % (len(parts) + 2 * len(keys)), *map(_bulk, parts), *keys, *ids])
        await connection.send_packed_command(command, check_health=False)
        return _stream_pairs(await connection.read_response())

    def _take_changes(self, reply: StreamPairs, count: int) -> StreamPairs:
        """The documents' part of ``reply``; the change stream's entries wake
        the documents they name, and a document whose read came back full
        (``count`` entries: there may be more) is read again next round."""
        documents: StreamPairs = []
        for raw_key, raw_entries in reply:
            if raw_key == _CHANGES_RAW_KEY:
                self.changes.take(raw_entries, self.feeds.__contains__, count)
                continue
            documents.append((raw_key, raw_entries))
            if len(raw_entries) >= count:
                self.changes.wake(_doc_of(raw_key))
        return documents

    def _dispatch(self, reply: StreamPairs) -> None:
        for raw_key, raw_entries in reply:
            doc = _doc_of(raw_key)
            feed = self.feeds.get(doc)
            if feed is None or not raw_entries:
                continue
            entries = [to_entry(entry_id, fields) for entry_id, fields in raw_entries]
            self.count = sizing.next_count(self.count, entries, self.max_count, self.max_bytes)
            entries = [entry for entry in entries if entry.id > feed.cursor]
            if not entries:
                continue
            batch = Batch(feed.cursor, entries)
            feed.cursor = batch.last
            for subscriber in self.subscribers.of(doc):
                subscriber.offer(batch)

    async def _isolate_broken(self, readable: dict[str, StreamId], listening: bool) -> None:
        if listening:
            assert self.changes.cursor is not None
            try:
                changes = await self.store.redis.xread({changes_key(): self.changes.cursor}, count=self.count)
                self._take_changes(cast(StreamPairs, changes or []), self.count)  # redis-py's parsed XREAD
            except redis.exceptions.ResponseError as exc:
                if not is_wrong_type(exc):
                    raise
                self.changes.set_aside(exc, QUARANTINE_SECONDS)
        reads = await read_each(self.store.redis, readable, self.count)  # one pipeline, a read per document
        for doc, refusal in reads.refused.items():
            self._set_aside(doc, refusal)
        for doc in reads.full:
            self.changes.wake(doc)
        self._dispatch(reads.pairs)

    def _set_aside(self, doc: str, exc: Exception) -> None:
        """``doc``'s stream cannot be read: skip it for a while, tell its subscribers."""
        feed = self.feeds.get(doc)
        if feed is None:
            return
        log.error(
            "document %s cannot be read (%s); set aside for %ss", doc, exc, QUARANTINE_SECONDS, extra={"doc": doc}
        )
        feed.broken_until = time.monotonic() + QUARANTINE_SECONDS
        for subscriber in self.subscribers.of(doc):
            subscriber.document_failed(str(exc))


#: A stream entry as read: its id and fields.
RawEntry = tuple[bytes, dict[bytes, bytes]]
#: An XREAD reply: each stream's key and entries.
StreamPairs = list[tuple[bytes, list[RawEntry]]]
#: An unparsed XREAD reply's entries: ids and flat field lists.
_RespEntries = list[tuple[bytes, list[bytes]]]


def _stream_pairs(reply: object) -> StreamPairs:
    """An XREAD reply (a RESP3 map or a RESP2 list) as ``[(key, [(id, fields)])]``."""
    if not reply:
        return []
    raw = cast("dict[bytes, _RespEntries] | list[tuple[bytes, _RespEntries]]", reply)
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [
        (key, [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in entries])
        for key, entries in pairs
    ]


_CHANGES_RAW_KEY = changes_key().encode()
_CHANGES_KEY = _bulk(_CHANGES_RAW_KEY)


def _doc_of(raw_key: bytes) -> str:
    key = raw_key.decode()
    return key[key.index("{") + 1 : key.rindex("}")]


__all__ = ["Batch", "Fanout", "Feed", "Subscriber"]
