"""Operator endpoints under ``/ops``: GC on demand, document and lag
inspection, eviction by hand. All behind a bearer token of their own
(``YRELAY_OPS_TOKEN``), separate from anything clients hold: without a
configured token the endpoints are off (403), a missing token is 401, a wrong
one 403, whatever the body: a body is read only after the token, and at most
64 KiB of it (:mod:`.http_body`).
"""

from __future__ import annotations

import secrets
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from yrelay.app.binding import relay_context as _ctx
from yrelay.app.binding import relay_settings
from yrelay.app.http_body import documented, json_body
from yrelay.app.paths import DOC_PARAM
from yrelay.auth import AlreadyExpired
from yrelay.gc import DocReport, collect_documents
from yrelay.gc.blocked import drop_blocked
from yrelay.storage.keys import InvalidDocumentId, validate_doc_id
from yrelay.storage.listing import documents_page
from yrelay.tracker.lag import document_status

_bearer = HTTPBearer(auto_error=False, description="The ops token (YRELAY_OPS_TOKEN).")


def require_ops_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    expected = relay_settings(request).ops_token
    if not expected:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "ops endpoints are disabled: set YRELAY_OPS_TOKEN")
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "ops token required", headers={"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong ops token")


def _doc_id(doc: str) -> str:
    try:
        return validate_doc_id(doc)
    except InvalidDocumentId as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None


class GcRequest(BaseModel):
    doc: str | None = Field(None, description="One document; all documents when omitted.")
    dry_run: bool = Field(False, description="Report what would be folded, trimmed and evicted; change nothing.")


class GcResponse(BaseModel):
    dry_run: bool
    documents: int
    evicted: int
    folded: int
    trimmed: int
    blocked: int
    conflicts: int
    errors: int
    seconds: float
    reports: list[dict[str, Any]] = Field(description="Per document, those where something happened or would.")


router = APIRouter(prefix="/ops", tags=["ops"], dependencies=[Depends(require_ops_token)])


@router.post("/gc", response_model=GcResponse, openapi_extra=documented(GcRequest))
async def run_gc(body: Annotated[GcRequest, Depends(json_body(GcRequest))], request: Request) -> GcResponse:
    """Collect one document or all of them now (or, with ``dry_run``, report)."""
    ctx = _ctx(request)
    docs = None if body.doc is None else [_doc_id(body.doc)]
    summary = await collect_documents(ctx.collector, docs, dry_run=body.dry_run, batch_size=ctx.settings.gc_batch_size)
    if not body.dry_run:
        ctx.metrics.gc_pass(summary, trigger="ops")
    totals = {name: value for name, value in asdict(summary).items() if name != "reports"}
    reports = [asdict(report) for report in summary.reports if _eventful(report) or body.doc is not None]
    return GcResponse(dry_run=body.dry_run, reports=reports, **totals)


def _eventful(report: DocReport) -> bool:
    return bool(
        report.evicted or report.folded or report.trimmed or report.blocked_at or report.conflict or report.error
    )


@router.get("/docs")
async def list_docs(
    request: Request,
    cursor: Annotated[str | None, Query(description="The next_cursor of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Documents in id order, a page at a time: stream length, first and last
    id, snapshot offset, tracked sessions, worst lag."""
    ctx = _ctx(request)
    docs = await documents_page(ctx.redis, _doc_id(cursor) if cursor else None, limit + 1)
    page, more = docs[:limit], len(docs) > limit
    statuses = [asdict(await document_status(ctx.redis, doc, count_cap=10_000)) for doc in page]
    for item in statuses:
        item.pop("sessions")
    return {"documents": statuses, "next_cursor": page[-1] if more else None}


@router.get("/docs/" + DOC_PARAM)
async def get_doc(doc: str, request: Request) -> dict[str, Any]:
    """One document: every tracked session with its offset and its lag in
    entries and in milliseconds."""
    status_ = await document_status(_ctx(request).redis, _doc_id(doc), with_sessions=True)
    if not status_.exists:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown document {doc!r}")
    return asdict(status_)


@router.delete("/docs/" + DOC_PARAM + "/sessions/{session}", status_code=status.HTTP_204_NO_CONTENT)
async def evict_session(doc: str, session: str, request: Request) -> Response:
    """Evict one session by hand. It resyncs on its next ack or reconnect."""
    ctx = _ctx(request)
    if not await ctx.tracker.untrack(_doc_id(doc), session):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"session {session!r} is not tracked on {doc!r}")
    ctx.events.emit("evict", doc, session, mode="operator")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/docs/" + DOC_PARAM + "/drop-blocked")
async def drop_blocked_entries(doc: str, request: Request) -> dict[str, Any]:
    """Resolve a document GC reports as blocked (``blocked_at``): the stored
    entries no replica can apply (written before causal admission) are
    dropped by the next GC pass, which then folds past them. Their content
    was never visible to anyone. Recorded in the event log (``drop_blocked``)."""
    ctx = _ctx(request)
    ids = await drop_blocked(ctx.redis, _doc_id(doc), ctx.events)
    return {"doc": doc, "dropped": ids}


class RevokeRequest(BaseModel):
    jti: str = Field(..., min_length=1, max_length=200, description="The token id (JWT 'jti') to revoke.")
    expires_at: float | None = Field(
        None,
        allow_inf_nan=False,
        description="The token's exp (Unix seconds); the revocation is kept until "
        "then plus auth_leeway. 422 when that has passed already.",
    )


@router.post("/tokens/revoke", status_code=status.HTTP_204_NO_CONTENT, openapi_extra=documented(RevokeRequest))
async def revoke_token(body: Annotated[RevokeRequest, Depends(json_body(RevokeRequest))], request: Request) -> Response:
    """Revoke a client token on every server process: its connections are
    closed with code 4401 within ``revocation_refresh`` + ``resend_check_interval`` seconds, and it is
    refused from then on."""
    try:
        await _ctx(request).revocations.revoke(body.jti, body.expires_at)
    except AlreadyExpired as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)


from yrelay.app import ops_dead_letters, ops_delete  # noqa: E402 - their routes share this router's token check

router.include_router(ops_dead_letters.router)
router.include_router(ops_delete.router)
