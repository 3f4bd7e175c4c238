"""``DELETE /ops/docs/{doc}``: delete a document everywhere
(:mod:`yrelay.gc.deletion`). Included in the ops router, behind its token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, status

from yrelay.app.binding import relay_context as _ctx
from yrelay.app.paths import DOC_PARAM
from yrelay.gc.deletion import delete_document
from yrelay.storage.keys import InvalidDocumentId, meta_key, snapshot_key, stream_key, validate_doc_id

router = APIRouter()


@router.delete("/docs/" + DOC_PARAM)
async def delete_doc(doc: str, request: Request) -> dict[str, Any]:
    """Delete a document: its stream, snapshot, clocks, tracker, presence,
    groups' leases, listings. Subscribers get ``error document_deleted``
    and their subscription ends; consumer groups get a batch with
    ``deleted`` (webhooks ``"deleted": true``); writes are refused
    (``document_deleted``) for ``delete_tombstone_seconds``; a new subscriber
    gets an empty document. 404 when the document does not exist."""
    ctx = _ctx(request)
    try:
        validate_doc_id(doc)
    except InvalidDocumentId as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    if not await ctx.redis.exists(stream_key(doc), meta_key(doc), snapshot_key(doc)):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown document {doc!r}")
    deleted = await delete_document(ctx.redis, doc, ctx.settings.delete_tombstone_seconds)
    ctx.events.emit("delete", doc, offset=str(deleted.marker))
    return {"doc": doc, "deleted": True, "marker": str(deleted.marker), "sessions": len(deleted.sessions)}
