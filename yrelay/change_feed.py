"""Which documents have new entries: what wakes the fan-out on one Redis.

The fan-out of a process used to block in one XREAD over the streams of
every document subscribed there. Redis checks each stream named, and the
server packs every key and cursor and walks every document, on every round:
with 1,000 documents at a few thousand updates/s that was ~10% of the
server's samples and a good part of Redis' CPU, for rounds that found one or
two documents with something new (BENCHMARKS.md, issue 20). Now a round
costs what happened since the last one:

- every append batch ends with one entry on the capped change stream
  (``yrelay:changes``, field ``d``: the documents, newline-separated),
  queued by :func:`announce_in` on the batch's own pipeline after the
  appends: Redis runs a pipeline's commands in order, so whoever reads the
  announcement finds the entries it names;
- the reader blocks in one XREAD over the change stream and the documents
  woken by the announcements it read the round before (:class:`ChangeFeed`);
- a sweep every ``block_ms`` reads every followed document, as before: an
  append that announced nothing (a server of an older version, a write by
  hand) or an announcement lost (the stream trimmed past the reader, a
  failure) is delivered within ``block_ms``.

A Redis Cluster refuses a multi-key XREAD across slots: there a change
stream per bucket wakes a read per document (:mod:`yrelay.cluster_reads`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import redis.exceptions as redis_exceptions
from redis.asyncio import Redis

from .keys import changes_key
from .redis_client import is_cluster, lost_redis
from .redis_packed import CommandQueue
from .replies import is_wrong_type, text

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Entries the change stream keeps (approximately): a reader further behind
#: than this has the sweep to catch it up. An entry names every document of
#: one append batch (hundreds under load: a few kB), so a few seconds of
#: batches, not minutes.
CHANGES_MAXLEN = 1_000


def announcement(docs: list[str]) -> dict[str, str]:
    """The fields of a change-stream entry naming ``docs`` (here and on a
    cluster's bucket streams: :mod:`yrelay.cluster_reads`). Document ids
    hold no newline (:data:`yrelay.keys.DOC_ID_PATTERN`)."""
    return {"d": "\n".join(docs)}


def announced(fields: Mapping[bytes, bytes]) -> list[str]:
    """The documents a change-stream entry names."""
    return text(fields.get(b"d", b"")).split("\n")


def announce_in(pipe: CommandQueue, docs: list[str]) -> None:
    """Queue the announcement of an append to ``docs`` on ``pipe``, after
    the appends (nothing on a cluster: :mod:`yrelay.cluster_reads`)."""
    if docs and not is_cluster(pipe):
        [(field, value)] = announcement(docs).items()
        pipe.execute_command("XADD", changes_key(), "MAXLEN", "~", CHANGES_MAXLEN, "*", field, value)


async def announce(redis: Redis, docs: list[str]) -> None:
    """Announce ``docs`` on their own (after a write outside an append
    batch). Never raises: the write is done, and an announcement lost is
    delivered by the next sweep."""
    if is_cluster(redis) or not docs:
        return
    try:
        async with redis.pipeline(transaction=False) as pipe:
            announce_in(pipe, docs)
            await pipe.execute()
    except Exception as exc:
        if not lost_redis(exc):
            raise
        log.warning("could not announce appends to %d documents (%s); the next sweep delivers them", len(docs), exc)


class Rounds:
    """Which followed documents a round reads: every one at a sweep (every
    ``block_ms``, and at once after :meth:`sweep_soon`), else those woken
    since the last round. Shared by every follower of many documents (the
    fan-out, the consumer groups' reader, on one Redis and on a cluster)."""

    def __init__(self, block_ms: int) -> None:
        self.block_ms = block_ms
        #: Documents to read in the next round.
        self.woken: set[str] = set()
        self.next_sweep = 0.0

    def wake(self, doc: str) -> None:
        """Read ``doc`` in the next round, announced or not."""
        self.woken.add(doc)

    def sweep_soon(self) -> None:
        self.next_sweep = 0.0

    def due(
        self, now: float, every: Callable[[], Mapping[str, T]], one: Callable[[str], T | None], *, sweep: bool = False
    ) -> dict[str, T]:
        """The documents (-> cursor) to read now: all of ``every()`` on a
        sweep (or when ``sweep``), else those woken that ``one`` gives a
        cursor (so a round costs what was woken, not what is followed)."""
        woken, self.woken = self.woken, set()
        if sweep or now >= self.next_sweep:
            self.next_sweep = now + self.block_ms / 1000
            return dict(every())
        return {doc: cursor for doc in woken if (cursor := one(doc)) is not None}

    def block_ms_left(self, now: float) -> int:
        """How long a blocking read may wait: until the next sweep, 1 ms at least."""
        return max(1, min(self.block_ms, int((self.next_sweep - now) * 1000)))


class ChangeFeed(Rounds):
    """The reader's side on one Redis: the rounds, and where it is in the
    change stream whose announcements wake documents."""

    def __init__(self, block_ms: int) -> None:
        super().__init__(block_ms)
        #: The last announcement read; None when not known (at the start and
        #: after a failure): the reader starts at the stream's end, and sweeps.
        self.cursor: str | None = None
        #: The change stream cannot be read (a key of the wrong type) until
        #: then: every round sweeps, as the reader did before wake-ups.
        self.broken_until = 0.0

    def listening(self, now: float) -> bool:
        return self.cursor is not None and self.broken_until <= now

    def due(
        self, now: float, every: Callable[[], Mapping[str, T]], one: Callable[[str], T | None], *, sweep: bool = False
    ) -> dict[str, T]:
        """:meth:`Rounds.due`; every round is a sweep while the change stream is not listened to."""
        return super().due(now, every, one, sweep=sweep or not self.listening(now))

    async def follow(self, redis: Redis, set_aside_seconds: float) -> None:
        """Before a round: when not following the change stream (at the
        start, after a failure), follow it from its end and sweep next
        (what was announced before is in the streams the sweep reads); a
        change stream that cannot be read is set aside meanwhile."""
        if self.cursor is not None or self.broken_until > time.monotonic():
            return
        self.sweep_soon()
        try:
            last = cast("list[tuple[bytes, object]]", await redis.xrevrange(changes_key(), count=1))
        except redis_exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            self.set_aside(exc, set_aside_seconds)
            return
        self.cursor = text(last[0][0]) if last else "0-0"

    def lost(self) -> None:
        """Redis failed: announcements may be lost (a failover); start again at the end."""
        self.cursor = None

    def set_aside(self, exc: Exception, seconds: float) -> None:
        log.error(
            "the change stream %s cannot be read (%s): every document followed is read every round for %ss",
            changes_key(),
            exc,
            seconds,
        )
        self.broken_until = time.monotonic() + seconds

    def take(self, entries: list[tuple[bytes, dict[bytes, bytes]]], wanted: Callable[[str], bool], count: int) -> None:
        """Read ``entries`` of the change stream: wake the documents they
        name that are ``wanted``. A read that came back full (``count``: the
        stream names every append on the Redis, not only the follower's) may
        be behind more than rounds catch up with: follow it again from its
        end, and sweep."""
        for entry_id, fields in entries:
            self.cursor = text(entry_id)
            self.woken.update(doc for doc in announced(fields) if wanted(doc))
        if len(entries) >= count:
            self.lost()


__all__ = ["CHANGES_MAXLEN", "ChangeFeed", "Rounds", "announce", "announce_in", "announced", "announcement"]
