"""Two-step handover: a document moves between two live members without
being processed twice (the seed's ``updating`` state).

When a rebalance moves a document away from a member that is alive (a new
member joined, shares shrank), the leader does not reassign it at once: it
marks the move (:func:`assignment_and_handovers`: target, the target's version, a
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

from collections.abc import Mapping
from dataclasses import dataclass

from redis.asyncio import Redis

from yrelay.consumers.membership import Assigned, parse_assignment
from yrelay.storage.keys import group_assignment_key, group_handover_key, group_meta_key
from yrelay.storage.replies import text
from yrelay.storage.scripts import Scripts


@dataclass(frozen=True)
class Handover:
    """A document on its way from its owner to ``target``."""

    target: str
    version: int
    deadline_ms: int


def _parse(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Handover]:
    """The handover hash (document -> ``target|version|deadline``) as read from Redis."""
    result = {}
    for doc, value in raw.items():
        target, version, deadline = text(value).rsplit("|", 2)
        result[text(doc)] = Handover(target, int(version), int(deadline))
    return result


async def assignment_and_handovers(redis: Redis, group: str) -> tuple[dict[str, Assigned], dict[str, Handover]]:
    """The assignment and the handovers under way, as of one instant (one
    MULTI/EXEC; both keys carry the group's hash tag, one slot on a cluster).

    Read in two round trips, a release (``consumer_release.lua`` moves the
    document in the assignment and drops its handover in one step) could
    land between them: the assignment read before it still names the owner,
    the handovers read after it no longer list the document, and the owner
    took the document for its own again, not being handed over, and claimed
    it with its old version before the target claimed: both handed out the
    same entries (issue 31). One instant never shows a released document as
    its owner's without its handover."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(group_assignment_key(group))
        pipe.hgetall(group_handover_key(group))
        assigned, pending = await pipe.execute()
    return parse_assignment(assigned), _parse(pending)


async def release(scripts: Scripts, group: str, doc: str, member: str, version: int) -> bool:
    """The owner's step: hand ``doc`` to the target the leader chose. False
    when the owner no longer holds it with ``version``, or the leader
    cancelled the handover meanwhile."""
    keys = [group_assignment_key(group), group_handover_key(group), group_meta_key(group)]
    return bool(int(await scripts.consumer_release(keys=keys, args=[doc, member, version])))
