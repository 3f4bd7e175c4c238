"""Who is in a group, who leads it, and what each member was assigned.

Every member calls :meth:`Membership.beat` every ``lease / 3``: one script
(``consumer_heartbeat.lua``) pushes its entry in the members set to
``now + lease`` (Redis's clock, one for every process), renews the leader
lease if it holds it, or takes it when nobody does. So a group always has at
most one leader, and any member takes over within one lease of the leader's
last beat. The leader's writes are fenced by the same key
(``consumer_assign.lua`` refuses a member that no longer holds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from redis.asyncio import Redis

from yrelay.storage.keys import (
    group_assignment_key,
    group_deleted_key,
    group_leader_key,
    group_members_key,
    group_meta_key,
    groups_key,
)
from yrelay.storage.replies import text
from yrelay.storage.scripts import Scripts


async def redis_now_ms(redis: Redis) -> int:
    """Redis's clock (ms): the one every member's lease is measured on."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def listed_groups(redis: Redis) -> tuple[list[str], int]:
    """Every listed group, sorted, and Redis's clock to judge their members by."""
    groups = sorted(text(group) for group in await redis.smembers(groups_key()))
    return groups, await redis_now_ms(redis)


@dataclass(frozen=True)
class Beat:
    """One heartbeat's answer."""

    leads: bool
    #: Redis's clock at the beat (ms).
    now_ms: int
    #: The assignment's revision: a member re-reads the assignment when it moved.
    rev: int
    #: The group was deleted (``DELETE /ops/groups/{group}``): stop.
    deleted: bool = False


@dataclass(frozen=True)
class Assigned:
    member: str
    version: int


def parse_assignment(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Assigned]:
    """The assignment hash (document -> ``member|version``) as read from Redis."""
    result = {}
    for doc, value in raw.items():
        member, _, version = text(value).rpartition("|")
        result[text(doc)] = Assigned(member, int(version))
    return result


class Membership:
    """The Redis side of one member of one group."""

    def __init__(self, redis: Redis, group: str, member: str, lease_ms: int, scripts: Scripts | None = None):
        self.redis = redis
        self.group = group
        self.member = member
        self.lease_ms = lease_ms
        self.scripts = scripts or Scripts(redis)

    @property
    def _keys(self) -> list[str]:
        return [
            group_members_key(self.group),
            group_leader_key(self.group),
            group_meta_key(self.group),
            group_deleted_key(self.group),
        ]

    async def join(self, prefix: str) -> None:
        """List the group (GC asks every listed group for liveness) and record
        its document prefix; the first member's prefix stays."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(groups_key(), self.group)
            pipe.hsetnx(group_meta_key(self.group), "prefix", prefix)
            pipe.delete(group_deleted_key(self.group))  # a new member starts the group again
            await pipe.execute()

    async def beat(self) -> Beat:
        leads, now, rev, deleted = await self.scripts.consumer_heartbeat(
            keys=self._keys, args=[self.member, self.lease_ms, 0]
        )
        return Beat(bool(int(leads)), int(now), int(rev), bool(int(deleted)))

    async def leave(self) -> None:
        """Drop out of the members set (and the leader lease if held)."""
        await self.scripts.consumer_heartbeat(keys=self._keys, args=[self.member, self.lease_ms, 1])

    async def drop_self(self) -> None:
        """Out of the members set but still leading: a leaving leader hands
        its documents to the others before it lets the lease go."""
        await self.redis.zrem(group_members_key(self.group), self.member)

    async def live_members(self, now_ms: int) -> list[str]:
        """Members whose heartbeat has not lapsed; lapsed ones are removed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(group_members_key(self.group), "-inf", f"({now_ms}")
            pipe.zrange(group_members_key(self.group), 0, -1)
            _, members = await pipe.execute()
        return sorted(text(member) for member in members)

    async def assignment(self) -> dict[str, Assigned]:
        return parse_assignment(await self.redis.hgetall(group_assignment_key(self.group)))

    async def prefix(self) -> str:
        return text(await self.redis.hget(group_meta_key(self.group), "prefix") or b"")
