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
the listings (its buckets of :mod:`yrelay.listing`, and the unsplit keys of
older releases), each tracked
session's document set (with its digest), and every group's dead letters.
The tombstone expires after ``delete_tombstone_seconds``; the id can then be
written again, as a new document.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.exceptions
from redis.asyncio import Redis

from .change_feed import announce
from .keys import (
    bucket_documents_key,
    bucket_gc_due_key,
    document_bucket,
    document_keys,
    documents_key,
    gc_due_key,
    group_dead_letters_key,
    group_leases_key,
    group_progress_key,
    groups_key,
    meta_key,
    replication_probe_key,
    stream_key,
    tracker_key,
)
from .offsets import StreamId
from .replies import text
from .scripts import source
from .store import Entry
from .tracker.tracker import session_documents

#: The session of a deletion marker entry: never a real session id (those
#: have no ``:``, keys.SESSION_ID_PATTERN), so no client's own entry is one.
DELETION_SESSION = "yrelay:deleted"
#: How append.lua refuses a write to a deleted document (a Redis error reply).
DELETED_ERROR = "YRELAY_DELETED"


def is_deletion(entry: Entry) -> bool:
    """Whether ``entry`` is a deletion marker."""
    return entry.session == DELETION_SESSION


def is_deleted_error(exc: BaseException) -> bool:
    """Whether an append failed because the document was deleted."""
    return isinstance(exc, redis.exceptions.ResponseError) and DELETED_ERROR in str(exc)  # a pipeline prefixes it


class DocumentDeleted(Exception):
    """A reader reached a document's deletion marker."""


@dataclass(frozen=True)
class Deleted:
    doc: str
    #: The deletion marker's id: every reader at or past it has seen the deletion.
    marker: StreamId
    #: Sessions that were tracking the document.
    sessions: list[str]


async def unlist(redis: Redis, doc: str, groups: list[str] = ()) -> None:  # type: ignore[assignment]
    """Take ``doc`` out of the listings (and ``groups``' dead letters). Also
    after a refused write: the append's pipeline lists what it wrote to."""
    async with redis.pipeline(transaction=False) as pipe:
        bucket = document_bucket(doc)
        for key in (bucket_documents_key(bucket), bucket_gc_due_key(bucket), documents_key(), gc_due_key()):
            pipe.zrem(key, doc)  # the unsplit keys too: an older server may still write them (listing.py)
        for group in groups:
            pipe.hdel(group_dead_letters_key(group), doc)
        await pipe.execute()


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
