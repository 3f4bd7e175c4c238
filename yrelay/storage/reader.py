"""The reader loop: following a set of documents in Redis, for the server's
fan-out (:mod:`yrelay.app.fanout`) and a consumer group's member
(:mod:`yrelay.consumers.reader`), the one code that does it.

Its user (a :class:`Follower`) says which documents it reads and from where,
calls :meth:`DocumentReader.read` in its own loop and is handed each
document's new entries; it is told of a document set aside and, if it
asks (:class:`Rewinds`), of a stream that went back. A round reads only what
has something new, never every document followed:

- **One Redis: the change stream.** Every append batch ends with one entry
  on the capped change stream naming its documents (``yrelay:changes``,
  :func:`yrelay.storage.change_feed.announce_in`, in the batch's own pipeline, so
  whoever reads it finds the entries). A round is one ``XREAD BLOCK`` over
  the change stream and the documents the announcements read the round
  before named (:class:`ChangeFeed`), packed here from per-document pieces
  packed once (redis-py packing a command over 1,000 streams took longer
  than Redis answering it). With 1,000 documents at a few thousand
  updates/s, one XREAD over every followed stream per round was ~10% of the
  server's samples and half of Redis' CPU (BENCHMARKS.md, issue 20).
- **A Redis Cluster: per-bucket wake-ups.** A cluster refuses a multi-key
  XREAD across slots (``CROSSSLOT``), and every document has its own slot.
  The appender adds one entry per bucket the batch touched
  (:func:`yrelay.storage.change_feed.announce_buckets`, after the batch's pipeline
  answered); :class:`BucketWakeups` blocks one task per bucket (16) on its
  bucket's stream and collects the documents named that are followed, and
  a round reads those, one single-key XREAD each in one pipeline
  (:func:`read_each`: redis-py sends each node its share on one connection).
  Why this and not the other designs: docs/architecture.md#redis-cluster.
- **A sweep every ``block_ms``** reads every document followed: what nothing
  announced (a server of an older version, an announcement trimmed or lost
  to a failure) arrives within ``block_ms``. After Redis failed
  (:meth:`DocumentReader.failed`) the change stream is followed again from
  its end, and the next round sweeps. A document whose read came back full
  (``count`` entries) is read again the next round.
- **Set aside.** If Redis refuses the multi-stream XREAD because a key has
  the wrong type (``WRONGTYPE``), each document is read on its own (one
  pipeline) and those refused are set aside for :data:`SET_ASIDE_SECONDS`
  (logged, and :meth:`Follower.set_aside`), the rest carry on; then again at
  a sweep (someone may have repaired the key). A change stream of the wrong
  type is set aside the same way: meanwhile every round sweeps. Any other
  refusal (``BUSY`` while a script runs long, ``MASTERDOWN``) is Redis's
  passing state, not a document's: raised for the user's retry, nothing set
  aside.
- **Streams that went back** (for a :class:`Rewinds` user): after a failure,
  and on a cluster when the slot map names other masters (redis-py may have
  got past a failover by itself), the ids the user had seen are looked for
  before anything is read on (:func:`.rewind.find_rewound`); a document
  that lost some is reported (:meth:`Rewinds.rewound`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import redis.exceptions
from redis.asyncio import Redis, RedisCluster

from yrelay.backoff import Reconnect
from yrelay.storage import packed
from yrelay.storage.change_feed import announced
from yrelay.storage.client import CLUSTER_TRANSIENT, UNREACHABLE, is_cluster, xread_one
from yrelay.storage.keys import DOCUMENT_BUCKETS, bucket_changes_key, changes_key, stream_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.packed import bulk
from yrelay.storage.replies import RawEntry, is_wrong_type, text
from yrelay.storage.rewind import find_rewound
from yrelay.tasks import BackgroundTask, lost_redis, raise_lost_cancel, spawn, wait_event

log = logging.getLogger(__name__)

#: How long a stream Redis refuses to read (a key of the wrong type) is set
#: aside: a document (the others read on meanwhile), or the change stream
#: (every round sweeping meanwhile).
SET_ASIDE_SECONDS = 30.0
T = TypeVar("T")
#: The longest a wake-up read blocks (ms), whatever ``block_ms`` says: it
#: must end well within the client's socket timeout.
MAX_WATCH_BLOCK_MS = 5_000


class DocEntries(NamedTuple):
    """A document's new entries, as read."""

    doc: str
    #: The cursor they were read from (the user's may have moved meanwhile).
    after: StreamId
    entries: list[RawEntry]


