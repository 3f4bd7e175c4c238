"""A service's membership in a consumer group: the public API.

::

    async with ConsumerGroup(redis, "search-indexer") as group:
        async for batch in group.batches():
            index(batch.doc, batch.updates)
            await batch.ack()

Every member of the group runs this; the group's documents (every
registered document, or those starting with ``prefix``) are shared among
the live members, each read by exactly one of them at a time. A member
that dies or stalls loses its documents after ``lease`` seconds and another
member resumes them from their last ack (at least once: what the lost
member processed and did not ack is processed again). A document that
moves between two live members (a rebalance) moves in two steps: the owner
finishes what it handed out and releases it, then the other claims it, so
nothing is processed twice (:mod:`yrelay.consumers.handover`). Leaving (the end of
``async with``, or :meth:`leave`) hands the documents over at the next
heartbeat of the leader, without waiting for the lease.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import AsyncIterator
from functools import partial

from redis.asyncio import Redis

from yrelay.consumers.batch import Batch
from yrelay.consumers.handover import assignment_and_handovers, release
from yrelay.consumers.leader import Leader
from yrelay.consumers.membership import Membership, redis_now_ms
from yrelay.consumers.progress import Progress
from yrelay.consumers.reader import Reader
from yrelay.observability.eventlog import NullEventLog
from yrelay.observability.events import EventSink
from yrelay.storage.keys import group_meta_key, validate_group_name
from yrelay.storage.scripts import Scripts
from yrelay.tasks import BackgroundTask, lost_redis

log = logging.getLogger(__name__)


def _check_client(redis: Redis) -> None:
    """The group reads entries raw (their updates are binary) and parses
    RESP2 replies: a client made with ``decode_responses=True`` or
    ``protocol=3`` would hand out broken batches, so it is refused here."""
    kwargs = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:
        kwargs = getattr(redis, "connection_kwargs", None) or {}
    if kwargs.get("decode_responses"):
        raise ValueError("ConsumerGroup needs a Redis client with decode_responses=False (updates are binary)")
    if str(kwargs.get("protocol") or 2) == "3":
        raise ValueError("ConsumerGroup needs a Redis client speaking RESP2 (protocol=2, redis-py's default)")


class ConsumerGroup:
    def __init__(
        self,
        redis: Redis,
        name: str,
        *,
        member: str | None = None,
        prefix: str = "",
        lease: float = 3.0,
        batch_size: int = 500,
        events: EventSink | None = None,
        handover: float | None = None,
    ):
        """``lease``: seconds after its last heartbeat that a member loses its
        documents (and the leader its role); members beat every third of it.
        ``handover``: how long a live member has to finish its in-flight
        batches of a document the leader moves away from it (default: two
        leases, since noticing takes up to a beat and the application's acks
        come on top, on a host that may be loaded; 0 moves at once, and
        those batches are processed again)."""
        _check_client(redis)
        self.name = validate_group_name(name)
        self.member = member or f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self.prefix = prefix
        self.lease = lease
        self.interval = lease / 3
        self.events: EventSink = events or NullEventLog()
        scripts = Scripts(redis)
        self.redis = redis
        self.membership = Membership(redis, self.name, self.member, round(lease * 1000), scripts)
        self.leader = Leader(
            self.membership,
            self.events,
            scripts,
            handover_ms=round((2 * lease if handover is None else handover) * 1000),
        )
        self.progress = Progress(redis, self.name, scripts)
        self.reader = Reader(
            redis,
            self.progress,
            self.events,
            member=self.member,
            batch_size=batch_size,
            block_ms=max(1, round(self.interval * 1000)),
            valid=self._valid,
            release=partial(release, scripts, self.name),
        )
        self._valid_until = 0.0
        self._rev = -1
        self._leads = False
        #: An operator deleted the group; ``batches()`` has ended.
        self.deleted = False
        self._heartbeat = BackgroundTask(f"yrelay-consumer-{self.name}", self._beat_loop)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Join: list the group, first beat (and the first assignment if this
        member leads), then beat every ``lease / 3`` in the background."""
        await self.membership.join(self.prefix)
        self.prefix = await self.membership.prefix()
        await self._beat()
        self.events.emit("consumer_join", group=self.name, member=self.member)
        self._heartbeat.start()
        self.reader.start()

    async def leave(self) -> None:
        """Stop and hand the documents over at once. A leader first assigns
        its documents to the others, then lets its lease go."""
        await self._heartbeat.stop()
        await self.reader.stop()
        self.reader.assign({})
        try:
            if self._leads:  # the lease is still ours for up to `lease`
                await self.membership.drop_self()
                now_ms = await redis_now_ms(self.redis)
                await self.leader.rebalance(now_ms, self.prefix)
            await self.membership.leave()
            await self.redis.hdel(group_meta_key(self.name), f"lag:{self.member}")
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.warning("consumer group %s: could not leave cleanly (%s); the lease will lapse", self.name, exc)
        self.events.emit("consumer_leave", group=self.name, member=self.member)

    async def stop_without_leaving(self) -> None:
        """Stop beating but stay listed (what a crash looks like to the
        group: the documents move once the lease lapses). For tests and
        fault drills."""
        await self._heartbeat.stop()
        await self.reader.stop()
        self.reader.assign({})

    async def __aenter__(self) -> ConsumerGroup:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.leave()

    # -------------------------------------------------------------- reading

    def batches(self) -> AsyncIterator[Batch]:
        """Batches of the documents this member holds, as they come, for as
        long as the member is in the group (one iteration at a time)."""
        return self.reader.batches()

    @property
    def documents(self) -> list[str]:
        """The documents this member holds now."""
        return sorted(self.reader.held)

    @property
    def leads(self) -> bool:
        return self._leads

    # ------------------------------------------------------------ heartbeat

    def _valid(self) -> bool:
        """Our heartbeat is younger than the lease: nobody else was given
        our documents yet (our beat's expiry is measured from after we sent it)."""
        return asyncio.get_running_loop().time() < self._valid_until

    async def _beat(self) -> None:
        sent = asyncio.get_running_loop().time()
        beat = await self.membership.beat()
        if beat.deleted:
            self._on_deleted()
            return
        if beat.leads and not self._leads:
            self.events.emit("consumer_elected", group=self.name, member=self.member)
        self._leads = beat.leads
        moved = beat.leads and await self.leader.rebalance(beat.now_ms, self.prefix) is not None
        if moved or beat.rev != self._rev or not self.reader.held:
            # After our own rebalance the revision moved past beat.rev: read again next beat.
            await self._read_assignment(-1 if moved else beat.rev)
        # Valid again only now: a member waking from a pause must not read
        # the documents it held before it has seen they are no longer its own.
        self._valid_until = sent + self.lease
        await self._report_lag()

    def _on_deleted(self) -> None:
        """An operator deleted the group: hold nothing, end ``batches()``."""
        if not self.deleted:
            self.deleted = True
            self._leads = False
            self.reader.close()
            log.warning("consumer group %s was deleted; member %s stops", self.name, self.member)
            self.events.emit("consumer_deleted", group=self.name, member=self.member)

    async def _read_assignment(self, rev: int) -> None:
        assigned, leaving = await assignment_and_handovers(self.redis, self.name)  # one instant: see there
        mine = {doc: a.version for doc, a in assigned.items() if a.member == self.member}
        self.reader.assign(mine, releasing={doc for doc in mine if doc in leaving})
        self._rev = rev
        await self.reader.release_finished()

    async def _report_lag(self) -> None:
        entries, oldest_ms = self.reader.lag()
        redelivered, self.reader.unreported_redelivered = self.reader.unreported_redelivered, 0
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(group_meta_key(self.name), f"lag:{self.member}", f"{oldest_ms}|{entries}")
            if redelivered:
                pipe.hincrby(group_meta_key(self.name), "redelivered", redelivered)
            try:
                await pipe.execute()
            except BaseException:
                self.reader.unreported_redelivered += redelivered  # the next beat reports them
                raise

    async def _beat_loop(self) -> None:
        while not self.deleted:
            await asyncio.sleep(self.interval)
            try:
                await self._beat()
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.warning("consumer group %s: heartbeat failed: %r", self.name, exc)
            if not self._valid():
                self._rev = -1  # re-read the assignment after the next good beat
                self.reader.assign({})
