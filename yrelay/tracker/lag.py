"""How far behind sessions are, read from the tracker and the stream.

Lag in milliseconds comes straight from the scores: a score is
``ms * 1000 + seq`` of the last acked entry, so ``last_id.ms - score // 1000``
is how much newer the document's last entry is than what the session holds.
Lag in entries counts stream entries after the session's offset; counting
walks the stream, so it stops at ``count_cap`` and says when it did.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from redis.asyncio import Redis

from yrelay.storage.keys import meta_key, snapshot_key, stream_key, tracker_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.replies import stream_entries, stream_id, text

COUNT_CAP = 100_000
_PAGE = 1_000


@dataclass
class SessionLag:
    session: str
    offset: str
    lag_entries: int
    lag_ms: int
    #: False when the stream walk stopped at the cap: lag_entries is a lower bound.
    exact: bool = True


@dataclass
class DocumentStatus:
    doc: str
    stream_length: int
    first_id: str | None
    last_id: str | None
    snapshot_offset: str
    trimmed_through: str
    snapshot_bytes: int
    tracked_sessions: int
    worst_lag_entries: int
    worst_lag_ms: int
    gc_at: int | None = None
    #: The first entry GC cannot fold because no replica can apply it (stored
    #: before causal admission, behind content that was never stored), and
    #: since when (ms) the document has been blocked; None when it is not.
    blocked_at: str | None = None
    blocked_since: int | None = None
    sessions: list[SessionLag] | None = field(default=None)

    @property
    def exists(self) -> bool:
        return self.last_id is not None or self.tracked_sessions > 0 or self.snapshot_bytes > 0


async def _ids_after(redis: Redis, doc: str, after: StreamId, cap: int) -> tuple[list[StreamId], bool]:
    """Ids of the entries after ``after`` (at most ``cap``), and whether that is all."""
    ids: list[StreamId] = []
    cursor = after
    while len(ids) < cap:
        page = stream_entries(
            await redis.xrange(stream_key(doc), min=f"({cursor}", max="+", count=min(_PAGE, cap - len(ids)))
        )
        ids.extend(StreamId.parse(text(entry_id)) for entry_id, _ in page)
        if len(page) < _PAGE:
            return ids, True
        cursor = ids[-1]
    return ids, False


async def document_status(
    redis: Redis, doc: str, with_sessions: bool = False, count_cap: int = COUNT_CAP
) -> DocumentStatus:
    """Stream, snapshot and tracker figures of one document."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.xlen(stream_key(doc))
        pipe.xrange(stream_key(doc), "-", "+", count=1)
        pipe.hmget(
            meta_key(doc), "last_id", "snapshot_offset", "trimmed_through", "gc_at", "blocked_at", "blocked_since"
        )
        pipe.strlen(snapshot_key(doc))
        pipe.zrange(tracker_key(doc), 0, -1 if with_sessions else 0, withscores=True)
        pipe.zcard(tracker_key(doc))
        length, first, meta, snapshot_bytes, rows, tracked = await pipe.execute()
    last_id, snapshot_offset, trimmed_through, gc_at, blocked_at, blocked_since = meta
    last = stream_id(last_id) or ZERO
    offsets = [(text(member), StreamId.from_score(score)) for member, score in rows]
    lowest = offsets[0][1] if offsets else last
    ids, complete = await _ids_after(redis, doc, lowest, count_cap)
    status = DocumentStatus(
        doc=doc,
        stream_length=length,
        first_id=text(first[0][0]) if first else None,
        last_id=text(last_id) if last_id else None,
        snapshot_offset=str(stream_id(snapshot_offset) or ZERO),
        trimmed_through=str(stream_id(trimmed_through) or ZERO),
        snapshot_bytes=snapshot_bytes,
        tracked_sessions=tracked,
        worst_lag_entries=len(ids),
        worst_lag_ms=max(0, last.ms - lowest.ms),
        gc_at=int(gc_at) if gc_at else None,
        blocked_at=text(blocked_at) if blocked_at else None,
        blocked_since=int(blocked_since) if blocked_since else None,
    )
    if with_sessions:
        status.sessions = [
            SessionLag(
                name, str(offset), len(ids) - bisect.bisect_right(ids, offset), max(0, last.ms - offset.ms), complete
            )
            for name, offset in offsets
        ]
    return status