_STREAM_PREFIX, _STREAM_SUFFIX = (part.encode() for part in stream_key("\0").split("\0"))
_CHANGES_RAW_KEY = changes_key().encode()
_CHANGES_KEY = bulk(_CHANGES_RAW_KEY)


def doc_of(key: bytes) -> str:
    """The document of a stream key (:func:`yrelay.storage.keys.stream_key`)."""
    return key[len(_STREAM_PREFIX) : -len(_STREAM_SUFFIX)].decode()


class Follower(Protocol):
    """What the reader loop asks of its user (synchronous)."""

    def cursor(self, doc: str) -> StreamId | None:
        """Where ``doc`` is read from (everything up to it was read); None:
        not read now (not followed, or held back by the user)."""

    def cursors(self) -> Mapping[str, StreamId]:
        """:meth:`cursor` of every document read now (a sweep)."""

    def set_aside(self, doc: str, reason: str) -> None:
        """Redis refused to read ``doc`` (a key of the wrong type): it is
        not read for :data:`SET_ASIDE_SECONDS`."""


class Rewinds(Protocol):
    """A user that wants to know of streams that went back (a failover to a
    replica that lagged, a restore)."""

    def marks(self, doc: str) -> set[StreamId]:
        """The ids ``doc``'s stream must still hold."""

    def rewound(self, doc: str, last: StreamId) -> None:
        """``doc``'s stream lost one of :meth:`marks`; ``last`` is its last id now."""


async def retrying(
    step: Callable[[], Awaitable[T]],
    *,
    lost: str,
    bug: str | None = None,
    until: Callable[[], bool] = lambda: False,
    failed: Callable[[], None] = lambda: None,
) -> AsyncIterator[T]:
    """A reading loop: what each ``step()`` (a round, and what its user
    makes of it) returns, until ``until()``. Redis lost (or refusing for a
    while: BUSY, MASTERDOWN, :func:`~yrelay.storage.client.lost_redis`) is
    logged (``lost``, a warning), then ``failed()`` (a reader loop's user:
    :meth:`DocumentReader.failed`) and a backoff of 0.1 s doubling to 5 s,
    from 0.1 s again after a step that succeeded. Anything else is raised
    (a :class:`~yrelay.tasks.BackgroundTask` logs its traceback and restarts
    it after a second or more), or, with ``bug``, logged with its traceback
    and retried the same way (the fan-out: its subscribers should not wait
    for a restart of its task, a minute at worst)."""
    reconnect = Reconnect()
    while not until():
        raise_lost_cancel()
        try:
            result = await step()
        except Exception as exc:
            if lost_redis(exc):
                log.warning("%s (%r); retrying in %.1fs", lost, exc, reconnect.delay)
            elif bug is not None:
                log.exception("%s; retrying in %.1fs", bug, reconnect.delay)
            else:
                raise
            failed()
            await reconnect.wait()
            continue
        reconnect.succeeded()
        yield result


