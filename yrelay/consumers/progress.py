"""A group's progress per document, written only under the current lease.

The seed's versions: every document a leader hands to a member carries the
assignment version of that hand-over. The member *claims* the document with
it (``consumer_claim.lua``), which stores the version in the document's
lease hash; versions only grow, so once the new member claimed, the old
one's acks (``consumer_ack.lua``) carry a version that no longer matches
and are refused. Both keys live beside the document's stream (same hash
tag), so claim and ack are single-slot scripts, and GC reads the progress
in the same place it reads the tracker (:mod:`yrelay.gc.groups`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from yrelay.storage.keys import group_leases_key, group_progress_key, meta_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import stream_id, text
from yrelay.storage.scripts import Scripts


class AckResult(str, enum.Enum):
    """What became of an ack."""

    #: Stored: a member that takes the document over resumes after it.
    ACKED = "ok"
    #: Refused: another member claimed the document since (this member's
    #: lease lapsed). It no longer reads the document.
    STALE = "stale"
    #: Refused: GC evicted the group from the document; it starts again from
    #: the snapshot (the next batch of the document says so).
    EVICTED = "evicted"


@dataclass(frozen=True)
class Start:
    """Where a claimed document is read from."""

    #: ``resume`` (after the group's last ack) or ``snapshot`` (the group has
    #: no progress: a new document for it, or GC evicted it).
    mode: str
    offset: StreamId
    evicted: bool
    #: On resume: through where the document's previous reader had read
    #: (None: unknown, or nothing past ``offset``).
    read_through: StreamId | None = None


class StaleClaim(Exception):
    """Another member claimed the document with a newer version."""


class Progress:
    """Claims and acks of one group, fenced by assignment versions."""

    def __init__(self, redis: Redis, group: str, scripts: Scripts | None = None):
        self.redis = redis
        self.group = group
        self.scripts = scripts or Scripts(redis)

    async def claim(self, doc: str, version: int) -> Start:
        """Start reading ``doc`` under ``version``; raises :class:`StaleClaim`."""
        reply = await self.scripts.consumer_claim(
            keys=[group_leases_key(doc), group_progress_key(doc), meta_key(doc)], args=[self.group, version]
        )
        mode = text(reply[0])
        if mode == "stale":
            raise StaleClaim(f"{doc}: claimed with version {text(reply[1])} > {version}")
        if mode == "resume":
            offset, out = StreamId.from_score(float(reply[1])), text(reply[3])
            read_through = StreamId.from_score(float(out)) if out else None
            if read_through is not None and read_through <= offset:
                read_through = None  # nothing was handed out past the last ack
            return Start(mode, offset, bool(int(reply[2])), read_through)
        return Start(mode, stream_id(reply[1]) or StreamId(0, 0), bool(int(reply[2])))

    async def ack(self, doc: str, version: int, offset: StreamId) -> AckResult:
        reply = await self.scripts.consumer_ack(
            keys=[group_leases_key(doc), group_progress_key(doc)], args=[self.group, version, f"{offset.score():.0f}"]
        )
        return AckResult(text(reply))

    async def mark_read(self, pipe: Any, doc: str, version: int, through: StreamId | None = None) -> None:
        """Queue on ``pipe`` (``consumer_read.lua``): is this member, holding
        ``doc`` with ``version``, still its claimer? Answers ``[fence, trim
        mark, newest id]``, ``stale`` when another member claimed it since.
        With ``through``: also record that the application is given the
        entries up to there."""
        mark = "" if through is None else f"{through.score():.0f}"
        await self.scripts.consumer_read(
            keys=[group_leases_key(doc), meta_key(doc)], args=[self.group, version, mark], client=pipe
        )

    async def offsets(self, docs: list[str]) -> dict[str, StreamId | None]:
        """The group's acked offset per document (None: none recorded)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                pipe.zscore(group_progress_key(doc), self.group)
            scores = await pipe.execute()
        return {
            doc: None if score is None else StreamId.from_score(score) for doc, score in zip(docs, scores, strict=True)
        }
