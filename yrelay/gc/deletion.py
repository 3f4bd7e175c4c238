"""Deleting a document (``DELETE /ops/docs/{doc}``): everything goes, a
short-lived tombstone stays.

``delete_document.lua`` removes every key of the document on its slot
(stream, snapshot, meta, clocks, dedup, tracker, presence, dropped ids) and
leaves a tombstone: the stream holds one *deletion marker* entry and meta
says ``deleted`` (see the script). What that gives, with no new channel
between processes:

- live subscribers read the marker through the fan-out like any change and
  are sent ``error document_deleted`` (their subscription ends);
- consumer groups read it from their position and hand a batch with
  ``deleted=True`` to the service (webhooks send ``"deleted": true``);
- a write racing the delete is refused by ``append.lua`` while the tombstone
  lives (``document_deleted``), so nothing brings back half a document;
- a new subscriber starts after the marker: an empty document.

Outside the slot, in one pipeline after the script: the document leaves
the listings (its buckets of :mod:`yrelay.storage.listing`, and the unsplit keys of
older releases), each tracked
session's document set (with its digest), and every group's dead letters.
The tombstone expires after ``delete_tombstone_seconds``; the id can then be
written again, as a new document.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from yrelay.storage.change_feed import announce
from yrelay.storage.keys import (
    document_keys,
    group_leases_key,
    group_progress_key,
    groups_key,
    meta_key,
    replication_probe_key,
    stream_key,
    tracker_key,
)
from yrelay.storage.offsets import StreamId
from yrelay.storage.replies import text
from yrelay.storage.scripts import source
from yrelay.storage.tombstones import (
    DELETED_ERROR,
    DELETION_SESSION,
    DocumentDeleted,
    is_deleted_error,
    is_deletion,
    unlist,
)
from yrelay.tracker.tracker import session_documents

#: The marker, the refusal and the unlisting live in :mod:`yrelay.storage.tombstones`
#: (below the store, which recognises them); their names stay importable here.
__all__ = [
    "DELETED_ERROR",
    "DELETION_SESSION",
    "Deleted",
    "DocumentDeleted",
    "delete_document",
    "is_deleted_error",
    "is_deletion",
    "unlist",
]


@dataclass(frozen=True)
class Deleted:
    doc: str
    #: The deletion marker's id: every reader at or past it has seen the deletion.
    marker: StreamId
    #: Sessions that were tracking the document.
    sessions: list[str]


async def delete_document(redis: Redis, doc: str, tombstone_seconds: float) -> Deleted:
    """Delete ``doc`` everywhere (idempotent while the tombstone lives)."""
    first = [stream_key(doc), meta_key(doc), tracker_key(doc), group_progress_key(doc), group_leases_key(doc)]
    rest = [key for key in [*document_keys(doc), replication_probe_key(doc)] if key not in first]
    script = redis.register_script(source("delete_document"))
    marker, raw_sessions = await script(keys=first + rest, args=[max(1, round(tombstone_seconds)), DELETION_SESSION])
    sessions = [text(session) for session in raw_sessions]
    await announce(redis, [doc])  # the subscribers' fan-outs read the marker now, not at their next sweep
    groups = [text(group) for group in await redis.smembers(groups_key())]
    await unlist(redis, doc, groups)
    for session in sessions:
        await session_documents(redis, session).remove([doc])
    return Deleted(doc, StreamId.parse(text(marker)), sessions)