class DocumentReader:
    """One user's reader loop (module doc). ``redis``: the client of the
    per-document reads (a cluster client: every read); ``blocking``: on one
    Redis, a single-connection client of the user's own for the blocking
    XREAD, so that :meth:`added` can interrupt it (else each read borrows
    a connection of ``redis``'s pool)."""

    def __init__(
        self,
        redis: Redis,
        follower: Follower,
        *,
        block_ms: int,
        name: str,
        label: str,
        blocking: Redis | None = None,
        rewinds: Rewinds | None = None,
    ):
        self.redis = redis
        self.follower = follower
        self.name, self.label = name, label  # its tasks' names; who reads, in the logs
        self.blocking = blocking
        self.rewinds = rewinds
        #: On a Redis Cluster: the per-bucket wake-ups and the sweep (else None).
        self.wakeups = (
            BucketWakeups(redis, block_ms=block_ms, wanted=self._wanted, name=name) if is_cluster(redis) else None
        )
        #: On one Redis: the change stream's announcements and the sweep.
        self.changes = ChangeFeed(block_ms)
        #: Documents set aside, until then (``time.monotonic()``).
        self.aside: dict[str, float] = {}
        #: Set when a document is added (wakes :meth:`idle`).
        self.changed = asyncio.Event()
        #: Redis failures seen (each calls for a check of the streams): a
        #: user that read a stream while one happened checks what it read.
        self.failures = 0
        #: Documents to check for a stream that went back before the next
        #: read, with the ids to look for as they were when Redis failed.
        self._unverified: dict[str, set[StreamId]] = {}
        #: The masters the cluster client's slot map names (a failover changes them).
        self._masters: frozenset[str] | None = None
        #: doc -> (cursor, its stream key and cursor packed as RESP bulk strings)
        self._packed: dict[str, tuple[StreamId, bytes, bytes]] = {}
        self._blocking_id: int | None = None
        self._generation = 0  # bumped when the set of documents changes
        self._reading_generation = -1
        #: The one task waking the blocking read for new documents (a burst
        #: of them shares it: it retries until the read covers the newest).
        self._interrupting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the wake-up watchers (a Redis Cluster only)."""
        if self.wakeups is not None:
            self.wakeups.start()

    async def stop(self) -> None:
        if self._interrupting is not None:
            self._interrupting.cancel()
        if self.wakeups is not None:
            await self.wakeups.stop()

    # ------------------------------------------------- the user's side

    def wake(self, doc: str) -> None:
        """Read ``doc`` in the next round, not at the next sweep."""
        (self.wakeups or self.changes).wake(doc)

    def added(self, doc: str) -> None:
        """``doc`` is followed from now on: read it now (an entry appended
        since its cursor may have been announced before it was followed),
        interrupting the blocking read; nothing of it is set aside."""
        self.aside.pop(doc, None)
        self.wake(doc)
        self._generation += 1
        self.changed.set()
        if self.blocking is not None and (self._interrupting is None or self._interrupting.done()):
            self._interrupting = spawn(self._interrupt_read(), name=f"{self.name}-interrupt")

    def removed(self, doc: str) -> None:
        """``doc`` is followed no more."""
        self._generation += 1
        self._packed.pop(doc, None)

    async def idle(self, seconds: float) -> None:
        """Nothing to read: wait for a document :meth:`added` (or ``changed``
        set by the user), at most ``seconds``."""
        self._reading_generation = self._generation
        self.changed.clear()
        await wait_event(self.changed, seconds)

    def failed(self) -> None:
        """Redis failed (the user retries after its backoff): follow the
        change stream again from its end (announcements may be lost: the
        next round sweeps) and, for :class:`Rewinds`, check every document
        followed before reading on (the first marks kept)."""
        self.changes.lost()
        self._blocking_id = None
        if self.rewinds is not None:
            self.failures += 1
            for doc in self.follower.cursors():
                self._unverified.setdefault(doc, set()).update(self.rewinds.marks(doc))

    # ------------------------------------------------------------ a round

    async def read(self, count: int) -> list[DocEntries]:
        """One round, within ``block_ms``: the new entries (at most ``count``
        a document) of the documents due, those woken or all of them at a
        sweep. Raises what Redis raised, but a key of the wrong type."""
        if self._unverified:
            await self._check_rewound()
        self._reading_generation = self._generation
        if self.wakeups is not None:
            return await self._read_woken(self.wakeups, count)
        if self.blocking is not None and self._blocking_id is None:
            self._blocking_id = await self.blocking.client_id()
        changes = self.changes
        await changes.follow(self.redis, self.label)
        now = time.monotonic()
        listening = changes.listening(now)  # not: every round sweeps
        due = changes.due(now, self._cursors, self._cursor, sweep=not listening)
        if not due and not listening:  # nothing to read now (set aside, held back)
            await self.idle(changes.block_ms_left(now) / 1000)
            return []
        try:
            reply = await self._xread(due, count, changes.block_ms_left(now), listening)
        except redis.exceptions.ResponseError as exc:
            changes.lost()  # a change stream of the wrong type is set aside at the next follow()
            if not is_wrong_type(exc):  # BUSY, MASTERDOWN...: Redis's passing state, retried
                raise
            return self._take(await read_each(self.redis, due, count))  # each on its own: whose key is it?
        documents = []
        for raw_key, entries in reply:
            if raw_key == _CHANGES_RAW_KEY:
                changes.take(entries, self._wanted, count)
                continue
            documents.append(DocEntries(doc := doc_of(raw_key), due[doc], entries))
            if len(entries) >= count:  # there may be more
                changes.wake(doc)
        return documents

    async def _read_woken(self, wakeups: BucketWakeups, count: int) -> list[DocEntries]:
        """A cluster's round: wait for a wake-up or the sweep, then read each due document."""
        due = await wakeups.next_round(self._cursors, self._cursor)
        if not due:
            return []
        reads = await read_each(self.redis, due, count)
        if self.rewinds is not None and self._masters_changed():  # check before the cursors move past a loss
            self.failed()
            for doc in due:
                self.wake(doc)
            return []
        return self._take(reads)

    def _take(self, reads: Reads) -> list[DocEntries]:
        """The documents read on their own: those refused set aside, those read full woken."""
        for doc, refusal in reads.refused.items():
            self._set_aside(doc, refusal)
        for doc in reads.full:
            self.wake(doc)
        return reads.entries

    def _wanted(self, doc: str) -> bool:
        return self.follower.cursor(doc) is not None

    def _cursor(self, doc: str) -> StreamId | None:
        if self.aside and self.aside.get(doc, 0.0) > time.monotonic():
            return None
        return self.follower.cursor(doc)

    def _cursors(self) -> Mapping[str, StreamId]:
        cursors = self.follower.cursors()
        if not self.aside:
            return cursors
        now = time.monotonic()
        self.aside = {doc: until for doc, until in self.aside.items() if until > now}
        return {doc: cursor for doc, cursor in cursors.items() if doc not in self.aside}

    def _set_aside(self, doc: str, exc: Exception) -> None:
        """Redis refused to read ``doc``: read it no more for a while
        (without this, on one Redis, one broken stream stopped every read)."""
        if self.follower.cursor(doc) is None:
            return
        log.error(
            "%s: document %s cannot be read (%s); set aside for %ss",
            self.label,
            doc,
            exc,
            SET_ASIDE_SECONDS,
            extra={"doc": doc},
        )
        self.aside[doc] = time.monotonic() + SET_ASIDE_SECONDS
        self.follower.set_aside(doc, str(exc))

    async def _xread(
        self, cursors: Mapping[str, StreamId], count: int, block_ms: int, listening: bool
    ) -> list[tuple[bytes, list[RawEntry]]]:
        """XREAD BLOCK over the change stream (when ``listening``) and
        ``cursors``, packed here: redis-py spends ~1.5 ms packing a command
        over 1,000 streams, more than Redis takes to answer it; each
        document's key and cursor are packed once and reused."""
        parts = (b"XREAD", b"COUNT", b"%d" % count, b"BLOCK", b"%d" % block_ms, b"STREAMS")
        keys, ids = [], []
        if listening:
            assert self.changes.cursor is not None
            keys.append(_CHANGES_KEY)
            ids.append(bulk(self.changes.cursor.encode()))
        for doc, cursor in cursors.items():
            pieces = self._packed.get(doc)
            if pieces is None or pieces[0] != cursor:
                key = pieces[1] if pieces else bulk(stream_key(doc).encode())
                pieces = self._packed[doc] = (cursor, key, bulk(str(cursor).encode()))
            keys.append(pieces[1])
            ids.append(pieces[2])
        command = b"".join([b"*%d\r\n" % (len(parts) + 2 * len(keys)), *map(bulk, parts), *keys, *ids])
        if self.blocking is None:  # on one of the pool's connections
            [reply] = await packed.execute(self.redis, [command])
            if isinstance(reply, Exception):
                raise reply
            return _stream_pairs(reply)
        connection = self.blocking.connection  # a single-connection client, opened by client_id()
        assert connection is not None
        await connection.send_packed_command(command, check_health=False)
        return _stream_pairs(await connection.read_response())

    async def _interrupt_read(self) -> None:
        """Wake the blocking XREAD so it reads new documents now, not after
        ``block_ms``: until the loop has started a read that covers the
        newest change (it may be between two reads, or start one that
        misses a document added meanwhile), for at most 50 tries."""
        for _ in range(50):
            if self._reading_generation >= self._generation or self._blocking_id is None:
                return
            try:
                await self.redis.client_unblock(self._blocking_id)
            except Exception as exc:  # the loop reconnects by itself
                if not lost_redis(exc):
                    raise
                return
            await asyncio.sleep(0.005)

    # ------------------------------------------------- streams that went back

    async def _check_rewound(self) -> None:
        """Before reading again after a failure: did a document's stream
        lose ids the user had seen (:meth:`Rewinds.marks`, with those seen
        meanwhile)?"""
        assert self.rewinds is not None
        rewinds, follower = self.rewinds, self.follower
        seen = {
            doc: marks | rewinds.marks(doc)
            for doc, marks in self._unverified.items()
            if follower.cursor(doc) is not None
        }
        try:
            rewound = await find_rewound(self.redis, seen)
        except Exception as exc:  # not back yet (a failover in progress): after the backoff
            if not (isinstance(exc, UNREACHABLE) or lost_redis(exc)):
                raise
            raise redis.exceptions.ConnectionError(f"checking the streams after a failure: {exc!r}") from exc
        self._unverified.clear()
        for doc, last in rewound.items():
            if follower.cursor(doc) is None:
                continue
            log.warning(
                "document %s lost entries this process had seen (up to %s; its last id is now %s): "
                "a failover to a replica that lagged, or a restore; its readers here resync",
                doc,
                max(seen[doc]),
                last,
                extra={"doc": doc},
            )
            rewinds.rewound(doc, last)

    def _masters_changed(self) -> bool:
        """Did the cluster client's slot map change masters since the last
        read? A failover may have happened without an error reaching the
        loop (redis-py retries a read on the new master by itself), and the
        new master may lack what the old one had."""
        masters = frozenset(node.name for node in cast(RedisCluster, self.redis).get_primaries())
        changed = self._masters is not None and masters != self._masters
        self._masters = masters
        return changed


