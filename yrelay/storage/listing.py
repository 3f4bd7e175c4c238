"""The document registry and the GC due set, split into buckets.

Every append marks its documents in two sorted sets: the registry (every
document ever appended to) and the GC due set. One set of each for the whole
deployment would be a key written by every append of every document: on a
Redis Cluster, one shard would take a write per append of all the others'
documents. So both are split into :data:`~yrelay.storage.keys.DOCUMENT_BUCKETS`
buckets, each under its own hash tag (``yrelay:{bucket:NN}:docs``,
``yrelay:{bucket:NN}:gc:due``), a document's bucket being a stable hash of
its id. Every reader goes through this module: pages of documents in id order
merged across the buckets (:func:`all_documents`, :class:`BucketMerge` for
the sync Spark reader), counts (:func:`registry_counts`), and the fold of the
unsplit keys older releases wrote (:func:`fold_unbucketed`). GC claims due
documents bucket by bucket (:class:`yrelay.gc.schedule.DueSet`).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from typing import cast

from redis.asyncio import Redis

from yrelay.storage.keys import (
    DOCUMENT_BUCKETS,
    bucket_documents_key,
    bucket_gc_due_key,
    document_bucket,
    documents_key,
    gc_due_key,
)
from yrelay.storage.packed import CommandQueue
from yrelay.storage.replies import text

log = logging.getLogger(__name__)

#: Members per page when folding the unsplit keys into the buckets.
FOLD_PAGE = 1000


def by_bucket(docs: Iterable[str]) -> dict[int, list[str]]:
    """``docs`` grouped by their bucket."""
    grouped: dict[int, list[str]] = defaultdict(list)
    for doc in docs:
        grouped[document_bucket(doc)].append(doc)
    return grouped


def mark_changed(pipe: CommandQueue, docs: list[str]) -> None:
    """Queue the GC bookkeeping of an append on ``pipe``: the documents become
    due for collection and are listed in the registry, in their buckets.

    Outside the append script on purpose: the bucket keys are shared by many
    documents, and the script must touch only one document's keys (one
    cluster slot). Losing the mark in a crash costs a late GC, never data:
    the next append marks again.
    """
    for bucket, members in by_bucket(docs).items():
        pipe.zadd(bucket_gc_due_key(bucket), dict.fromkeys(members, 0))
        pipe.zadd(bucket_documents_key(bucket), dict.fromkeys(members, 0), nx=True)


class BucketMerge:
    """The buckets' registries merged into one walk in id order (no I/O: the
    async and the sync reader drive it).

    Each round the caller fetches, for every bucket in :meth:`wanted`, up to
    ``page`` ids from ``start`` (exclusive after the first) to ``end`` with
    ZRANGEBYLEX, and :meth:`feed` returns what can be emitted: every buffered
    id up to the smallest last id of the buckets that may hold more. A walk
    of n documents reads each once, plus one short read per bucket at the end.
    """

    def __init__(self, page: int, prefix: str = "", after: str | None = None):
        self.page = page
        self.end = f"[{prefix}\xff" if prefix else "+"
        first = f"({after}" if after is not None else (f"[{prefix}" if prefix else "-")
        #: bucket -> where its next read starts (buckets not exhausted only)
        self._start: dict[int, str] = dict.fromkeys(range(DOCUMENT_BUCKETS), first)
        self._buffer: dict[int, list[str]] = {bucket: [] for bucket in range(DOCUMENT_BUCKETS)}

    @property
    def done(self) -> bool:
        return not self._start and not any(self._buffer.values())

    def wanted(self) -> list[tuple[int, str, str, str]]:
        """``(bucket, key, start, end)`` of the reads this round needs."""
        return [
            (bucket, bucket_documents_key(bucket), start, self.end)
            for bucket, start in self._start.items()
            if not self._buffer[bucket]
        ]

    def feed(self, replies: dict[int, list[bytes]]) -> list[list[str]]:
        """Take the replies of :meth:`wanted`'s reads; pages (of at most
        ``page`` ids, in order) that are ready."""
        for bucket, raw in replies.items():
            docs = [text(doc) for doc in raw]
            self._buffer[bucket] = docs
            if len(docs) < self.page:
                del self._start[bucket]
            else:
                self._start[bucket] = f"({docs[-1]}"
        bound = min((self._buffer[bucket][-1] for bucket in self._start), default=None)
        ready: list[str] = []
        for bucket, buffered in self._buffer.items():
            cut = len(buffered) if bound is None else bisect_right(buffered, bound)
            ready += buffered[:cut]
            self._buffer[bucket] = buffered[cut:]
        ready.sort()
        return [ready[i : i + self.page] for i in range(0, len(ready), self.page)]


async def all_documents(
    redis: Redis, page: int = 1000, prefix: str = "", after: str | None = None
) -> AsyncIterator[list[str]]:
    """Every registered document (those starting with ``prefix``, after
    ``after``), in id order, a page of at most ``page`` at a time."""
    merge = BucketMerge(page, prefix, after)
    while not merge.done:
        wanted = merge.wanted()
        async with redis.pipeline(transaction=False) as pipe:
            for _, key, start, end in wanted:
                pipe.zrangebylex(key, start, end, 0, page)
            raw = await pipe.execute() if wanted else []
        for chunk in merge.feed({bucket: docs for (bucket, *_), docs in zip(wanted, raw, strict=True)}):
            yield chunk


async def documents_page(redis: Redis, after: str | None, limit: int) -> list[str]:
    """The first ``limit`` registered documents after ``after`` (the ops listing)."""
    async for page in all_documents(redis, limit, after=after):
        return page
    return []


async def registry_counts(redis: Redis) -> tuple[int, int]:
    """(registered documents, documents due for GC), summed over the buckets."""
    async with redis.pipeline(transaction=False) as pipe:
        for bucket in range(DOCUMENT_BUCKETS):
            pipe.zcard(bucket_documents_key(bucket))
            pipe.zcard(bucket_gc_due_key(bucket))
        counts = await pipe.execute()
    return sum(counts[0::2]), sum(counts[1::2])


async def fold_unbucketed(redis: Redis) -> int:
    """Move what older releases wrote to the unsplit ``yrelay:docs`` and
    ``yrelay:gc:due`` into the buckets; the number of members moved.

    Idempotent and safe with several processes at once (and with older
    servers still writing the unsplit keys during a rolling upgrade): each
    page is added to the buckets before it is removed from the old key, a
    registry member only if absent (``NX``), a due time only if earlier than
    the bucket's (``LT``: an earlier GC is never wrong), so a page copied
    twice changes nothing. The one loss a race allows is a due mark an old
    server wrote between the copy and the removal: a later GC, never data.
    """
    moved = 0
    for old, bucket_key, mode in (
        (documents_key(), bucket_documents_key, {"nx": True}),
        (gc_due_key(), bucket_gc_due_key, {"lt": True}),
    ):
        while rows := cast("list[tuple[bytes, float]]", await redis.zrange(old, 0, FOLD_PAGE - 1, withscores=True)):
            scores = {text(member): score for member, score in rows}
            async with redis.pipeline(transaction=False) as pipe:
                for bucket, members in by_bucket(scores).items():
                    pipe.zadd(bucket_key(bucket), {doc: scores[doc] for doc in members}, **mode)
                await pipe.execute()
            await redis.zrem(old, *scores)
            moved += len(scores)
    if moved:
        log.info(
            "folded %d members of the unsplit document registry and GC due set into %d buckets", moved, DOCUMENT_BUCKETS
        )
    return moved
