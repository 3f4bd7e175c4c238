"""Which documents a GC pass looks at, and the loop that runs passes.

Appends mark documents as changed in the due set, split into buckets (see
:mod:`yrelay.storage.listing`); a pass claims due documents from it, bucket by
bucket, under a lease (``gc_claim.lua``, one bucket key per call: one cluster
slot), collects them, and hands them back (``gc_release.lua``): settled ones
leave the set, the rest come due again after one interval. A pass never scans the keyspace, and processes running passes
at the same time claim disjoint documents. Correctness does not depend on the
lease: the collector's compare-and-set makes overlapping collections safe.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.typing import EncodableT

from yrelay.gc.collector import Collector, DocReport
from yrelay.storage.keys import DOCUMENT_BUCKETS, bucket_gc_due_key
from yrelay.storage.listing import all_documents, by_bucket, fold_unbucketed, registry_counts
from yrelay.storage.replies import text
from yrelay.storage.scripts import Scripts
from yrelay.tasks import BackgroundTask, lost_redis

log = logging.getLogger(__name__)


@dataclass
class PassSummary:
    """Totals of one pass (or one CLI / ops run)."""

    documents: int = 0
    evicted: int = 0
    folded: int = 0
    trimmed: int = 0
    blocked: int = 0
    conflicts: int = 0
    errors: int = 0
    seconds: float = 0.0
    reports: list[DocReport] = field(default_factory=list, repr=False)

    def add(self, reports: Iterable[DocReport], keep_reports: bool = False) -> None:
        for report in reports:
            self.documents += 1
            self.evicted += report.evicted
            self.folded += report.folded
            self.trimmed += report.trimmed
            self.blocked += report.blocked_at is not None
            self.conflicts += report.conflict
            self.errors += report.error is not None
            if keep_reports:
                self.reports.append(report)


@dataclass(frozen=True)
class Claim:
    #: bucket -> the lease score of the documents claimed from it
    leases: dict[int, str]
    docs: list[str]


class DueSet:
    """The set of documents waiting for GC, in buckets, with leases."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self.scripts = Scripts(redis)
        #: The bucket the next claim starts from: passes that stop early
        #: (``limit`` reached) still get round to every bucket.
        self._next_bucket = random.randrange(DOCUMENT_BUCKETS)

    async def claim(self, limit: int, lease_ms: int) -> Claim:
        """Up to ``limit`` due documents, taken bucket after bucket."""
        leases: dict[int, str] = {}
        docs: list[str] = []
        for step in range(DOCUMENT_BUCKETS):
            bucket = (self._next_bucket + step) % DOCUMENT_BUCKETS
            lease, *claimed = await self.scripts.gc_claim(
                keys=[bucket_gc_due_key(bucket)], args=[limit - len(docs), lease_ms]
            )
            if claimed:
                leases[bucket] = text(lease)
                docs += [text(doc) for doc in claimed]
            if len(docs) >= limit:
                self._next_bucket = bucket
                break
        return Claim(leases, docs)

    async def release(self, claim: Claim, settled: dict[str, bool], next_due_ms: int) -> None:
        """Hand documents back: settled ones leave the set, the others come
        due ``next_due_ms`` from now (unless appended to meanwhile)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for bucket, docs in by_bucket(settled).items():
                args: list[EncodableT] = [claim.leases[bucket], next_due_ms]
                for doc in docs:
                    args += [doc, "drop" if settled[doc] else "keep"]
                await self.scripts.gc_release(keys=[bucket_gc_due_key(bucket)], args=args, client=pipe)
            await pipe.execute()

    async def pending(self) -> int:
        return (await registry_counts(self.redis))[1]


async def collect_documents(
    collector: Collector,
    docs: list[str] | None,
    *,
    dry_run: bool = False,
    batch_size: int = 500,
    on_batch: Callable[[list[DocReport]], None] | None = None,
) -> PassSummary:
    """Collect the given documents, or every registered one, batch by batch
    (what ``yrelay gc`` and ``POST /ops/gc`` run)."""
    summary = PassSummary()
    started = time.perf_counter()

    async def pages() -> AsyncIterator[list[str]]:
        if docs is None:
            async for page in all_documents(collector.redis, batch_size):
                yield page
        else:
            for start in range(0, len(docs), batch_size):
                yield docs[start : start + batch_size]

    async for page in pages():
        reports = await collector.collect(page, dry_run=dry_run)
        summary.add(reports, keep_reports=True)
        if on_batch is not None:
            on_batch(reports)
    summary.seconds = time.perf_counter() - started
    return summary


#: Documents per collection of a pass (of a claim of ``gc_batch_size``).
#: Each step of a collection is one pipeline over its documents, packed and
#: parsed on the server's event loop, and its scripts run back to back in
#: Redis: over 500 documents of ~30 entries, a pass held every client of the
#: process for ~200 ms (the p99 of the many-documents bench; BENCHMARKS.md
#: "Issue 20: many"). Slices of 25 hold it for a few ms at a time, for a few
#: more round trips per pass.
COLLECT_SLICE = 25


async def run_due_pass(
    collector: Collector, due: DueSet, *, batch_size: int, lease_ms: int, next_due_ms: int
) -> PassSummary:
    """Collect every document that is due now, each at most once."""
    summary = PassSummary()
    started = time.perf_counter()
    seen: set[str] = set()
    while True:
        claim = await due.claim(batch_size, lease_ms)
        fresh = [doc for doc in claim.docs if doc not in seen]
        if fresh:
            settled: dict[str, bool] = {}
            for start in range(0, len(fresh), COLLECT_SLICE):
                reports = await collector.collect(fresh[start : start + COLLECT_SLICE])
                summary.add(reports)
                settled.update((report.doc, report.settled) for report in reports)
            seen.update(fresh)
            await due.release(claim, settled, next_due_ms)
        again = {doc: False for doc in claim.docs if doc not in fresh}
        if again:  # changed again during this pass: due at the next one
            await due.release(claim, again, next_due_ms=0)
        if len(claim.docs) < batch_size or not fresh:
            break
    summary.seconds = time.perf_counter() - started
    return summary


class GcLoop:
    """The periodic GC of one server process."""

    def __init__(
        self,
        collector: Collector,
        *,
        interval: float,
        batch_size: int,
        lease: float,
        on_pass: Callable[[PassSummary], None] | None = None,
    ):
        self.collector = collector
        self.on_pass = on_pass  # told of every completed pass (metrics)
        self.due = DueSet(collector.redis)
        self.interval = interval
        self.batch_size = batch_size
        self.lease_ms = round(lease * 1000)
        self.passes = 0
        self.last: PassSummary | None = None
        self._loop = BackgroundTask("yrelay-gc", self._run)
        self._stopping = False

    def start(self) -> None:
        if self.interval > 0:
            self._loop.start()

    async def stop(self) -> None:
        """Cancel the loop; the flag ends it even when the cancel lands inside
        a Redis call that swallows it (seen with redis-py under load)."""
        self._stopping = True
        await self._loop.stop()

    async def run_once(self) -> PassSummary:
        await fold_unbucketed(self.collector.redis)  # what servers of an older release still write
        summary = await run_due_pass(
            self.collector,
            self.due,
            batch_size=self.batch_size,
            lease_ms=self.lease_ms,
            next_due_ms=round(self.interval * 1000),
        )
        self.passes += 1
        self.last = summary
        if self.on_pass is not None:
            self.on_pass(summary)
        if summary.documents:
            log.info(
                "gc pass: %d documents, %d evicted, %d folded, %d trimmed, %d blocked, %d conflicts in %.3fs",
                summary.documents,
                summary.evicted,
                summary.folded,
                summary.trimmed,
                summary.blocked,
                summary.conflicts,
                summary.seconds,
            )
        return summary

    async def _run(self) -> None:
        while not self._stopping:
            # Jitter keeps the passes of many processes from lining up.
            await asyncio.sleep(self.interval * random.uniform(0.8, 1.2))
            if not self._stopping:  # stop() may have come during the sleep
                await self._pass()

    async def _pass(self) -> None:
        """One pass of the loop: a failure is logged and the loop goes on."""
        try:
            await self.run_once()
        except Exception as exc:
            if lost_redis(exc):
                log.warning("gc pass failed (Redis): %r; next pass in %.0fs", exc, self.interval)
            else:
                log.exception("gc pass failed; next pass in %.0fs", self.interval)