def _stream_pairs(reply: object) -> list[tuple[bytes, list[RawEntry]]]:
    """An XREAD reply (a RESP3 map or a RESP2 list) as ``[(key, [(id, fields)])]``."""
    if not reply:
        return []
    raw = cast(
        "dict[bytes, list[tuple[bytes, list[bytes]]]] | list[tuple[bytes, list[tuple[bytes, list[bytes]]]]]", reply
    )
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [
        (key, [(entry_id, dict(zip(fields[::2], fields[1::2], strict=True))) for entry_id, fields in entries])
        for key, entries in pairs
    ]


# ------------------------------------------------------- reads per document


class Reads(NamedTuple):
    #: The documents with new entries.
    entries: list[DocEntries]
    #: The documents Redis refused to read (a key of the wrong type), and its reply.
    refused: dict[str, redis.exceptions.ResponseError]
    #: The documents whose read came back full (``count`` entries): there may be more.
    full: set[str]


async def read_each(client: Redis, cursors: Mapping[str, StreamId], count: int) -> Reads:
    """One ``XREAD`` per document from its cursor, in one pipeline (per node
    on the wire). A failover or a resharding in progress raises
    :class:`redis.exceptions.ConnectionError` (not the documents' fault:
    read again). Also how a reader on one Redis tells which document broke
    the XREAD over all of them (a key of the wrong type: ``refused``)."""
    clustered = is_cluster(client)
    try:
        async with client.pipeline(transaction=False) as pipe:
            for doc, cursor in cursors.items():
                if clustered:
                    xread_one(pipe, stream_key(doc), str(cursor), count)
                else:
                    pipe.xread({stream_key(doc): str(cursor)}, count=count)
            replies = await pipe.execute(raise_on_error=False)
    except (AttributeError, RuntimeError) as exc:
        if not lost_redis(exc):
            raise
        raise redis.exceptions.ConnectionError(f"connection reset during a failover ({exc!r})") from exc
    reads = Reads([], {}, set())
    for doc, reply in zip(cursors, replies, strict=True):  # one XREAD per document
        if isinstance(reply, CLUSTER_TRANSIENT):
            raise redis.exceptions.ConnectionError(f"{doc}: {reply}")
        if is_wrong_type(reply):
            reads.refused[doc] = reply
        elif isinstance(reply, Exception):
            raise reply  # connection trouble, or Redis busy (a long script): the caller retries
        elif reply:
            for _, entries in reply.items() if isinstance(reply, dict) else reply:
                reads.entries.append(DocEntries(doc, cursors[doc], entries))
                if len(entries) >= count:
                    reads.full.add(doc)
    return reads


