"""Collecting documents: evict lagging sessions, fold acked entries into the
snapshot, trim the stream, in an order where a crash between any two steps
loses nothing.

Per document, the steps and why each crash point is safe:

1. **evict** (``gc_evict.lua``): ``ZREMRANGEBYSCORE`` on the tracker. An
   evicted session is resynced on its next ack or reconnect.
2. **fold** (off the event loop: in the server, an engine worker process,
   :mod:`yrelay.yjs.engine_pool`; elsewhere a thread): snapshot + entries in
   ``(snapshot_offset, P]`` where ``P`` is the lowest tracker score left (the
   last id when nobody is tracked). The result is reloaded and checked range by
   range (:func:`yrelay.yjs.engine.fold`); an entry that did not land stops the fold
   just before it and stays in the stream. A fold that fails (the worker's
   deadline, a crash) stores nothing: the document waits for the next pass.
3. **snapshot** (``gc_snapshot.lua``): compare-and-set of snapshot and
   ``snapshot_offset``. A crash after it leaves entries in the stream that the
   snapshot also holds: readers load the snapshot and continue after its
   offset; the next pass trims them. Two collectors that folded from the same
   snapshot cannot both store: the loser reports a conflict.
4. **trim** (``gc_trim.lua``): ``XTRIM MINID``, ``trimmed_through`` and the
   drift digest (the removed ids XORed out; hashed here, checked there) in one
   script that refuses to pass ``snapshot_offset``. A crash after it leaves
   only the statistics of step 5 unwritten.
5. **record**: GC statistics in the meta hash, the stream length for the
   report and the scheduler.

Every step is one pipeline over the whole batch of documents, so a pass over
a thousand changed documents costs a handful of round trips. A long stream
is read and trimmed in pieces (:data:`READ_PAGE`, :data:`TRIM_CHUNK`): one
read of thousands of entries held the server's event loop while redis-py
parsed it, and one trim script of thousands held Redis, each for tens of
milliseconds, and every client of the process waited (BENCHMARKS.md,
"Issue 20: hot p99").
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from yrelay.gc.groups import evict_groups
from yrelay.gc.policy import GcPolicy
from yrelay.observability.eventlog import NullEventLog
from yrelay.observability.events import EventSink
from yrelay.reconciliation.digest import hash_hex, item_hash
from yrelay.storage.keys import dedup_key, dropped_key, meta_key, snapshot_key, stream_key, tracker_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.reads import Entry, to_entry
from yrelay.storage.replies import stream_entries, stream_id, text
from yrelay.storage.scripts import Scripts
from yrelay.tasks import lost_redis
from yrelay.tracker.tracker import session_documents
from yrelay.yjs import crdt, engine


class Step(str, enum.Enum):
    """The points between steps, for crash-injection tests and tracing."""

    EVICTED = "evicted"
    SNAPSHOT_WRITTEN = "snapshot_written"
    TRIMMED = "trimmed"


Checkpoint = Callable[[Step], Awaitable[None]]
#: Entries per read of the entries to fold: redis-py parses (and this module
#: wraps) 250 in about a millisecond, which the event loop waits for.
READ_PAGE = 250
#: Entries per trim script: it reads them, HDELs their dedup fields and XORs
#: their hashes out of the digest in Lua, Redis serving nobody else meanwhile.
TRIM_CHUNK = 500
#: Folds updates into a snapshot: :func:`yrelay.yjs.engine.fold`, somewhere off the loop.
Folder = Callable[[bytes, Sequence[bytes]], Awaitable[engine.Fold]]


@dataclass
class DocReport:
    """What one collection did (or, in a dry run, would do) to one document."""

    doc: str
    #: ``none``, ``relative`` or ``absolute``: which eviction rule applied.
    eviction: str = "none"
    evicted: int = 0
    evicted_sessions: list[str] = field(default_factory=list)
    #: Entries folded into the snapshot.
    folded: int = 0
    #: Entries removed from the stream.
    trimmed: int = 0
    snapshot_offset: str = "0-0"
    #: Stream length afterwards (before, in a dry run).
    stream_length: int = 0
    #: The first entry that could not be folded (missing dependencies): the
    #: stream is kept from there on until it can be.
    blocked_at: str | None = None
    #: Another collector stored a snapshot first; nothing was written here.
    conflict: bool = False
    error: str | None = None

    @property
    def settled(self) -> bool:
        """Nothing left to collect until the document changes again."""
        return self.stream_length == 0 and self.blocked_at is None and self.error is None and not self.conflict


@dataclass
class _Plan:
    report: DocReport
    last_id: StreamId
    snapshot_offset: StreamId
    trimmed_through: StreamId
    #: Fold and trim through here: the lowest tracked offset, or the last id.
    target: StreamId
    base: bytes = b""
    entries: list[Entry] = field(default_factory=list)
    fold: engine.Fold | None = None
    #: The offset the new snapshot covers, once stored.
    stored: StreamId | None = None
    #: The last id trimmed in this collection.
    trimmed_to: str | None = None

    @property
    def doc(self) -> str:
        return self.report.doc


async def _no_checkpoint(step: Step) -> None:
    return None


async def fold_in_thread(base: bytes, updates: Sequence[bytes]) -> engine.Fold:
    """The default folder (tools, tests): the engine in a worker thread."""
    return await asyncio.to_thread(engine.fold, base, updates)


class Collector:
    """Runs collections; one per process (or per CLI run), any number at once."""

    def __init__(
        self,
        redis: Redis,
        policy: GcPolicy,
        checkpoint: Checkpoint | None = None,
        events: EventSink | None = None,
        fold: Folder = fold_in_thread,
    ):
        """``fold``: where folds run (the server passes its engine pool's)."""
        self.fold = fold
        self.redis = redis
        self.policy = policy
        self.scripts = Scripts(redis)
        self.checkpoint = checkpoint or _no_checkpoint
        self.events = events or NullEventLog()

    async def collect(self, docs: list[str], dry_run: bool = False) -> list[DocReport]:
        """Collect ``docs`` (one batch); a report per document, in order."""
        reports = [DocReport(doc) for doc in docs]
        plans = await self._evict(reports, dry_run)
        await self.checkpoint(Step.EVICTED)
        plans = await self._read(plans, with_snapshot=not dry_run)
        if dry_run:
            await self._count_trimmable(plans)
            for plan in plans:
                plan.report.folded = len(plan.entries)
            return reports
        await asyncio.gather(*(self._fold(plan) for plan in plans if plan.entries))
        await self._store_snapshots(plans)
        await self.checkpoint(Step.SNAPSHOT_WRITTEN)
        await self._trim(plans)
        await self.checkpoint(Step.TRIMMED)
        await self._record(plans)
        return reports

    # ------------------------------------------------------------ 1. evict

    async def _evict(self, reports: list[DocReport], dry_run: bool) -> list[_Plan]:
        policy = self.policy
        async with self.redis.pipeline(transaction=False) as pipe:
            for report in reports:
                await self.scripts.gc_evict(
                    keys=[tracker_key(report.doc), stream_key(report.doc), meta_key(report.doc)],
                    # A real eviction returns every name: each leaves its session's document set.
                    args=[
                        policy.relative_ms,
                        policy.absolute_ms,
                        int(dry_run),
                        policy.max_reported_sessions if dry_run else -1,
                    ],
                    client=pipe,
                )
            results = await pipe.execute(raise_on_error=False)
        plans = [plan for report, result in zip(reports, results, strict=True) if (plan := self._plan(report, result))]
        if not dry_run:
            await self._forget_evicted(reports)
        for report in reports:
            del report.evicted_sessions[policy.max_reported_sessions :]
        return await self._hold_for_groups(plans, dry_run)

    async def _hold_for_groups(self, plans: list[_Plan], dry_run: bool) -> list[_Plan]:
        """Consumer groups hold the target back to their lowest position
        (after evicting those that lag too far: yrelay/gc/groups.py)."""
        if not plans:
            return plans
        lowest = await evict_groups(
            self.redis,
            self.scripts,
            [plan.doc for plan in plans],
            abandoned_ms=self.policy.group_abandoned_ms,
            absolute_ms=self.policy.group_absolute_ms,
            dry_run=dry_run,
            events=self.events,
        )
        for plan in plans:
            position = lowest[plan.doc]
            if isinstance(position, Exception):
                plan.report.error = str(position)[:200]
            elif position is not None:
                plan.target = min(plan.target, position)
        return [plan for plan in plans if plan.report.error is None]

    async def _forget_evicted(self, reports: list[DocReport]) -> None:
        """Take the documents out of the evicted sessions' document sets, so
        their subscription-set digests show the eviction. Right after the
        eviction, not in its script: the sets live on other cluster slots.
        A crash in between leaves a stale member, and that one eviction then
        shows only on the session's next ack or reconnect."""
        for report in reports:
            for session in report.evicted_sessions:
                await session_documents(self.redis, session, self.scripts).remove([report.doc])
                self.events.emit("evict", report.doc, session, mode=report.eviction)

    @staticmethod
    def _plan(report: DocReport, result: list[Any] | Exception) -> _Plan | None:
        if isinstance(result, Exception):
            report.error = str(result)[:200]
            return None
        mode, evicted, names, min_score, _leader, last_id, snapshot_offset, trimmed = result
        report.eviction = text(mode)
        report.evicted = int(evicted)
        report.evicted_sessions = [text(name) for name in names]
        folded = stream_id(snapshot_offset) or ZERO
        report.snapshot_offset = str(folded)
        last = stream_id(last_id)
        if last is None:
            return None  # never appended to: nothing to fold or trim
        target = last if not min_score else min(last, StreamId.from_score(float(min_score)))
        return _Plan(report, last, folded, stream_id(trimmed) or ZERO, target)

    # ------------------------------------------------------------- 2. read

    async def _read(self, plans: list[_Plan], with_snapshot: bool) -> list[_Plan]:
        """Read the snapshot and the entries to fold; drop plans another
        collector overtook (its snapshot moved since the eviction step)."""
        to_read = [plan for plan in plans if plan.target > plan.snapshot_offset]
        if not to_read:
            return plans
        async with self.redis.pipeline(transaction=False) as pipe:
            for plan in to_read:
                pipe.hget(meta_key(plan.doc), "snapshot_offset")
                if with_snapshot:
                    pipe.get(snapshot_key(plan.doc))
                else:
                    pipe.exists(snapshot_key(plan.doc))  # a dry run needs no bytes
                pipe.xrange(
                    stream_key(plan.doc),
                    min=f"({plan.snapshot_offset}",
                    max=str(plan.target),
                    count=min(READ_PAGE, self.policy.max_fold_entries),
                )
                pipe.smembers(dropped_key(plan.doc))
            results = await pipe.execute(raise_on_error=False)
        for index, plan in enumerate(to_read):
            offset, snapshot, entries, dropped = results[4 * index : 4 * index + 4]
            failure = next((r for r in (offset, snapshot, entries, dropped) if isinstance(r, Exception)), None)
            if failure is not None:
                plan.report.error = str(failure)[:200]
            elif (stream_id(offset) or ZERO) != plan.snapshot_offset:
                plan.report.conflict = True
            else:
                plan.base = snapshot if isinstance(snapshot, bytes) else b""
                plan.entries = [to_entry(entry_id, fields) for entry_id, fields in entries]
                try:
                    await self._read_rest(plan)
                except Exception as exc:  # this document waits for the next pass, as in the pipeline
                    if not lost_redis(exc):
                        raise
                    plan.report.error = str(exc)[:200]
                    continue
                _empty_dropped(plan.entries, {text(member) for member in dropped})
        return [plan for plan in plans if plan.report.error is None and not plan.report.conflict]

    async def _read_rest(self, plan: _Plan) -> None:
        """The entries to fold past the first page, a page per round trip.
        Read outside the pipeline that checked the snapshot offset: should
        another collector store a snapshot meanwhile (and trim under these
        reads), this one's compare-and-set of the snapshot fails."""
        limit = self.policy.max_fold_entries
        asked = min(READ_PAGE, limit)
        got = len(plan.entries)
        while got == asked and len(plan.entries) < limit and plan.entries[-1].id < plan.target:
            asked = min(READ_PAGE, limit - len(plan.entries))
            page = stream_entries(
                await self.redis.xrange(
                    stream_key(plan.doc), min=f"({plan.entries[-1].id}", max=str(plan.target), count=asked
                )
            )
            got = len(page)
            plan.entries.extend(to_entry(entry_id, fields) for entry_id, fields in page)

    async def _count_trimmable(self, plans: list[_Plan]) -> None:
        """Dry run: how many entries a trim through the target would remove."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for plan in plans:
                pipe.xlen(stream_key(plan.doc))
                pipe.xrange(stream_key(plan.doc), min="-", max=str(plan.target), count=self.policy.max_fold_entries)
            results = await pipe.execute(raise_on_error=False)
        for index, plan in enumerate(plans):
            length, trimmable = results[2 * index : 2 * index + 2]
            plan.report.stream_length = 0 if isinstance(length, Exception) else int(length)
            plan.report.trimmed = 0 if isinstance(trimmable, Exception) else len(trimmable)

    async def _fold(self, plan: _Plan) -> None:
        """CPU part of a collection, off the event loop (``self.fold``)."""
        try:
            plan.fold = await self.fold(plan.base, [entry.update for entry in plan.entries])
        except Exception as exc:  # noqa: BLE001 - the engine's deadline or crash: this document waits
            plan.report.error = f"fold failed: {str(exc)[:200]}"
            return
        if plan.fold.held < len(plan.entries):
            plan.report.blocked_at = str(plan.entries[plan.fold.held].id)

    # --------------------------------------------------------- 3. snapshot

    async def _store_snapshots(self, plans: list[_Plan]) -> None:
        writes = [(plan, plan.fold) for plan in plans if plan.fold is not None and plan.fold.held > 0]
        if not writes:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for plan, fold in writes:
                covers = plan.entries[fold.held - 1].id
                await self.scripts.gc_snapshot(
                    keys=[meta_key(plan.doc), snapshot_key(plan.doc)],
                    args=[str(plan.snapshot_offset), str(covers), fold.snapshot],
                    client=pipe,
                )
            results = await pipe.execute(raise_on_error=False)
        for (plan, fold), result in zip(writes, results, strict=True):
            if isinstance(result, Exception):
                plan.report.error = str(result)[:200]
            elif int(result[0]) == 1:
                plan.stored = stream_id(result[1])
                plan.report.folded = fold.held
                plan.report.snapshot_offset = str(plan.stored)
                self.events.emit(
                    "snapshot",
                    plan.doc,
                    offset=str(plan.stored),
                    entries=plan.report.folded,
                    bytes=len(fold.snapshot),
                )
            else:
                plan.report.conflict = True

    # ------------------------------------------------------------- 4. trim

    async def _trim(self, plans: list[_Plan]) -> None:
        """Trim in chunks (each one short script) until every stream is
        trimmed through min(target, snapshot offset)."""
        pending = {}
        for plan in plans:
            if plan.report.error or plan.report.conflict:
                continue
            through = min(plan.target, plan.stored or plan.snapshot_offset)
            if through > plan.trimmed_through:
                pending[plan.doc] = (plan, through)
        first_round = True
        while pending:
            chunks = await self._trim_chunks(list(pending.values()), first_round)
            first_round = False
            async with self.redis.pipeline(transaction=False) as pipe:
                for (plan, _), ids in zip(pending.values(), chunks, strict=True):
                    await self.scripts.gc_trim(
                        keys=[stream_key(plan.doc), meta_key(plan.doc), dedup_key(plan.doc)],
                        args=_ids_with_running_xor(ids),
                        client=pipe,
                    )
                results = await pipe.execute(raise_on_error=False)
            for (plan, _), result in zip(list(pending.values()), results, strict=True):
                if isinstance(result, Exception):
                    plan.report.error = str(result)[:200]
                    removed = 0
                elif (removed := int(result[0])) < 0:
                    plan.report.conflict = True  # the stream moved under us: next pass
                elif removed:
                    plan.report.trimmed += removed
                    plan.trimmed_to = text(result[1])
                if removed < self._trim_chunk:
                    del pending[plan.doc]

    @property
    def _trim_chunk(self) -> int:
        return min(TRIM_CHUNK, self.policy.max_fold_entries)

    async def _trim_chunks(self, pending: list[tuple[_Plan, StreamId]], first_round: bool) -> list[list[str]]:
        """The ids of the next chunk to trim per document: the trim script
        checks them and XORs their hashes (computed here) out of the digest.

        In the first round they are usually the entries just folded (the
        stream starts right after the old snapshot offset), so those are not
        read again; the rest are read from the stream."""
        chunks = [_folded_ids(plan, through, self._trim_chunk) if first_round else None for plan, through in pending]
        to_read = [index for index, ids in enumerate(chunks) if ids is None]
        if to_read:
            async with self.redis.pipeline(transaction=False) as pipe:
                for index in to_read:
                    plan, through = pending[index]
                    pipe.xrange(stream_key(plan.doc), min="-", max=str(through), count=self._trim_chunk)
                pages = await pipe.execute(raise_on_error=False)
            for index, page in zip(to_read, pages, strict=True):
                chunks[index] = [] if isinstance(page, Exception) else [text(entry_id) for entry_id, _ in page]
        return [ids or [] for ids in chunks]

    # ----------------------------------------------------------- 5. record

    async def _record(self, plans: list[_Plan]) -> None:
        now_ms = int(time.time() * 1000)
        lengths = []
        async with self.redis.pipeline(transaction=False) as pipe:
            for plan in plans:
                report = plan.report
                pipe.hset(meta_key(plan.doc), "gc_at", now_ms)
                pipe.hincrby(meta_key(plan.doc), "gc_folded", report.folded)
                pipe.hincrby(meta_key(plan.doc), "gc_trimmed", report.trimmed)
                pipe.hincrby(meta_key(plan.doc), "gc_evicted", report.evicted)
                _record_blocked(pipe, plan.doc, report.blocked_at, now_ms)
                lengths.append(len(pipe))
                pipe.xlen(stream_key(plan.doc))
            results = await pipe.execute(raise_on_error=False)
        for index, plan in zip(lengths, plans, strict=True):
            length = results[index]
            plan.report.stream_length = 0 if isinstance(length, Exception) else int(length)
        emptied = [plan.doc for plan in plans if plan.report.stream_length == 0 and plan.report.folded]
        if emptied:  # whatever an operator dropped has been folded past and trimmed
            await self.redis.delete(*[dropped_key(doc) for doc in emptied])
        for plan in plans:
            if plan.report.trimmed:
                self.events.emit(
                    "trim",
                    plan.doc,
                    offset=plan.trimmed_to,
                    entries=plan.report.trimmed,
                    stream_length=plan.report.stream_length,
                )


def _empty_dropped(entries: list[Entry], dropped: set[str]) -> None:
    """Entries an operator dropped (gc/blocked.py) fold as empty updates:
    the fold passes them and the trim removes them like any folded entry."""
    if dropped:
        for entry in entries:
            if str(entry.id) in dropped:
                entry.update = crdt.EMPTY_UPDATE


def _record_blocked(pipe: Pipeline, doc: str, blocked_at: str | None, now_ms: int) -> None:
    """Entries no replica can apply (stored before causal admission) stop the
    fold: say which, and since when, in ``meta`` (``/ops/docs/{doc}``)."""
    if blocked_at is None:
        pipe.hdel(meta_key(doc), "blocked_at", "blocked_since")
    else:
        pipe.hset(meta_key(doc), "blocked_at", blocked_at)
        pipe.hsetnx(meta_key(doc), "blocked_since", now_ms)


def _ids_with_running_xor(ids: list[str]) -> list[str]:
    """``gc_trim.lua``'s arguments: each id, then the XOR of the hashes of it
    and every id before it (the script XORs the one at the last id it hashes
    out of the digest)."""
    args: list[str] = []
    running = 0
    for entry_id in ids:
        running ^= item_hash(entry_id)
        args += (entry_id, hash_hex(running))
    return args


def _folded_ids(plan: _Plan, through: StreamId, limit: int) -> list[str] | None:
    """The ids of the stream's first entries through ``through`` (at most
    ``limit``), when the fold read them all (None when they must be read)."""
    if plan.trimmed_through != plan.snapshot_offset or not plan.entries or plan.entries[-1].id < through:
        return None
    return [str(entry.id) for entry in itertools.islice(plan.entries, limit) if entry.id <= through]
