"""The fan-out on a Redis Cluster: woken per bucket, read per document.

The single-Redis fan-out (:mod:`.fanout`) blocks in one XREAD over the
streams of every subscribed document, which a cluster refuses (``CROSSSLOT``).
Here the loop follows the subscribed documents the way of
:mod:`yrelay.cluster_reads` (shared with the consumer groups' reader): the
appender announces each append batch per bucket (:func:`announce`), one task
per bucket marks the documents with subscribers here, and the loop reads the
marked ones (every subscribed one each ``block_ms``: the sweep), one
single-key ``XREAD`` each in one pipeline, then hands the batches to
:meth:`Fanout._dispatch` like the single-Redis reader. When the reader's
slot map names other masters than at the last read (a failover that
redis-py got past by itself), nothing is dispatched before the check for
streams that went back (:mod:`.rewind`), as after an error.

Why this and not the other designs: docs/architecture.md#redis-cluster, with
the figures of ``bench/cluster_fanout.py``.
"""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis, RedisCluster

from ..cluster_reads import BucketWakeups, announce
from ..store import DocumentStore
from .acks import SubscriptionRegistry
from .fanout import Fanout, Subscriber

__all__ = ["ClusterFanout", "announce"]


class ClusterFanout(Fanout):
    """:class:`~.fanout.Fanout` with the cluster's read path (module doc)."""

    def __init__(
        self,
        redis: Redis,
        store: DocumentStore,
        subscribers: SubscriptionRegistry[Subscriber],
        *,
        block_ms: int,
        count: int,
        max_bytes: int = 1024 * 1024,
    ):
        super().__init__(redis, store, subscribers, block_ms=block_ms, count=count, max_bytes=max_bytes)
        self.wakeups = BucketWakeups(
            self.reader, block_ms=block_ms, wanted=lambda doc: doc in self.feeds, name="yrelay-fanout"
        )
        #: The masters the reader's slot map names (a failover changes them).
        self._masters: frozenset[str] | None = None

    def start(self) -> None:
        super().start()
        self.wakeups.start()

    async def stop(self) -> None:
        await self.wakeups.stop()
        await self._loop.stop()
        await self.reader.aclose()

    def _documents_changed(self, added: str) -> None:
        """Read ``added`` once right away (an entry appended while it was
        registering may have woken the watchers before it was listed); no
        blocking read to interrupt here."""
        self._generation += 1
        self.wakeups.wake(added)

    async def _read_once(self) -> None:
        self._reading_generation = self._generation
        docs = await self.wakeups.next_round(self._readable)
        if docs:
            reads = await self.wakeups.read(docs, self.count)
            if self._masters_changed():  # check before anything new moves the cursors past the loss
                self._suspect_all()
                for doc in docs:
                    self.wakeups.wake(doc)
                return
            for doc, reply in reads.refused.items():  # the others go on
                self._set_aside(doc, reply)
            self._dispatch(reads.pairs)

    def _masters_changed(self) -> bool:
        """Did the reader's slot map change masters since the last read? A
        failover may have happened without an error reaching this loop
        (redis-py retries a read on the new master by itself), and the new
        master may lack what the old one had (:mod:`.rewind`)."""
        reader = cast(RedisCluster, self.reader)  # this fan-out's reader is a cluster client
        masters = frozenset(node.name for node in reader.get_primaries())
        changed = self._masters is not None and masters != self._masters
        self._masters = masters
        return changed