# ------------------------------------------------------------------ rounds


class Rounds:
    """Which followed documents a round reads: every one at a sweep (every
    ``block_ms``, and at once after :meth:`sweep_soon`), else those woken
    since the last round."""

    def __init__(self, block_ms: int) -> None:
        self.block_ms = block_ms
        #: Documents to read in the next round.
        self.woken: set[str] = set()
        self.next_sweep = 0.0

    def wake(self, doc: str) -> None:
        """Read ``doc`` in the next round, announced or not."""
        self.woken.add(doc)

    def sweep_soon(self) -> None:
        self.next_sweep = 0.0

    def due(
        self,
        now: float,
        every: Callable[[], Mapping[str, StreamId]],
        one: Callable[[str], StreamId | None],
        *,
        sweep: bool = False,
    ) -> dict[str, StreamId]:
        """The documents (-> cursor) to read now: all of ``every()`` on a
        sweep (or when ``sweep``), else those woken that ``one`` gives a
        cursor (so a round costs what was woken, not what is followed)."""
        woken, self.woken = self.woken, set()
        if sweep or now >= self.next_sweep:
            self.next_sweep = now + self.block_ms / 1000
            return dict(every())
        return {doc: cursor for doc in woken if (cursor := one(doc)) is not None}

    def block_ms_left(self, now: float) -> int:
        """How long a blocking read may wait: until the next sweep, 1 ms at least."""
        return max(1, min(self.block_ms, int((self.next_sweep - now) * 1000)))


