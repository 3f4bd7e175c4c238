"""``GET /metrics``: the Prometheus text format, and who may read it.

With ``YRELAY_METRICS_TOKEN`` or ``YRELAY_OPS_TOKEN`` set, a scrape needs
``Authorization: Bearer <either>`` (missing: 401, wrong: 403; Prometheus
sends it with ``authorization: {credentials: ...}``). Without a token the
figures are served to loopback clients only (``curl localhost:8000/metrics``
on the host), so a server listening on a public interface never shows them
to the world by accident. The metrics hold no document or session ids.
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE

from yrelay.app.binding import relay_context, relay_settings

_bearer = HTTPBearer(auto_error=False, description="YRELAY_METRICS_TOKEN or YRELAY_OPS_TOKEN.")


def _loopback(request: Request) -> bool:
    try:
        return request.client is not None and ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:
        return False


def may_scrape(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    settings = relay_settings(request)
    tokens = [token for token in (settings.metrics_token, settings.ops_token) if token]
    if not tokens:
        if _loopback(request):
            return
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "metrics are served to loopback clients only: set YRELAY_METRICS_TOKEN"
        )
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "metrics token required", headers={"WWW-Authenticate": "Bearer"}
        )
    given = credentials.credentials.encode()
    if not any(secrets.compare_digest(given, token.encode()) for token in tokens):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong metrics token")


router = APIRouter(tags=["monitoring"])


@router.get(
    "/metrics",
    dependencies=[Depends(may_scrape)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format."}},
)
async def metrics(request: Request) -> Response:
    """Counters, gauges and histograms of this server process (docs/operations.md#metrics)."""
    ctx = relay_context(request)
    if not ctx.settings.metrics:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "metrics are off (YRELAY_METRICS=0)")
    await ctx.metrics.refresh(ctx.redis)
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)
