"""``POST /ops/gc``: collect one document or all of them now, or with
``dry_run`` report what a pass would do (:mod:`yrelay.gc.collector`)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from yrelay.app.binding import RelayCollector, RelayMetrics, RelaySettings
from yrelay.app.http_body import documented, json_body
from yrelay.app.ops.names import doc_id
from yrelay.gc import DocReport, collect_documents

router = APIRouter()


class GcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is a 422, not ignored

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


@router.post("/gc", response_model=GcResponse, openapi_extra=documented(GcRequest))
async def run_gc(
    body: Annotated[GcRequest, Depends(json_body(GcRequest))],
    collector: RelayCollector,
    metrics: RelayMetrics,
    settings: RelaySettings,
) -> GcResponse:
    """Collect one document or all of them now (or, with ``dry_run``, report)."""
    docs = None if body.doc is None else [doc_id(body.doc)]
    summary = await collect_documents(collector, docs, dry_run=body.dry_run, batch_size=settings.gc_batch_size)
    if not body.dry_run:
        metrics.gc_pass(summary, trigger="ops")
    totals = {name: value for name, value in asdict(summary).items() if name != "reports"}
    reports = [asdict(report) for report in summary.reports if _eventful(report) or body.doc is not None]
    return GcResponse(dry_run=body.dry_run, reports=reports, **totals)


def _eventful(report: DocReport) -> bool:
    return bool(
        report.evicted or report.folded or report.trimmed or report.blocked_at or report.conflict or report.error
    )
