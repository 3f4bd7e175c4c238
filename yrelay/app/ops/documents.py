"""``/ops/docs``: the documents as an operator sees them (pages of them, one
with its sessions and their lag) and what may be done to one by hand:
evict a session, drop the entries no replica can apply, delete it
everywhere (:mod:`yrelay.gc.deletion`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response, status

from yrelay.app.binding import RelayEvents, RelayRedis, RelaySettings, RelayTracker
from yrelay.app.ops.names import doc_id
from yrelay.app.paths import DOC_PARAM
from yrelay.gc.blocked import drop_blocked
from yrelay.gc.deletion import delete_document
from yrelay.storage.keys import meta_key, snapshot_key, stream_key
from yrelay.storage.listing import documents_page
from yrelay.tracker.lag import document_status

router = APIRouter()


@router.get("/docs")
async def list_docs(
    redis: RelayRedis,
    cursor: Annotated[str | None, Query(description="The next_cursor of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Documents in id order, a page at a time: stream length, first and last
    id, snapshot offset, tracked sessions, worst lag."""
    docs = await documents_page(redis, doc_id(cursor) if cursor else None, limit + 1)
    page, more = docs[:limit], len(docs) > limit
    statuses = [asdict(await document_status(redis, doc, count_cap=10_000)) for doc in page]
    for item in statuses:
        item.pop("sessions")
    return {"documents": statuses, "next_cursor": page[-1] if more else None}


@router.get("/docs/" + DOC_PARAM)
async def get_doc(doc: str, redis: RelayRedis) -> dict[str, Any]:
    """One document: every tracked session with its offset and its lag in
    entries and in milliseconds."""
    status_ = await document_status(redis, doc_id(doc), with_sessions=True)
    if not status_.exists:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown document {doc!r}")
    return asdict(status_)


@router.delete("/docs/" + DOC_PARAM + "/sessions/{session}", status_code=status.HTTP_204_NO_CONTENT)
async def evict_session(doc: str, session: str, tracker: RelayTracker, events: RelayEvents) -> Response:
    """Evict one session by hand. It resyncs on its next ack or reconnect."""
    if not await tracker.untrack(doc_id(doc), session):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"session {session!r} is not tracked on {doc!r}")
    events.emit("evict", doc, session, mode="operator")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/docs/" + DOC_PARAM + "/drop-blocked")
async def drop_blocked_entries(doc: str, redis: RelayRedis, events: RelayEvents) -> dict[str, Any]:
    """Resolve a document GC reports as blocked (``blocked_at``): the stored
    entries no replica can apply (written before causal admission) are
    dropped by the next GC pass, which then folds past them. Their content
    was never visible to anyone. Recorded in the event log (``drop_blocked``)."""
    ids = await drop_blocked(redis, doc_id(doc), events)
    return {"doc": doc, "dropped": ids}


# After the session route: this document id (any characters) would match its path too.
@router.delete("/docs/" + DOC_PARAM)
async def delete_doc(doc: str, redis: RelayRedis, events: RelayEvents, settings: RelaySettings) -> dict[str, Any]:
    """Delete a document: its stream, snapshot, clocks, tracker, presence,
    groups' leases, listings. Subscribers get ``error document_deleted``
    and their subscription ends; consumer groups get a batch with
    ``deleted`` (webhooks ``"deleted": true``); writes are refused
    (``document_deleted``) for ``delete_tombstone_seconds``; a new subscriber
    gets an empty document. 404 when the document does not exist."""
    doc = doc_id(doc)
    if not await redis.exists(stream_key(doc), meta_key(doc), snapshot_key(doc)):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown document {doc!r}")
    deleted = await delete_document(redis, doc, settings.delete_tombstone_seconds)
    events.emit("delete", doc, offset=str(deleted.marker))
    return {"doc": doc, "deleted": True, "marker": str(deleted.marker), "sessions": len(deleted.sessions)}
