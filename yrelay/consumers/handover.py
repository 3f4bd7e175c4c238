"""Two-step handover: a document moves between two live members without
being processed twice (the seed's ``updating`` state).

When a rebalance moves a document away from a member that is alive (a new
member joined, shares shrank), the leader does not reassign it at once: it
marks the move (:func:`pending_handovers`: target, the target's version, a
deadline) and leaves the owner in place. The owner sees the mark at its
next heartbeat, stops reading the document, drops the batches it read and
had not handed out yet, waits for the acks of those it handed out, and
*releases* the document (``consumer_release.lua``), which writes the target
as the new owner in the same step. The target claims only then, from the
owner's last ack: nothing is processed twice.

An owner that does not release in time (its application holds a batch past
the deadline, or it stalls or dies) is overruled: the leader moves the
document at its first beat past the deadline, or once the owner's lease
lapsed, like a takeover (at least once: its unacked entries are processed
again, and its late ack is refused by the version fence).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from ..keys import group_assignment_key, group_handover_key, group_meta_key
from ..replies import text
from ..scripts import Scripts


@dataclass(frozen=True)
class Handover:
    """A document on its way from its owner to ``target``."""

    target: str
    version: int
    deadline_ms: int


async def pending_handovers(redis: Redis, group: str) -> dict[str, Handover]:
    """Document -> its handover, for every document of ``group`` moving now."""
    result = {}
    for doc, value in (await redis.hgetall(group_handover_key(group))).items():
        target, version, deadline = text(value).rsplit("|", 2)
        result[text(doc)] = Handover(target, int(version), int(deadline))
    return result


async def release(scripts: Scripts, group: str, doc: str, member: str, version: int) -> bool:
    """The owner's step: hand ``doc`` to the target the leader chose. False
    when the owner no longer holds it with ``version``, or the leader
    cancelled the handover meanwhile."""
    keys = [group_assignment_key(group), group_handover_key(group), group_meta_key(group)]
    return bool(int(await scripts.consumer_release(keys=keys, args=[doc, member, version])))
