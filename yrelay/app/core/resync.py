"""A subscription's answers about where the client stands: where a
resubscribing client resumes (or why it must resync), and the two-way
state-vector exchange that brings a client back (answered again when a
failover took the answer's entries back while it was read).

Both only read and compute; the subscription applies the outcome to its
state (:mod:`.subscription`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.exceptions

from yrelay.protocol import ResyncReason
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry, Snapshot, held_offset
from yrelay.storage.rewind import find_rewound
from yrelay.yjs.engine_pool import precheck_state_vector

if TYPE_CHECKING:
    from yrelay.app.core.services import ReadServices

log = logging.getLogger(__name__)

#: Reads of a document for a sync answer, when Redis closed the connection.
READ_ATTEMPTS = 3


@dataclass(frozen=True)
class Resume:
    """The client resumes at ``offset``; ``window``: the server's drift
    digest for it (None for a client that keeps none)."""

    offset: StreamId
    window: WindowDigest | None = None


async def resume_point(
    services: ReadServices, doc: str, session: str, requested: StreamId, claimed: WindowDigest | None, last: StreamId
) -> Resume | ResyncReason:
    """Where a client that holds ``requested`` (with the drift digest
    ``claimed`` over its window) continues, given the document's ``last``
    id; or why it must resync first.

    The server compares when its window starts where the client's does;
    when GC trimmed past the client's ``since``, the client compares the
    digest it gets in ``subscribed``. Either side that sees a difference
    starts the two-way state-vector exchange."""
    claimed_end = claimed.end if claimed else requested
    if max(requested, claimed_end) > last:  # the client holds entries the server lost
        return ResyncReason.AHEAD
    if requested < await services.store.trimmed_through(doc):
        return ResyncReason.TRIMMED
    if claimed is None:  # a client that keeps no digest
        return Resume(requested)
    window = await services.digests.window(doc, claimed.since, requested, claimed.through, session)
    if window is None or (window.since == claimed.since and window.digest != claimed.digest):
        log.warning("document %s session %s: drift detected (client %s, server %s)", doc, session, claimed, window)
        return ResyncReason.DRIFT
    return Resume(requested, window)


@dataclass(frozen=True)
class SyncAnswer:
    """What a client lacks (``diff``), the server's state vector, and the
    offset up to which the stream is held in the answer (tracked already)."""

    offset: StreamId
    diff: bytes
    state_vector: bytes


async def answer_sync(services: ReadServices, doc: str, session: str, state_vector: bytes) -> SyncAnswer:
    """The server's side of the two-way state-vector exchange; the session
    is tracked at the answer's offset. Raises :class:`crdt.InvalidUpdate`
    for a bad state vector, :class:`.engine_pool.EngineFailed` when the
    engine cannot compute the answer, Redis errors as they come.

    The state vector is decoded and bounded (pure Python) before any CRDT
    engine sees it, here when it is small; the answer is computed in an
    engine worker (:mod:`.engine_pool`), so neither a hostile vector nor a
    costly document can crash or stall this process."""
    answer = await sync_answer(services, doc, state_vector)
    await services.tracker.track(doc, session, answer.offset)
    return answer


async def sync_answer(services: ReadServices, doc: str, state_vector: bytes) -> SyncAnswer:
    """:func:`answer_sync` without tracking anyone (``/yws`` connections
    never pin a stream); an answer computed from the same entries is served
    again instead of computed in an engine worker (:mod:`.answer_cache`)."""
    precheck_state_vector(state_vector)
    snapshot, entries = await _read_again_if_lost(services, doc)
    folded = str(entries[-1].id if entries else snapshot.offset)  # what the answer is computed from
    cached: SyncAnswer | None = services.answers.get(doc, state_vector, folded)
    if cached is not None:  # the same entries and state vector: the engine's diff would be the same
        return cached
    answer = await services.engine.sync_answer(state_vector, snapshot.update, [entry.update for entry in entries])
    result = SyncAnswer(held_offset(snapshot, entries, answer.held), answer.diff, answer.state_vector)
    services.answers.put(doc, state_vector, folded, result, len(result.diff) + len(result.state_vector))
    return result


async def _read_again_if_lost(services: ReadServices, doc: str) -> tuple[Snapshot, list[Entry]]:
    """The document's snapshot and entries. A read is all it is, so one that
    met a connection Redis closed (the pool's connections after a Redis
    restart fail once each) is made again, up to ``READ_ATTEMPTS`` times,
    rather than closing the client's connection for it."""
    for attempt in range(READ_ATTEMPTS):
        try:
            return await services.store.load_entries(doc, services.settings.page_size)
        except redis.exceptions.ConnectionError:
            if attempt == READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


__all__ = ["Resume", "SyncAnswer", "answer_sync", "resume_point", "sync_answer"]


async def answer_from_current_stream(
    services: ReadServices, doc: str, session: str | None, state_vector: bytes
) -> SyncAnswer:
    """:func:`answer_sync` for ``session`` (None: :func:`sync_answer`, an
    untracked client), computed again when Redis failed while it was read
    and its offset is gone from the stream now: the answer was read from a
    master that lost it (a failover to a replica that lagged), and the
    fan-out's check may be over before this answer's offset becomes the
    subscription's cursor. Not sent yet, so the client holds none of it: a
    fresh answer from the stream as it is now is all it takes."""
    for _ in range(READ_ATTEMPTS):
        failures = services.fanout.failures
        answer = await (
            sync_answer(services, doc, state_vector)
            if session is None
            else answer_sync(services, doc, session, state_vector)
        )
        if failures == services.fanout.failures or not await find_rewound(services.store.redis, {doc: [answer.offset]}):
            return answer
        log.warning("document %s: the sync answer was read from a stream that went back since; answering again", doc)
    return answer
