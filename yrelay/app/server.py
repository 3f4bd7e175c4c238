"""The FastAPI application: the websocket endpoint, health checks, the
operator endpoints (:mod:`yrelay.app.ops`) and the browser client
(:mod:`yrelay.app.web`)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, WebSocket
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Receive, Scope, Send

from .. import __version__
from ..auth import Authenticator
from ..config import Settings
from .connection import Connection
from .context import ServerContext
from .ops import router as ops_router
from .scrape import router as scrape_router
from .web import mount_web_client

#: The one websocket endpoint.
WEBSOCKET_PATH = "/ws"

_bearer = HTTPBearer(auto_error=False, description="YRELAY_OPS_TOKEN or YRELAY_METRICS_TOKEN: shows why not ready.")


class _YrelayApp(FastAPI):
    """FastAPI, with the websocket endpoint ``/ws`` served straight from the
    ASGI call: its connections skip the middleware stack and routing, whose
    exit stacks and suspended coroutines were ~11 kB of traced allocations
    per open connection, and a wrapper around every send (BENCHMARKS.md,
    scenario idle; the server's RSS did not show the saving)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == WEBSOCKET_PATH:
            scope["app"] = self
            await Connection(WebSocket(scope, receive, send), self.state.ctx).run()
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, redis_url: str, authenticator: Authenticator | None = None) -> FastAPI:
    """An app bound to one Redis; the process-wide parts start with it.

    ``authenticator`` is the hook for apps with their own user system
    (yrelay.auth.Authenticator); by default the settings choose one (JWT)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ctx = await ServerContext.open(settings, redis_url, authenticator)
        try:
            yield
        finally:
            await app.state.ctx.close()

    app = _YrelayApp(title="yrelay", version=__version__, lifespan=lifespan)
    app.include_router(ops_router)
    app.include_router(scrape_router)
    mount_web_client(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up (no dependencies checked)."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> JSONResponse:
        """Redis answers and every script is loaded: ready for traffic. Why
        not (Redis's error text names hosts and ports) only with the ops or
        metrics token."""
        ctx: ServerContext = app.state.ctx
        try:
            await ctx.redis.ping()
            scripts = ctx.scripts()
            if not all(await ctx.redis.script_exists(*(script.sha for script in scripts))):
                for script in scripts:  # Redis restarted without its script cache
                    script.sha = await ctx.redis.script_load(script.script)
        except Exception as exc:
            body = {"status": "unavailable"}
            if _operator(ctx.settings, credentials):
                body["reason"] = str(exc)[:200]
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ready", "process": ctx.process_id})

    return app


def _operator(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """The caller holds the ops or the metrics token."""
    if credentials is None:
        return False
    given = credentials.credentials.encode()
    return any(secrets.compare_digest(given, token.encode())
               for token in (settings.ops_token, settings.metrics_token) if token)
