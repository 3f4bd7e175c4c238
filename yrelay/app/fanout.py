"""One reader per server process: a blocking XREAD over the streams of the
documents subscribed here that have something new, handing each batch of new
entries to those subscribers.

Which documents have something new, and reading them, is the reader loop's
(:mod:`yrelay.storage.reader`: the change stream on one Redis, per-bucket
wake-ups on a cluster, a sweep every ``block_ms``, documents set aside,
streams that went back after a failover); the fan-out is its
:class:`~yrelay.storage.reader.Follower` and hands what it reads to the
subscriptions.

Fan-out goes through Redis streams, never through process memory, so any
number of server processes can serve one document. Batches of one document are
contiguous (each starts exactly where the previous one ended), which lets a
subscription tell whether it can take a batch as is or must first read the
gap from the stream.

Whom to feed is the process's :class:`~.subscribers.SubscriptionRegistry`, shared
with the ack path (evictions reach the same subscriptions). Subscriptions
call :meth:`Fanout.register` and :meth:`Fanout.unregister`; the fan-out
talks back only through the small :class:`Subscriber` protocol, so it never
depends on the subscription's module.

A document the reader loop sets aside is reported to its subscribers
(:meth:`Subscriber.document_failed`); one whose stream went back has them
resync (:meth:`Subscriber.stream_rewound`), which gives the server back
what it lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from redis.asyncio import Redis

from yrelay.app import sizing
from yrelay.app.subscribers import Member, SubscriptionRegistry
from yrelay.storage.client import is_cluster
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.reader import DocEntries, DocumentReader, retrying
from yrelay.storage.reads import DocumentStore, Entry, to_entry
from yrelay.tasks import BackgroundTask


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
    #: The newest id an append of this process was acked with (its writer
    #: holds it; the reader may not have read it yet).
    stored: StreamId = ZERO


class Fanout:
    """The server's :class:`~yrelay.storage.reader.Follower` (and
    :class:`~yrelay.storage.reader.Rewinds`): one :class:`Feed` per
    document subscribed here. ``url_redis``: the reader loop's own client (a
    single connection blocking in XREAD on one Redis; on a cluster a
    cluster client of its own: redis-py closes every connection of a
    cluster client when one node fails, and the appender's should not go
    down with the fan-out's blocked reads)."""

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
        self.reader = url_redis  # owned by this fan-out
        self.store = store
        self.subscribers = subscribers
        self.block_ms = block_ms
        #: Entries per stream per read, at most ``max_count``: fewer when they
        #: are large, so one read of a document stays near ``max_bytes``.
        self.max_count = count
        self.max_bytes = max_bytes
        self.count = sizing.first_count(count, max_bytes)
        self.feeds: dict[str, Feed] = {}
        clustered = is_cluster(url_redis)
        self.documents = DocumentReader(
            url_redis if clustered else store.redis,
            self,
            block_ms=block_ms,
            name="yrelay-fanout",
            label="fan-out",
            blocking=None if clustered else url_redis,
            rewinds=self,
        )
        self._loop = BackgroundTask("yrelay-fanout", self._run)

    def start(self) -> None:
        self.documents.start()
        self._loop.start()

    async def stop(self) -> None:
        await self.documents.stop()
        await self._loop.stop()
        await self.reader.aclose()

    @property
    def failures(self) -> int:
        """Redis failures the reader saw (each calls for a check): a
        subscriber that read the stream while one happened checks what it read."""
        return self.documents.failures

    def cursor(self, doc: str) -> StreamId | None:
        feed = self.feeds.get(doc)
        return feed.cursor if feed else None

    def cursors(self) -> Mapping[str, StreamId]:
        return {doc: feed.cursor for doc, feed in self.feeds.items()}

    async def register(self, subscriber: Subscriber) -> StreamId:
        """Start feeding ``subscriber``; returns the feed's cursor: everything
        after it will be offered, everything up to it the subscriber reads itself."""
        feed = self.feeds.get(subscriber.doc)
        if feed is None:
            last = await self.store.last_id(subscriber.doc)
            feed = self.feeds.get(subscriber.doc)  # another task may have won the race
            if feed is None:
                feed = self.feeds[subscriber.doc] = Feed(cursor=last)
                self.documents.added(subscriber.doc)
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
            self.documents.removed(subscriber.doc)

    async def _run(self) -> None:
        rounds = retrying(
            self._round, lost="fan-out reader: Redis failed", bug="fan-out reader failed", failed=self.documents.failed
        )
        async for _ in rounds:
            pass

    async def _round(self) -> None:
        if self.feeds:
            self._dispatch(await self.documents.read(self.count))
        else:
            await self.documents.idle(self.block_ms / 1000)

    def marks(self, doc: str) -> set[StreamId]:
        """The ids ``doc``'s stream must still hold: what the reader read,
        what this process's appends were acked with, and what each
        subscriber was sent (a /yws feed's sync answer and its catch-up
        read ahead of the reader; so may a /ws sync answer)."""
        feed = self.feeds[doc]
        marks = {feed.cursor, feed.stored}
        for subscriber in self.subscribers.of(doc):
            if (cursor := subscriber.cursor) is not None:
                marks.add(cursor)
        return marks

    def rewound(self, doc: str, last: StreamId) -> None:
        """``doc``'s stream lost entries this process had seen: its cursor
        goes back to the stream's last id and its subscribers resync."""
        feed = self.feeds[doc]
        feed.cursor, feed.stored = min(feed.cursor, last), ZERO
        for subscriber in self.subscribers.of(doc):
            subscriber.stream_rewound()

    def set_aside(self, doc: str, reason: str) -> None:
        for subscriber in self.subscribers.of(doc):
            subscriber.document_failed(reason)

    def _dispatch(self, reads: list[DocEntries]) -> None:
        for doc, _, raw_entries in reads:
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


__all__ = ["Batch", "Fanout", "Feed", "Subscriber"]