class ChangeFeed(Rounds):
    """The rounds on one Redis, and where the reader is in the change
    stream whose announcements wake documents."""

    def __init__(self, block_ms: int) -> None:
        super().__init__(block_ms)
        #: The last announcement read; None when not known (at the start and
        #: after a failure): the reader starts at the stream's end, and sweeps.
        self.cursor: str | None = None
        #: The change stream cannot be read (a key of the wrong type) until
        #: then: every round sweeps, as the reader did before wake-ups.
        self.broken_until = 0.0

    def listening(self, now: float) -> bool:
        return self.cursor is not None and self.broken_until <= now

    async def follow(self, client: Redis, label: str) -> None:
        """Before a round: when not following the change stream (at the
        start, after a failure), follow it from its end and sweep next
        (what was announced before is in the streams the sweep reads); a
        change stream that cannot be read is set aside meanwhile."""
        if self.cursor is not None or self.broken_until > time.monotonic():
            return
        self.sweep_soon()
        try:
            self.cursor = await _end_of(client, changes_key())
        except redis.exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            log.error(
                "%s: the change stream %s cannot be read (%s): every document followed is read every round for %ss",
                label,
                changes_key(),
                exc,
                SET_ASIDE_SECONDS,
            )
            self.broken_until = time.monotonic() + SET_ASIDE_SECONDS

    def lost(self) -> None:
        """Redis failed: announcements may be lost (a failover); start again at the end."""
        self.cursor = None

    def take(self, entries: list[RawEntry], wanted: Callable[[str], bool], count: int) -> None:
        """Read ``entries`` of the change stream: wake the documents they
        name that are ``wanted``. A read that came back full (``count``: the
        stream names every append on the Redis, not only the reader's) may
        be behind more than rounds catch up with: follow it again from its
        end, and sweep."""
        for entry_id, fields in entries:
            self.cursor = text(entry_id)
            self.woken.update(doc for doc in announced(fields) if wanted(doc))
        if len(entries) >= count:
            self.lost()


