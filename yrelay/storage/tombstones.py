"""What a deleted document leaves behind that readers and writers recognise:
the deletion marker entry, the refusal of a write, and leaving the listings.

:mod:`yrelay.gc.deletion` deletes a document and re-exports every name here;
they live below it, and below :mod:`yrelay.storage.reads`, because the store's own
reads and appends must recognise a deletion, and the deletion itself reads
and writes through the store's neighbours (no import cycle).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.exceptions
from redis.asyncio import Redis

from yrelay.storage.entries import Entry
from yrelay.storage.keys import (
    bucket_documents_key,
    bucket_gc_due_key,
    document_bucket,
    documents_key,
    gc_due_key,
    group_dead_letters_key,
)

#: The session of a deletion marker entry: never a real session id (those
#: have no ``:``, keys.SESSION_ID_PATTERN), so no client's own entry is one.
DELETION_SESSION = "yrelay:deleted"
#: How append.lua refuses a write to a deleted document (a Redis error reply).
DELETED_ERROR = "YRELAY_DELETED"


class DocumentDeleted(Exception):
    """A reader reached a document's deletion marker."""


def is_deletion(entry: Entry) -> bool:
    """Whether ``entry`` is a deletion marker."""
    return entry.session == DELETION_SESSION


def is_deleted_error(exc: BaseException) -> bool:
    """Whether an append failed because the document was deleted."""
    return isinstance(exc, redis.exceptions.ResponseError) and DELETED_ERROR in str(exc)  # a pipeline prefixes it


async def unlist(redis: Redis, doc: str, groups: Sequence[str] = ()) -> None:
    """Take ``doc`` out of the listings (and ``groups``' dead letters). Also
    after a refused write: the append's pipeline lists what it wrote to."""
    async with redis.pipeline(transaction=False) as pipe:
        bucket = document_bucket(doc)
        for key in (bucket_documents_key(bucket), bucket_gc_due_key(bucket), documents_key(), gc_due_key()):
            pipe.zrem(key, doc)  # the unsplit keys too: an older server may still write them (listing.py)
        for group in groups:
            pipe.hdel(group_dead_letters_key(group), doc)
        await pipe.execute()
