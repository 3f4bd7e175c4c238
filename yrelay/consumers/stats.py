"""What every consumer group is doing, read from Redis (``/metrics``,
``yrelay consumers``-style tools): live members, lag, rebalances,
takeovers, leader elections.

Members report their own lag at every heartbeat (``lag:<member>`` in the
group's meta hash: the Redis time of the oldest entry handed out and not
acked, and how many such entries there are), so reading a group costs a
few commands however many documents it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from yrelay.consumers.membership import listed_groups
from yrelay.storage.keys import group_members_key, group_meta_key
from yrelay.storage.replies import text


@dataclass(frozen=True)
class GroupStats:
    group: str
    members: int
    #: Entries handed out to live members and not acked yet.
    unacked_entries: int
    #: Age of the oldest of them (0 when nothing is pending).
    lag_seconds: float
    rebalances: int
    takeovers: int
    elections: int
    #: Entries read again after a takeover that the member losing the
    #: document had read and not acked (docs/consumers.md#metrics).
    redelivered: int = 0
    #: Documents moved in two steps between live members.
    handovers: int = 0


async def group_stats(redis: Redis) -> list[GroupStats]:
    groups, now_ms = await listed_groups(redis)
    async with redis.pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.zrangebyscore(group_members_key(group), now_ms, "+inf")
            pipe.hgetall(group_meta_key(group))
        replies = await pipe.execute()
    return [
        _stats(group, {text(m) for m in replies[2 * i]}, replies[2 * i + 1], now_ms) for i, group in enumerate(groups)
    ]


def _stats(group: str, live: set[str], raw_meta: dict[bytes | str, bytes | str], now_ms: int) -> GroupStats:
    meta = {text(key): text(value) for key, value in raw_meta.items()}
    entries, oldest = 0, now_ms
    for member in live:
        oldest_ms, _, pending = meta.get(f"lag:{member}", "0|0").partition("|")
        if int(pending):
            entries += int(pending)
            oldest = min(oldest, int(oldest_ms))
    return GroupStats(
        group,
        len(live),
        entries,
        max(0, now_ms - oldest) / 1000,
        int(meta.get("rebalances", 0)),
        int(meta.get("takeovers", 0)),
        int(meta.get("elections", 0)),
        int(meta.get("redelivered", 0)),
        int(meta.get("handovers", 0)),
    )
