"""A sorted set per document: member = session id, score = acked offset.

Scores are ``StreamId.score()`` (``ms * 1000 + seq``), exact because the
append path never issues a sequence above 999. GC reads the minimum score to
know what every tracked session holds, and the score's millisecond part to
measure how far behind a session is in time.

The inverse view, the documents that track a session, is kept per session
(:func:`session_documents`) with its subscription-set digest, so a client
can check its whole subscription set in one round trip. The two views live
on different keys (and cluster slots), so they change one after the other,
in the order that makes a crash in between err towards "not tracked": a
client then re-creates a subscription it still had, which costs a resync,
never a silent gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis

from yrelay.reconciliation.redis_idset import RedisIdSet
from yrelay.storage import packed
from yrelay.storage.keys import session_documents_digest_key, session_documents_key, tracker_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import scored
from yrelay.storage.scripts import Scripts
from yrelay.tasks import BackgroundTask, lost_redis

log = logging.getLogger(__name__)


class Tracker:
    """Reads and writes of the per-document tracker sorted sets (an ack's
    write is :class:`AckWriter`'s, the one path that moves a session on)."""

    def __init__(self, redis: Redis, scripts: Scripts | None = None):
        self.redis = redis
        self.scripts = scripts or Scripts(redis)

    async def track(self, doc: str, session: str, offset: StreamId) -> None:
        """Record what a (re)subscribing session holds, replacing any older value.

        Subscribing states what the client really holds, which may be less than
        the tracker remembered (a client that lost its local copy).
        """
        await self.redis.zadd(tracker_key(doc), {session: offset.score()})
        await self.session_documents(session).add([doc])

    async def untrack(self, doc: str, session: str) -> bool:
        """Drop a session (unsubscribe, or eviction by hand); True if it was tracked."""
        await self.session_documents(session).remove([doc])
        return bool(await self.redis.zrem(tracker_key(doc), session))

    async def untrack_all(self, docs: list[str], session: str) -> None:
        """Drop a session from many documents: the set's digest in batches,
        the trackers in one pipeline."""
        await self.session_documents(session).remove(docs)
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                pipe.zrem(tracker_key(doc), session)
            await pipe.execute()

    def session_documents(self, session: str) -> RedisIdSet:
        """The documents whose tracker holds ``session``, with their digest."""
        return session_documents(self.redis, session, self.scripts)

    async def offset(self, doc: str, session: str) -> StreamId | None:
        """The session's acked offset, or None when it is not tracked (evicted)."""
        score = await self.redis.zscore(tracker_key(doc), session)
        return None if score is None else StreamId.from_score(score)

    async def sessions(self, doc: str) -> dict[str, StreamId]:
        rows = scored(await self.redis.zrange(tracker_key(doc), 0, -1, withscores=True))
        return {member.decode(): StreamId.from_score(score) for member, score in rows}


def session_documents(redis: Redis, session: str, scripts: Scripts | None = None) -> RedisIdSet:
    """The set of documents tracking ``session`` (see the module doc)."""
    return RedisIdSet(redis, session_documents_key(session), session_documents_digest_key(session), scripts)


class AckWriter:
    """Coalesces acks into one pipeline per event-loop turn.

    Many readers ack every delivery; only the highest offset per (document,
    session) matters, and losing an ack costs a resend, never data, so acks are
    written asynchronously in batches. An ack for a session that is no longer
    in the tracker (GC or an operator evicted it) is reported to
    ``on_evicted``: that session must resync, and its ack must not re-add it.

    Each ack is ``ZADD XX GT CH``: ``XX``, an ack of an evicted session does
    not re-add it and pin the stream; ``GT``, a late, reordered ack never
    moves a session back; ``CH``, an ack that moved nothing is looked at.
    """

    def __init__(self, redis: Redis, on_evicted: Callable[[str, str], None] | None = None):
        self.redis = redis
        self.on_evicted = on_evicted
        self._pending: dict[tuple[str, str], StreamId] = {}
        self._wake = asyncio.Event()
        self._loop = BackgroundTask("yrelay-ack-writer", self._run)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self.flush()

    def submit(self, doc: str, session: str, offset: StreamId) -> None:
        key = (doc, session)
        if key not in self._pending or self._pending[key] < offset:
            self._pending[key] = offset
        self._wake.set()

    async def flush(self) -> None:
        batch, self._pending = self._pending, {}
        if not batch:
            return
        async with packed.pipeline(self.redis) as pipe:  # packed: redis-py's cost more CPU per ack than its frame
            for (doc, session), offset in batch.items():
                pipe.zadd(tracker_key(doc), {session: offset.score()}, xx=True, gt=True, ch=True)
            moved = await pipe.execute()
        if self.on_evicted is None:
            return
        # An ack that moved nothing: an old ack, or the session was evicted. Look
        # only at those (one command per ack in the usual case, not two).
        unmoved = [key for key, changed in zip(batch, moved, strict=True) if not changed]
        if not unmoved:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc, session in unmoved:
                pipe.zscore(tracker_key(doc), session)
            scores = await pipe.execute()
        for (doc, session), score in zip(unmoved, scores, strict=True):
            if score is None:
                self.on_evicted(doc, session)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # Redis down: the acks are lost, clients get resends.
                if not lost_redis(exc):
                    raise  # a bug: logged with its traceback, the loop restarted (yrelay.tasks)
                log.warning("could not write acks to the tracker (%r); clients will be resent what they acked", exc)
                await asyncio.sleep(0.5)