async def _end_of(client: Redis, key: str) -> str:
    """The id of the last entry of the stream ``key`` (``0-0`` when empty): where to follow it from."""
    last = cast("list[tuple[bytes, object]]", await client.xrevrange(key, count=1))
    return text(last[0][0]) if last else "0-0"


class BucketWakeups:
    """A Redis Cluster's wake-ups and sweep, for one reader: one task per
    bucket blocked on its change stream, on that bucket's node (module doc).
    ``wanted(doc)``: is ``doc`` followed (the others named are ignored)."""

    def __init__(self, client: Redis, *, block_ms: int, wanted: Callable[[str], bool], name: str):
        self.redis = client
        self.block_ms = block_ms
        self.wanted = wanted
        #: Documents a wake-up (or :meth:`wake`) asked to read, and the sweep.
        self.rounds = Rounds(block_ms)
        self._event = asyncio.Event()
        self._watchers = [
            BackgroundTask(f"{name}-bucket-{bucket}", partial(self._watch, bucket), kind=f"{name}-buckets")
            for bucket in range(DOCUMENT_BUCKETS)
        ]

    def start(self) -> None:
        for watcher in self._watchers:
            watcher.start()

    async def stop(self) -> None:
        for watcher in self._watchers:
            await watcher.stop()

    def wake(self, doc: str) -> None:
        """Read ``doc`` in the next round, announced or not."""
        self.rounds.wake(doc)
        self._event.set()

    async def next_round(
        self, readable: Callable[[], Mapping[str, StreamId]], one: Callable[[str], StreamId | None]
    ) -> dict[str, StreamId]:
        """Wait for a wake-up or the sweep (at most ``block_ms``); the
        documents (-> cursor) to read now: all of ``readable()`` on a
        sweep, else those woken (``one(doc)``: a woken one's cursor)."""
        if not self.rounds.woken:
            self._event.clear()
            await wait_event(self._event, self.rounds.block_ms_left(time.monotonic()) / 1000)
        return self.rounds.due(time.monotonic(), readable, one)

    async def _watch(self, bucket: int) -> None:
        """Block on ``bucket``'s change stream; collect the documents it names
        that are wanted, and wake :meth:`next_round`."""
        key, cursor = bucket_changes_key(bucket), None

        async def read() -> Any:
            nonlocal cursor
            if cursor is None:
                cursor = await _end_of(self.redis, key)
            return await xread_one(self.redis, key, cursor, 1000, min(self.block_ms, MAX_WATCH_BLOCK_MS))

        async for reply in retrying(read, lost=f"wake-ups of bucket {bucket} lost Redis"):
            for _, entries in reply.items() if isinstance(reply, dict) else reply or []:
                for entry_id, fields in entries:
                    cursor = text(entry_id)
                    self.rounds.woken.update(doc for doc in announced(fields) if self.wanted(doc))
            if self.rounds.woken:
                self._event.set()


__all__ = [
    "SET_ASIDE_SECONDS",
    "DocEntries",
    "DocumentReader",
    "Follower",
    "Rewinds",
    "doc_of",
    "read_each",
    "retrying",
]
