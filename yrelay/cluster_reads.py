"""Following many documents on a Redis Cluster: woken per bucket, read per document.

On one Redis a follower of many documents blocks in one XREAD over all
their streams. A cluster refuses that (``CROSSSLOT``) as soon as two of them
are on different slots, even on one node, and every document has its own
slot. The server's fan-out (:mod:`yrelay.app.fanout_cluster`) and a consumer
group's reader (:mod:`yrelay.consumers.reader`) therefore both follow their
documents this way:

- **Wake-up per bucket.** After each append batch the server's appender
  adds one entry to the capped change stream of each bucket the batch
  touched (:func:`announce`: ``yrelay:{bucket:NN}:changes``, field ``d``:
  the documents), *after* the batch's pipeline answered, so the entries are
  in the documents' streams before anyone is woken. :class:`BucketWakeups`
  runs one task per bucket (16) blocked in ``XREAD`` on its bucket's stream,
  on that bucket's node, and collects the documents it is told of that the
  follower wants.
- **Reads per document, pipelined per node** (:func:`read_each`): one
  single-key ``XREAD`` per document in one cluster pipeline (redis-py sends
  each node its share on one connection, the nodes in parallel). A document
  whose read came back full (``count`` entries) is read again in the next
  round, not at the next sweep.
- **A sweep every ``block_ms``** (:meth:`BucketWakeups.next_round`) reads
  every followed document: what no wake-up announced (an append by
  ``append_one``, a wake-up lost to a failover) is read within
  ``block_ms``.

Why this and not the other designs: docs/architecture.md#redis-cluster, with
the figures of ``bench/cluster_fanout.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

import redis.exceptions
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from .backoff import Reconnect
from .change_feed import Rounds, announced, announcement
from .keys import DOCUMENT_BUCKETS, bucket_changes_key, stream_key
from .listing import by_bucket
from .offsets import StreamId
from .redis_client import CLUSTER_TRANSIENT, is_cluster, lost_redis, xread_one
from .replies import is_wrong_type, text
from .tasks import BackgroundTask, wait_event

log = logging.getLogger(__name__)

#: Entries a bucket's change stream keeps (approximately): a watcher that
#: falls further behind has the sweep to catch it up.
CHANGES_MAXLEN = 10_000
#: The longest a wake-up read blocks (ms), whatever ``block_ms`` says: it
#: must end well within the client's socket timeout.
MAX_WATCH_BLOCK_MS = 5_000


async def announce(client: Redis, docs: list[str]) -> None:
    """Wake the followers of ``docs`` (just appended to) in every process."""
    try:
        async with client.pipeline(transaction=False) as pipe:
            for bucket, members in by_bucket(docs).items():
                fields: dict[FieldT, EncodableT] = {name: value for name, value in announcement(members).items()}
                pipe.xadd(bucket_changes_key(bucket), fields, maxlen=CHANGES_MAXLEN, approximate=True)
            await pipe.execute()
    except Exception as exc:  # the sweep delivers them within block_ms
        if not lost_redis(exc):
            raise
        log.warning("could not announce appends to %d documents (%s); the next sweep delivers them", len(docs), exc)


class Reads(NamedTuple):
    #: ``(stream key, entries)`` of the documents with new entries, like a multi-key XREAD.
    pairs: list[tuple[Any, Any]]
    #: The documents Redis refused to read (a key of the wrong type), and its reply.
    refused: dict[str, redis.exceptions.ResponseError]
    #: The documents whose read came back full (``count`` entries): there may be more.
    full: set[str]


async def read_each(client: Redis, cursors: Mapping[str, StreamId], count: int) -> Reads:
    """One ``XREAD`` per document from its cursor, in one pipeline (per node
    on the wire). A failover or a resharding in progress raises
    :class:`redis.exceptions.ConnectionError` (not the documents' fault:
    read again). Also how a follower on one Redis tells which document broke
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
            pairs = list(reply.items() if isinstance(reply, dict) else reply)
            reads.pairs.extend(pairs)
            if any(len(entries) >= count for _, entries in pairs):
                reads.full.add(doc)
    return reads


class BucketWakeups:
    """The per-bucket wake-ups and the sweep of one follower (module doc).

    ``wanted(doc)``: does the follower read ``doc`` (the others named by a
    change stream are ignored)."""

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

    async def read(self, cursors: Mapping[str, StreamId], count: int) -> Reads:
        """:func:`read_each`; a document that had more than ``count`` new
        entries is read again in the next round (no wake-up will tell)."""
        reads = await read_each(self.redis, cursors, count)
        for doc in reads.full:
            self.wake(doc)
        return reads

    def wake(self, doc: str) -> None:
        """Read ``doc`` in the next round, announced or not."""
        self.rounds.wake(doc)
        self._event.set()

    async def next_round(
        self, readable: Callable[[], Mapping[str, StreamId]], one: Callable[[str], StreamId | None] | None = None
    ) -> dict[str, StreamId]:
        """Wait for a wake-up or the sweep (at most ``block_ms``); the
        documents (-> cursor) of ``readable()`` to read now: all of them on a
        sweep, else those woken (``one(doc)``: a woken one's cursor, so that
        such a round does not build ``readable()``)."""
        if not self.rounds.woken:
            self._event.clear()
            await wait_event(self._event, self.rounds.block_ms_left(time.monotonic()) / 1000)
        if one is None:
            cursors = readable()
            readable, one = (lambda: cursors), cursors.get
        return self.rounds.due(time.monotonic(), readable, one)

    async def _watch(self, bucket: int) -> None:
        """Block on ``bucket``'s change stream; collect the documents it names
        that are wanted, and wake :meth:`next_round`."""
        key, cursor, reconnect = bucket_changes_key(bucket), None, Reconnect()
        while True:
            try:
                if cursor is None:
                    last = await self.redis.xrevrange(key, count=1)
                    newest = last[0][0] if last else None
                    cursor = text(newest) if newest is not None else "0-0"
                reply = await xread_one(self.redis, key, cursor, 1000, min(self.block_ms, MAX_WATCH_BLOCK_MS))
                reconnect.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not lost_redis(exc):
                    raise  # a bug: logged with its traceback, the watcher restarted (yrelay.tasks)
                log.warning("wake-ups of bucket %d lost Redis (%r); retrying in %.1fs", bucket, exc, reconnect.delay)
                await reconnect.wait()
                continue
            for _, entries in reply.items() if isinstance(reply, dict) else reply or []:
                for entry_id, fields in entries:
                    cursor = text(entry_id)
                    self.rounds.woken.update(doc for doc in announced(fields) if self.wanted(doc))
            if self.rounds.woken:
                self._event.set()
