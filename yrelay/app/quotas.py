"""Per-subject limits that hold for the whole deployment (docs/operations.md#limits).

A subject (the token's ``sub``; with auth off, the client address) may hold
many sockets on many server processes, so its limits live in Redis, under
keys hash-tagged by the subject (one cluster slot per subject):

- :class:`SharedBucket`: a token bucket of one subject (updates, presence,
  or KiB of answers) kept by ``quota_take.lua``. A process takes a *chunk* of tokens
  at a time and spends it locally, fetching the next chunk in the
  background once half is spent, so the update path makes no Redis call for
  most updates (bench/quota_cost.py measures it). The deployment's rate is
  exact to within one chunk (a tenth of a second of rate) per process.
- :class:`SubjectQuotas`: those buckets per subject, shared by the subject's
  connections to this process, and the subject's live subscriptions,
  counted per process in Redis under a lease the process renews
  (``quota_subscriptions.lua``), so a crashed process's count lapses.

When Redis cannot be reached these limits let traffic through (a chunk at
a time): the per-process limits (:mod:`.limits`) still hold, and the update
path cannot store anything without Redis anyway.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from yrelay.observability.eventlog import process_name
from yrelay.storage.keys import subject_bucket_key, subject_subscriptions_key
from yrelay.tasks import BackgroundTask, lost_redis, spawn

if TYPE_CHECKING:
    from yrelay.config import Settings
    from yrelay.storage.scripts import Scripts

log = logging.getLogger(__name__)

#: A chunk is this many seconds of a bucket's rate.
CHUNK_SECONDS = 0.1


class SharedBucket:
    """One subject's bucket of one kind, as seen by this process."""

    def __init__(self, quotas: SubjectQuotas, key: str, rate: float, burst: int):
        self.rate = rate
        self.burst = max(burst, 1)
        self.chunk = max(1, min(self.burst, math.ceil(rate * CHUNK_SECONDS)))
        self.tokens = 0
        self._quotas = quotas
        self._key = key
        self._denied_until = 0.0
        self._fetching: asyncio.Task[None] | None = None
        #: Tokens used beyond the local chunk, not yet booked in Redis, and the booking.
        self._owed = 0
        self._owing: asyncio.Task[None] | None = None

    async def take(self) -> int | None:
        """None: one token taken. Otherwise the milliseconds until the
        subject has tokens again (nothing taken)."""
        if self.rate <= 0:
            return None
        if self.tokens < 1:
            if self._denied_until > time.monotonic():
                return self._wait_ms()
            await self._refill()
            if self.tokens < 1:
                return self._wait_ms()
        self.tokens -= 1
        if self.tokens < self.chunk / 2 and self._fetching is None and self._denied_until <= time.monotonic():
            self._fetching = spawn(self._fetch(), name="yrelay-quota-fetch")  # the next chunk, before it is needed
        return None

    def spend(self, tokens: int) -> None:
        """Book ``tokens`` used already (an answer's size is known once it
        is sent): what the local chunk does not cover is owed to the
        subject's bucket in Redis at once (its balance goes below zero, on
        every process, and outlives this process's connections of the
        subject), so the next :meth:`take` anywhere waits until the
        subject's rate has paid it back."""
        if self.rate <= 0 or tokens <= 0:
            return
        covered = min(tokens, max(self.tokens, 0))
        self.tokens -= covered
        self._owed += tokens - covered
        if self._owed and self._owing is None:
            self._owing = spawn(self._owe(), name="yrelay-quota-owe")

    async def _owe(self) -> None:
        try:
            while self._owed:
                owed, self._owed = self._owed, 0
                try:
                    _, wait_ms = await self._quotas.take(self._key, self.rate, self.burst, owed, owe=True)
                except Exception as exc:  # the per-connection limits still hold
                    if not lost_redis(exc):
                        raise
                    log.debug("subject bucket %s not reached (%s); a debt forgiven", self._key, exc)
                    continue
                if wait_ms:
                    self._denied_until = max(self._denied_until, time.monotonic() + wait_ms / 1000)
        finally:
            self._owing = None

    def _wait_ms(self) -> int:
        return max(1, math.ceil((self._denied_until - time.monotonic()) * 1000))

    async def _refill(self) -> None:
        if self._fetching is None:
            self._fetching = spawn(self._fetch(), name="yrelay-quota-fetch")
        await asyncio.shield(self._fetching)  # a closing connection must not cancel its siblings' fetch

    async def _fetch(self) -> None:
        try:
            granted, wait_ms = await self._quotas.take(self._key, self.rate, self.burst, self.chunk)
            self.tokens += granted
            if granted == 0:
                self._denied_until = time.monotonic() + wait_ms / 1000
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("subject bucket %s not reached (%s); allowing a chunk", self._key, exc)
            self.tokens += self.chunk
        finally:
            self._fetching = None


@dataclass
class SubjectBuckets:
    """What one subject's connections to this process share."""

    subject: str
    updates: SharedBucket
    presence: SharedBucket
    #: KiB of answers larger than their requests (snapshots, sync replies, greetings).
    answers: SharedBucket
    users: int = 0


