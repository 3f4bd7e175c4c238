"""Paging through yrelay's Redis keys with a sync client, a bounded reply at a time.

Three keys are walked, each in its own order: the document registry by id
(ZRANGE BYLEX in each bucket, merged; exclusive start after the last id seen), a document's stream by
entry id (XRANGE with COUNT, exclusive start ``(<last id>``), and a tracker by
rank (ZRANGE WITHSCORES). None of the walks is a snapshot: an entry appended or
a session acking during the walk may or may not be seen, as with SCAN.
"""

from __future__ import annotations

from collections.abc import Iterator

from yrelay.spark_analytics.redis_connection import SyncRedis
from yrelay.storage.keys import stream_key, tracker_key
from yrelay.storage.listing import BucketMerge
from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import RawEntry, scored, stream_entries, text

#: Ids per ZRANGE BYLEX page of the registry.
REGISTRY_PAGE = 1000
#: Entries per XRANGE page: the update bytes come along, so keep replies modest.
STREAM_PAGE = 1000
#: Members per ZRANGE page of a tracker.
TRACKER_PAGE = 1000


def registered_documents(client: SyncRedis, page: int = REGISTRY_PAGE) -> Iterator[str]:
    """Every document of the registry (its buckets merged: yrelay/storage/listing.py), in id order."""
    merge = BucketMerge(page)
    while not merge.done:
        wanted = merge.wanted()
        pipe = client.pipeline(transaction=False)
        for _, key, start, end in wanted:
            pipe.zrange(key, start, end, bylex=True, offset=0, num=page)
        raw = pipe.execute() if wanted else []
        for chunk in merge.feed({bucket: docs for (bucket, *_), docs in zip(wanted, raw, strict=True)}):
            yield from chunk


def stream_pages(client: SyncRedis, doc: str, after: str = "-", page: int = STREAM_PAGE) -> Iterator[list[RawEntry]]:
    """Pages of ``doc``'s stream entries with ids above ``after`` ("-": all)."""
    start = after if after == "-" else f"({after}"
    while True:
        read = stream_entries(client.xrange(stream_key(doc), min=start, max="+", count=page))
        if read:
            yield read
        if len(read) < page:
            return
        start = f"({text(read[-1][0])}"


def tracker_pages(client: SyncRedis, doc: str, page: int = TRACKER_PAGE) -> Iterator[list[tuple[str, int]]]:
    """Pages of ``doc``'s tracker as (session, score), lowest offset first."""
    rank = 0
    while True:
        rows = scored(client.zrange(tracker_key(doc), rank, rank + page - 1, withscores=True))
        if rows:
            yield [(text(member), int(score)) for member, score in rows]
        if len(rows) < page:
            return
        rank += page


def entry_id(raw: bytes) -> StreamId:
    """A stream entry's id (yrelay issues only ids with ``seq <= 999``)."""
    return StreamId.parse(text(raw))
