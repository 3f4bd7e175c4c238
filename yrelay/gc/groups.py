"""Consumer groups in GC: a group's position holds trimming back like a
session's, and lagging groups are evicted by their own rule.

Each document keeps its groups' acked offsets beside its tracker
(``yrelay:{doc}:groups``, :mod:`yrelay.consumers.progress`). Per batch of
documents: which groups are live (a member heartbeating) is read once, from
the groups' own keys; then one script per document (``gc_groups.lua``)
evicts the groups that lag too far and returns the lowest position left,
which bounds the collector's fold and trim target. An abandoned group (no
live member) is evicted when it lacks an entry ``group_abandoned`` older
than the newest; a live one only when it lacks an entry
``group_absolute`` older than now. An evicted group starts the document
again from its snapshot, told so by its next batch (``restart="evicted"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from yrelay.consumers.membership import listed_groups
from yrelay.observability.events import EventSink
from yrelay.storage.keys import group_leases_key, group_members_key, group_progress_key, stream_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import text
from yrelay.storage.scripts import Scripts


async def live_groups(redis: Redis) -> list[str]:
    """The listed groups with a member whose heartbeat has not lapsed."""
    groups, now_ms = await listed_groups(redis)
    async with redis.pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.zcount(group_members_key(group), now_ms, "+inf")
        counts = await pipe.execute()
    return [group for group, count in zip(groups, counts, strict=True) if count]


async def evict_groups(
    redis: Redis,
    scripts: Scripts,
    docs: Sequence[str],
    *,
    abandoned_ms: int,
    absolute_ms: int,
    dry_run: bool,
    events: EventSink,
) -> dict[str, StreamId | None | Exception]:
    """Per document: the lowest group position left after eviction (None:
    no group holds it), or the error that document's script raised."""
    live = await live_groups(redis)
    async with redis.pipeline(transaction=False) as pipe:
        for doc in docs:
            await scripts.gc_groups(
                keys=[group_progress_key(doc), stream_key(doc), group_leases_key(doc)],
                args=[abandoned_ms, absolute_ms, int(dry_run), *live],
                client=pipe,
            )
        results = await pipe.execute(raise_on_error=False)
    lowest: dict[str, StreamId | None | Exception] = {}
    for doc, result in zip(docs, results, strict=True):
        if isinstance(result, Exception):
            lowest[doc] = result
            continue
        evicted, score = result
        for group in evicted:
            name = text(group)
            if not dry_run:
                events.emit("consumer_evict", doc, group=name, mode="live" if name in live else "abandoned")
        lowest[doc] = StreamId.from_score(float(score)) if score else None
    return lowest
