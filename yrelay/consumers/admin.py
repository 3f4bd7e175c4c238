"""What an operator sees of consumer groups, and deleting one
(``/ops/groups``, :mod:`yrelay.app.ops.groups`).

Read from Redis only, so any server on the same Redis answers for every
group. Deleting a group marks it deleted first (``yrelay:group:{g}:deleted``,
one hour): each member learns it at its next heartbeat (within ``lease/3``)
and stops (its ``batches()`` ends, ``group.deleted`` is true); then the
group's keys and its progress and fences on every document are removed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from redis.asyncio import Redis

from yrelay.consumers.handover import assignment_and_handovers
from yrelay.consumers.leader import documents
from yrelay.consumers.membership import redis_now_ms
from yrelay.consumers.stats import group_stats
from yrelay.storage.keys import (
    group_assignment_key,
    group_dead_letters_key,
    group_deleted_key,
    group_handover_key,
    group_leader_key,
    group_leases_key,
    group_members_key,
    group_meta_key,
    group_progress_key,
    group_webhook_stats_key,
    groups_key,
    meta_key,
    stream_key,
)
from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import stream_id, text

#: How long the deletion mark outlives the group: a member that was not
#: heartbeating meanwhile (stopped by SIGSTOP, say) is told when it wakes.
DELETED_MARK_SECONDS = 3600
#: Per document, entries behind are counted up to this.
LAG_COUNT_CAP = 1000


async def list_groups(redis: Redis) -> list[dict[str, Any]]:
    """Every group: live members, leader, documents assigned, and its lag
    (entries handed out and not acked, and the age of the oldest)."""
    stats = await group_stats(redis)
    now_ms = await redis_now_ms(redis)
    async with redis.pipeline(transaction=False) as pipe:
        for item in stats:
            pipe.zrangebyscore(group_members_key(item.group), now_ms, "+inf")
            pipe.get(group_leader_key(item.group))
            pipe.hlen(group_assignment_key(item.group))
        replies = await pipe.execute()
    return [
        {
            **asdict(item),
            "members": sorted(text(m) for m in members),
            "leader": text(leader) if leader else None,
            "documents": assigned,
        }
        for item, members, leader, assigned in zip(stats, replies[::3], replies[1::3], replies[2::3], strict=True)
    ]


async def describe_group(redis: Redis, group: str) -> dict[str, Any] | None:
    """One group: members (with their reported lag), leader, prefix, and per
    assigned document its member, version, pending handover and lag behind
    the stream's newest entry. None for an unknown group."""
    if not await redis.sismember(groups_key(), group):
        return None
    now_ms = await redis_now_ms(redis)
    assigned, moving = await assignment_and_handovers(redis, group)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrange(group_members_key(group), 0, -1, withscores=True)
        pipe.get(group_leader_key(group))
        pipe.hgetall(group_meta_key(group))
        members_raw, leader, meta_raw = await pipe.execute()
    meta = {text(key): text(value) for key, value in meta_raw.items()}
    docs = sorted(assigned)
    lags = await _document_lags(redis, group, docs)
    members = [
        {
            "member": text(member),
            "alive": score >= now_ms,
            "lease_ms_left": max(0, int(score) - now_ms),
            "reported_lag": meta.get(f"lag:{text(member)}"),
        }
        for member, score in members_raw
    ]
    assignments = [
        {
            "doc": doc,
            "member": assigned[doc].member,
            "version": assigned[doc].version,
            "handover_to": moving[doc].target if doc in moving else None,
            **lags[doc],
        }
        for doc in docs
    ]
    return {
        "group": group,
        "prefix": meta.get("prefix", ""),
        "leader": text(leader) if leader else None,
        "members": members,
        "assignments": assignments,
    }


async def _document_lags(redis: Redis, group: str, docs: list[str]) -> dict[str, dict[str, Any]]:
    """Per document: the group's acked offset, the newest entry, and how far
    behind it the group is (entries counted up to :data:`LAG_COUNT_CAP`)."""
    async with redis.pipeline(transaction=False) as pipe:
        for doc in docs:
            pipe.zscore(group_progress_key(doc), group)
            pipe.hget(meta_key(doc), "last_id")
        replies = await pipe.execute()
    positions = [
        (doc, None if score is None else StreamId.from_score(score), stream_id(last))
        for doc, score, last in zip(docs, replies[::2], replies[1::2], strict=True)
    ]
    behind = [(doc, acked) for doc, acked, last in positions if last is not None and (acked is None or acked < last)]
    async with redis.pipeline(transaction=False) as pipe:
        for doc, acked in behind:
            pipe.xrange(stream_key(doc), f"({acked}" if acked is not None else "-", "+", count=LAG_COUNT_CAP)
        counts = {doc: len(entries) for (doc, _), entries in zip(behind, await pipe.execute(), strict=True)}
    return {
        doc: {
            "acked": str(acked) if acked else None,
            "last_id": str(last) if last else None,
            "lag_entries": counts.get(doc, 0),
            "lag_ms": max(0, last.ms - acked.ms) if last and acked else 0,
        }
        for doc, acked, last in positions
    }


async def delete_group(redis: Redis, group: str) -> int | None:
    """Delete ``group``: tell its members (the deletion mark), remove its
    keys, then its progress and fence on every document of its prefix.
    Returns the documents cleared; None for an unknown group."""
    if not await redis.sismember(groups_key(), group):
        return None
    prefix = text(await redis.hget(group_meta_key(group), "prefix") or b"")
    assigned = [text(doc) for doc in await redis.hkeys(group_assignment_key(group))]
    await redis.set(group_deleted_key(group), 1, ex=DELETED_MARK_SECONDS)
    await redis.srem(groups_key(), group)
    await redis.delete(
        group_members_key(group),
        group_leader_key(group),
        group_assignment_key(group),
        group_handover_key(group),
        group_meta_key(group),
        group_dead_letters_key(group),
        group_webhook_stats_key(group),
    )
    cleared = 0
    pages = [assigned] + [page async for page in documents(redis, prefix)]
    for page in pages:
        async with redis.pipeline(transaction=False) as pipe:
            for doc in page:
                pipe.zrem(group_progress_key(doc), group)
                pipe.hdel(group_leases_key(doc), group, f"{group}:evicted", f"{group}:out")
            replies = await pipe.execute()
        cleared += sum(1 for removed in replies[::2] if removed)
    return cleared