class SubjectQuotas:
    """The per-subject limits of one server process (see the module doc)."""

    def __init__(self, redis: Redis, scripts: Scripts, settings: Settings):
        self.redis = redis
        self.settings = settings
        self.instance = f"{process_name()}:{secrets.token_hex(4)}"
        self._take = scripts.quota_take
        self._count = scripts.quota_subscriptions
        self._buckets: dict[str, SubjectBuckets] = {}
        #: Live subscriptions of each subject on this process.
        self.subscriptions: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._flushing: asyncio.Task[None] | None = None
        self._renewal = BackgroundTask("yrelay-subject-leases", self._renew)
        #: Redis calls made for buckets (bench/quota_cost.py reports them per update).
        self.bucket_calls = 0

    # ------------------------------------------------------------ buckets

    def acquire(self, subject: str) -> SubjectBuckets:
        """The subject's buckets on this process; ``release`` when done."""
        buckets = self._buckets.get(subject)
        if buckets is None:
            s = self.settings

            def bucket(kind: str, rate: float, burst: int) -> SharedBucket:
                return SharedBucket(self, subject_bucket_key(subject, kind), rate, burst)

            buckets = self._buckets[subject] = SubjectBuckets(
                subject,
                bucket("updates", s.subject_updates_per_second, s.subject_update_burst),
                bucket("presence", s.subject_presence_per_second, s.subject_presence_burst),
                bucket("answers", s.subject_answer_bytes_per_second / 1024, s.subject_answer_burst_bytes // 1024),
            )
        buckets.users += 1
        return buckets

    def release(self, subject: str) -> None:
        buckets = self._buckets.get(subject)
        if buckets is not None:
            buckets.users -= 1
            if buckets.users <= 0:
                del self._buckets[subject]  # its unspent chunk is lost: at most a tenth of a second

    async def take(self, key: str, rate: float, burst: int, want: int, owe: bool = False) -> tuple[int, int]:
        """Up to ``want`` tokens of the bucket at ``key`` (``owe``: all of
        them, below zero if need be); ``(granted, ms until one is back)``."""
        self.bucket_calls += 1
        granted, wait_ms = await self._take(keys=[key], args=[rate, burst, want, int(owe)])
        return int(granted), int(wait_ms)

    # ------------------------------------------------------------ subscriptions

    async def open_subscription(self, subject: str) -> bool:
        """Count one more live subscription of ``subject``, or False (and
        nothing counted) when the subject holds the most it may."""
        cap = self.settings.max_subscriptions_per_subject
        count = self.subscriptions.get(subject, 0) + 1
        self.subscriptions[subject] = count  # counted before the await: concurrent opens see it
        if cap <= 0:
            return True
        try:
            stored, _ = await self._count(
                keys=[subject_subscriptions_key(subject)], args=self._count_args(subject, count, check=True)
            )
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("subscriptions of a subject not counted in Redis: %s", exc)
            stored = count <= cap  # this process's own count still holds
        if not stored:
            self.close_subscription(subject)
        return bool(stored)

    def close_subscription(self, subject: str, count: int = 1) -> None:
        """Forget ``count`` subscriptions; Redis learns it on the next loop turn
        (one pipeline for every subject that changed meanwhile)."""
        left = self.subscriptions.get(subject, 0) - count
        if left > 0:
            self.subscriptions[subject] = left
        else:
            self.subscriptions.pop(subject, None)
        if self.settings.max_subscriptions_per_subject > 0:
            self._dirty.add(subject)
            if self._flushing is None:
                self._flushing = spawn(self._flush(), name="yrelay-subscription-counts")

    def _count_args(self, subject: str, count: int, check: bool) -> list[str | int]:
        lease_ms = int(self.settings.subscription_lease * 1000)
        return [self.instance, count, self.settings.max_subscriptions_per_subject, lease_ms, int(check)]

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # let the rest of this turn's closes join the batch
            dirty, self._dirty = self._dirty, set()
            await self._store_counts(dirty)
        finally:
            self._flushing = None

    async def _store_counts(self, subjects: set[str]) -> bool:
        """This process's count of each subject, written with a fresh lease.
        Never raises for a lost Redis (the next renewal writes them again):
        the pipeline's set-up and tear-down can fail too, not only its
        execution (a cluster failover: "Task exception was never retrieved"
        from the flush, up to 35 times per chaos run)."""
        if not subjects:
            return True
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for subject in subjects:
                    args = self._count_args(subject, self.subscriptions.get(subject, 0), check=False)
                    await self._count(keys=[subject_subscriptions_key(subject)], args=args, client=pipe)
                await pipe.execute()
        except Exception as exc:
            if not lost_redis(exc):
                raise
            log.debug("subscription counts not stored: %r", exc)  # the next renewal tries again
            return False
        return True

    def start(self) -> None:
        if self.settings.max_subscriptions_per_subject > 0:
            self._renewal.start()

    async def _renew(self) -> None:
        """Renew this process's leases three times per lease."""
        while True:
            await asyncio.sleep(self.settings.subscription_lease / 3)
            if not await self._store_counts(set(self.subscriptions)):  # a bug crashes the loop: restarted
                log.warning(
                    "subscription leases not renewed (Redis unreachable); retrying in %.0fs",
                    self.settings.subscription_lease / 3,
                )

    async def stop(self) -> None:
        """Give the counts back (a clean stop need not wait for the lease)."""
        if self._flushing is not None:
            self._flushing.cancel()
        await self._renewal.stop()
        subjects = set(self.subscriptions) | self._dirty
        self.subscriptions.clear()
        try:
            await self._store_counts(subjects)
        except Exception as exc:  # noqa: BLE001 - a stop always completes; the leases lapse by themselves
            log.debug("subscription counts not released: %s", exc)


__all__ = ["SharedBucket", "SubjectBuckets", "SubjectQuotas"]
