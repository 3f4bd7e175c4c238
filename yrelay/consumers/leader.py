"""The leader's one job: keep every document of the group assigned to a
live member (balanced, sticky), with a new version for each one that moves.

Runs inside the heartbeat loop of whichever member holds the leader lease,
once per beat: drop lapsed members, list the documents (the same registry
GC pages, :mod:`yrelay.storage.listing`, by the group's prefix), compute the assignment
(:func:`~yrelay.consumers.assignment.assign`) and write what changed. The
write is refused when the lease was lost meanwhile. A document whose member
lapsed and that now goes to another is a *takeover*; one whose member is
alive moves in two steps (:mod:`yrelay.consumers.handover`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.typing import EncodableT

from yrelay.consumers.assignment import assign, changes
from yrelay.consumers.handover import assignment_and_handovers
from yrelay.consumers.membership import Membership
from yrelay.observability.events import EventSink
from yrelay.storage.keys import (
    group_assignment_key,
    group_handover_key,
    group_leader_key,
    group_members_key,
    group_meta_key,
)
from yrelay.storage.listing import all_documents
from yrelay.storage.replies import text
from yrelay.storage.scripts import Scripts


@dataclass
class Rebalance:
    version: int
    members: list[str]
    moved: dict[str, str]
    #: Documents taken from a member that lapsed or left.
    takeovers: list[str] = field(default_factory=list)


async def documents(redis: Redis, prefix: str, page: int = 1000) -> AsyncIterator[list[str]]:
    """The registered documents whose id starts with ``prefix``, a page at a time."""
    async for docs in all_documents(redis, page, prefix):
        yield docs


class Leader:
    def __init__(self, membership: Membership, events: EventSink, scripts: Scripts, handover_ms: int = 0):
        """``handover_ms``: how long a live owner has to release a document
        that moves away from it (0: move at once, at least once)."""
        self.handover_ms = handover_ms
        self.membership = membership
        self.events = events
        self.scripts = scripts

    async def _forget_lapsed_lag(self, members: list[str]) -> None:
        """Drop the lag reports of members that lapsed without leaving."""
        meta = group_meta_key(self.membership.group)
        fields = [text(field) for field in await self.membership.redis.hkeys(meta)]
        lapsed = [field for field in fields if field.startswith("lag:") and field[4:] not in members]
        if lapsed:
            await self.membership.redis.hdel(meta, *lapsed)

    async def rebalance(self, now_ms: int, prefix: str) -> Rebalance | None:
        """Write a new assignment if it changed; None when nothing moved or
        the lease was lost."""
        redis, group = self.membership.redis, self.membership.group
        members = await self.membership.live_members(now_ms)
        await self._forget_lapsed_lag(members)
        docs = [doc async for page in documents(redis, prefix) for doc in page]
        # One instant: read apart, a release landing between the two reads
        # counts the document at its old owner (a needless move).
        assigned, pending = await assignment_and_handovers(redis, group)
        owners = {doc: assignment.member for doc, assignment in assigned.items()}
        # A document on its way is the target's already: the balance counts it there.
        current = {**owners, **{doc: handover.target for doc, handover in pending.items()}}
        moved = changes(assign(docs, members, current), current)
        live = set(members)
        # Handovers the owner did not answer in time, or cannot any more: moved now.
        moved.update(
            {
                doc: handover.target
                for doc, handover in pending.items()
                if doc not in moved and (handover.deadline_ms < now_ms or owners.get(doc) not in live)
            }
        )
        if not moved:
            return None
        args: list[EncodableT] = [self.membership.member, self.handover_ms]
        for doc, member in moved.items():
            args += [doc, member]
        version = int(
            await self.scripts.consumer_assign(
                keys=[
                    group_leader_key(group),
                    group_meta_key(group),
                    group_assignment_key(group),
                    group_members_key(group),
                    group_handover_key(group),
                ],
                args=args,
            )
        )
        if version < 0:
            return None
        takeovers = [doc for doc, member in moved.items() if member and owners.get(doc) not in (None, *live)]
        if takeovers:
            await redis.hincrby(group_meta_key(group), "takeovers", len(takeovers))
        result = Rebalance(version, members, moved, takeovers)
        self.events.emit(
            "consumer_rebalance",
            group=group,
            version=version,
            members=len(members),
            moved=len(moved),
            takeovers=len(takeovers),
        )
        return result
