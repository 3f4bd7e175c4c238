"""The fan-out on a Redis Cluster: woken per bucket, read per document.

The single-Redis fan-out (:mod:`.fanout`) blocks in one XREAD over the
streams of every subscribed document. A cluster refuses that (``CROSSSLOT``)
as soon as two of them are on different slots, even on one node, and every
document has its own slot. So here:

- **Wake-up per bucket.** After each append batch the appender adds one
  entry to the capped change stream of each bucket the batch touched
  (``yrelay:{bucket:NN}:changes``, field ``d``: the documents), *after* the
  batch's pipeline answered, so the entries are in the documents' streams
  before anyone is woken. One task per bucket (16) blocks in ``XREAD`` on
  its bucket's stream, on that bucket's node, and marks the documents it is
  told of that have subscribers here.
- **Reads per document, pipelined per node.** The loop reads the marked
  documents, one single-key ``XREAD`` each, in one cluster pipeline (redis-py
  sends each node its share on one connection, the nodes in parallel), and
  hands the batches to :meth:`Fanout._dispatch` like the single-Redis reader.
- **A sweep every ``block_ms``** reads every subscribed document the same way:
  what no wake-up announced (an append by ``DocumentStore.append``, a
  wake-up lost to a failover) is delivered within ``block_ms``.

Why this and not the other designs: docs/architecture.md#redis-cluster, with
the figures of ``bench/cluster_fanout.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

import redis.exceptions
from redis.asyncio import Redis

from ..backoff import Reconnect
from ..keys import DOCUMENT_BUCKETS, bucket_changes_key, stream_key
from ..listing import by_bucket
from ..offsets import StreamId
from ..redis_client import CLUSTER_TRANSIENT, REDIS_PY_RACE, xread_one
from ..replies import text
from ..store import DocumentStore
from ..tasks import BackgroundTask, wait_event
from .acks import SubscriptionRegistry
from .fanout import Fanout, Subscriber

log = logging.getLogger(__name__)

#: Entries a bucket's change stream keeps (approximately): a watcher that
#: falls further behind has the sweep to catch it up.
CHANGES_MAXLEN = 10_000

#: The longest a wake-up read blocks (ms), whatever ``block_ms`` says: it
#: must end well within the client's socket timeout.
MAX_WATCH_BLOCK_MS = 5_000


async def announce(client: Redis, docs: list[str]) -> None:
    """Wake the fan-outs of every process for ``docs`` (just appended to).
    (``client``, not ``redis``: that name shadowed the module, and a lost
    connection here raised AttributeError from the ``except`` clause.)"""
    try:
        async with client.pipeline(transaction=False) as pipe:
            for bucket, members in by_bucket(docs).items():
                pipe.xadd(bucket_changes_key(bucket), {"d": "\n".join(members)}, maxlen=CHANGES_MAXLEN,
                          approximate=True)
            await pipe.execute()
    except (redis.exceptions.RedisError, OSError, *REDIS_PY_RACE) as exc:  # the sweep delivers them within block_ms
        log.warning("could not announce appends to %d documents (%s); the next sweep delivers them", len(docs), exc)


class ClusterFanout(Fanout):
    """:class:`~.fanout.Fanout` with the cluster's read path (module doc)."""

    def __init__(self, redis: Redis, store: DocumentStore, subscribers: SubscriptionRegistry[Subscriber], *,
                 block_ms: int, count: int, max_bytes: int = 1024 * 1024):
        super().__init__(redis, store, subscribers, block_ms=block_ms, count=count, max_bytes=max_bytes)
        #: Documents a wake-up (or a registration) asked to read.
        self._woken: set[str] = set()
        self._wake = asyncio.Event()
        self._next_sweep = 0.0
        self._watchers = [BackgroundTask(f"yrelay-fanout-bucket-{bucket}", partial(self._watch, bucket))
                          for bucket in range(DOCUMENT_BUCKETS)]

    def start(self) -> None:
        super().start()
        for watcher in self._watchers:
            watcher.start()

    async def stop(self) -> None:
        for watcher in self._watchers:
            await watcher.stop()
        await self._loop.stop()
        await self.reader.aclose()

    async def register(self, subscriber: Subscriber) -> StreamId:
        """As the single-Redis fan-out; the document is also read once right
        away: an entry appended while it was registering may have woken the
        watchers before it was listed."""
        cursor = await super().register(subscriber)
        self._woken.add(subscriber.doc)
        self._wake.set()
        return cursor

    def _documents_changed(self) -> None:
        self._generation += 1  # no blocking read to interrupt here

    async def _read_once(self) -> None:
        self._reading_generation = self._generation
        if not self._woken:
            self._wake.clear()
            await wait_event(self._wake, max(self._next_sweep - time.monotonic(), 0.001))
        readable = self._readable()
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.block_ms / 1000
            docs = readable
        else:
            docs = {doc: readable[doc] for doc in self._woken if doc in readable}
        self._woken.clear()
        if docs:
            self._dispatch(await self._read_documents(docs))

    async def _read_documents(self, docs: dict[str, StreamId]) -> list:
        """One ``XREAD`` per document in one pipeline (per node on the wire);
        a document Redis refuses to read is set aside, the others go on."""
        try:
            async with self.reader.pipeline(transaction=False) as pipe:
                for doc, cursor in docs.items():
                    xread_one(pipe, stream_key(doc), str(cursor), self.count)
                replies = await pipe.execute(raise_on_error=False)
        except REDIS_PY_RACE as exc:
            raise redis.exceptions.ConnectionError(f"connection reset during a failover ({exc!r})") from exc
        pairs: list = []
        for doc, reply in zip(docs, replies):
            if isinstance(reply, CLUSTER_TRANSIENT):  # failover, resharding: not the document's fault
                raise redis.exceptions.ConnectionError(f"{doc}: {reply}")
            if isinstance(reply, redis.exceptions.ResponseError):
                self._set_aside(doc, reply)
            elif isinstance(reply, Exception):
                raise reply  # connection trouble: the loop reconnects
            elif reply:
                pairs += reply.items() if isinstance(reply, dict) else reply
        return pairs

    async def _watch(self, bucket: int) -> None:
        """Block on ``bucket``'s change stream; mark the documents it names
        that have subscribers here, and wake the loop."""
        key, cursor, reconnect = bucket_changes_key(bucket), None, Reconnect()
        while True:
            try:
                if cursor is None:
                    last = await self.reader.xrevrange(key, count=1)
                    cursor = text(last[0][0]) if last else "0-0"
                reply = await xread_one(self.reader, key, cursor, 1000, min(self.block_ms, MAX_WATCH_BLOCK_MS))
                reconnect.succeeded()
            except asyncio.CancelledError:
                raise
            except (redis.exceptions.RedisError, OSError, *REDIS_PY_RACE) as exc:
                log.warning("fan-out wake-ups of bucket %d lost Redis (%r); retrying in %.1fs", bucket, exc,
                            reconnect.delay)
                await reconnect.wait()
                continue
            for _, entries in (reply.items() if isinstance(reply, dict) else reply or []):
                for entry_id, fields in entries:
                    cursor = text(entry_id)
                    self._woken.update(doc for doc in text(fields.get(b"d", b"")).split("\n") if doc in self.feeds)
            if self._woken:
                self._wake.set()
