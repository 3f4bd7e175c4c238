"""``GET /healthz`` and ``GET /readyz``: the process is up; Redis answers
and every script is loaded. Part of the relay's router, so a host app that
includes it under ``/collab`` probes ``/collab/readyz``. Anyone may ask;
only a caller with the ops or metrics token is told which process answered
and why it is not ready (both name hosts)."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from yrelay.app.binding import relay_context
from yrelay.config import Settings

_bearer = HTTPBearer(auto_error=False, description="YRELAY_OPS_TOKEN or YRELAY_METRICS_TOKEN: shows why not ready.")

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (no dependencies checked)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> JSONResponse:
    """Redis answers and every script is loaded: ready for traffic. Which
    process (``host:pid``) and why not (Redis's error text names hosts and
    ports) only with the ops or metrics token."""
    ctx = relay_context(request)
    operator = _operator(ctx.settings, credentials)
    try:
        await ctx.redis.ping()
        scripts = ctx.scripts()
        if not all(await ctx.redis.script_exists(*(script.sha for script in scripts))):
            for script in scripts:  # Redis restarted without its script cache
                script.sha = await ctx.redis.script_load(script.script)
    except Exception as exc:  # noqa: BLE001 - any failure of the check reads "unavailable", never a 500
        body = {"status": "unavailable"}
        if operator:
            body["reason"] = str(exc)[:200]
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ready", "process": ctx.process_id} if operator else {"status": "ready"})


def _operator(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """The caller holds the ops or the metrics token."""
    if credentials is None:
        return False
    given = credentials.credentials.encode()
    return any(
        secrets.compare_digest(given, token.encode()) for token in (settings.ops_token, settings.metrics_token) if token
    )
