"""yrelay as a part of another ASGI app: :class:`Relay`.

A FastAPI host app includes ``relay.router`` under any prefix and enters
``relay.lifespan()`` from its own lifespan::

    relay = Relay(settings, redis_url="redis://localhost:6379/0", authenticate=my_auth)

    @asynccontextmanager
    async def lifespan(app):
        async with relay.lifespan():
            yield

    app = FastAPI(lifespan=lifespan)
    app.include_router(relay.router, prefix="/collab")

``yrelay serve`` is this with the demo page added (:mod:`yrelay.app.server`);
``from yrelay import Relay`` is the public name.
See docs/embedding.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import cast

from fastapi import APIRouter, Depends, FastAPI
from starlette._utils import get_route_path  # Starlette's own (routing re-exports it without declaring it)
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from yrelay.app.binding import binder
from yrelay.app.context import ServerContext
from yrelay.app.core.services import Services
from yrelay.app.health import router as health_router
from yrelay.app.ops import router as ops_router
from yrelay.app.paths import DOC_PARAM
from yrelay.app.scrape import router as scrape_router
from yrelay.app.wire.ws_endpoint import SyncEndpoint
from yrelay.app.wire.yws_endpoint import YWS_PREFIX, YwsEndpoint
from yrelay.auth import Authenticator
from yrelay.auth.host import AuthenticateFn, HostAuthenticator
from yrelay.config import Settings
from yrelay.observability import logs, pygc

#: The endpoint form ``add_websocket_route`` names (it also takes a raw ASGI app).
WebSocketFunction = Callable[[WebSocket], Awaitable[None]]

#: The websocket endpoint, relative to wherever the router is included.
WEBSOCKET_PATH = "/ws"


class Relay:
    """One yrelay server inside a host app: its routes (``router``), its
    running parts (``lifespan()``, then ``context``) and how its clients
    authenticate.

    ``authenticate`` is the host's own check, a function (async or plain)
    ``(connection, token) -> Principal`` (:mod:`yrelay.auth.host`);
    ``authenticator`` an object of the Authenticator protocol. Without
    either, the settings choose (JWT with ``YRELAY_AUTH_SECRET``), and the
    lifespan refuses to start when they name none.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        redis_url: str | None = None,
        authenticator: Authenticator | None = None,
        authenticate: AuthenticateFn | None = None,
    ):
        if authenticator is not None and authenticate is not None:
            raise ValueError("pass authenticator or authenticate, not both")
        self.settings = settings if settings is not None else Settings.from_env()
        url = redis_url or self.settings.redis_url
        if not url:
            raise ValueError("a Relay needs a Redis: pass redis_url= or set YRELAY_REDIS_URL")
        self.redis_url: str = url
        self.authenticator = HostAuthenticator(authenticate) if authenticate is not None else authenticator
        #: The running parts while the lifespan is entered, else None.
        self.context: ServerContext | None = None
        self.endpoint = SyncEndpoint(self._services)
        #: ``/yws/<doc>``: the y-websocket protocol for stock clients (:mod:`.yws`).
        self.yws_endpoint = YwsEndpoint(self._services)
        self.router = self._router()

    def _services(self) -> Services | None:
        """What a connection is given while the relay runs, else None."""
        return self.context.services if self.context is not None else None

    def _router(self) -> APIRouter:
        """The websocket route and the HTTP routes; every HTTP route reads
        this relay (:mod:`yrelay.app.binding`)."""
        router = APIRouter(dependencies=[Depends(binder(self))])
        # Starlette serves an endpoint that is not a function as a raw ASGI app; its annotation names only functions.
        router.add_websocket_route(WEBSOCKET_PATH, cast(WebSocketFunction, self.endpoint), name="yrelay_sync")
        router.add_websocket_route(
            YWS_PREFIX + DOC_PARAM, cast(WebSocketFunction, self.yws_endpoint), name="yrelay_yws"
        )
        for part in (health_router, scrape_router, ops_router):
            router.include_router(part)
        return router

    def install(self, app: FastAPI, prefix: str = "") -> None:
        """``app.include_router(self.router, prefix=prefix)``, and the
        websocket served by an innermost middleware of ``app`` rather than
        through its routers: the host's own middleware still applies to it,
        FastAPI's exception middleware, exit stack and routing (~4-5 kB per
        open connection, docs/embedding.md) do not. Call before the app starts."""
        if app.middleware_stack is not None:
            raise RuntimeError("install the relay before the app starts (its middleware stack is built then)")
        app.include_router(self.router, prefix=prefix)
        app.user_middleware.append(Middleware(SyncShortcut, endpoint=self.endpoint, path=prefix + WEBSOCKET_PATH))

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[Relay]:
        """Start the relay's parts (Redis pools, fan-out, GC, ...) for the
        span of the block; stop them after it."""
        if self.context is not None:
            raise RuntimeError("this relay is running already")
        context = await ServerContext.open(self.settings, self.redis_url, self.authenticator)
        self.context = context
        pygc.tune(self.settings.gc_young_threshold)
        logs.guard_wire()  # no frame or credential header in a debug log, whatever the host's logging
        try:
            yield self
        finally:
            self.context = None  # new requests and websockets are refused while the parts stop
            await context.close()


class SyncShortcut:
    """ASGI middleware: websockets to ``path`` go straight to the endpoint;
    everything else (and every other path) goes on to ``app``."""

    def __init__(self, app: ASGIApp, endpoint: SyncEndpoint, path: str):
        self.app, self.endpoint, self.path = app, endpoint, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_sync(scope, self.path):
            await self.endpoint(scope, receive, send)
            return
        await self.app(scope, receive, send)


def is_sync(scope: Scope, path: str) -> bool:
    """A websocket to ``path`` (relative to the app's root path, so the app may be mounted)."""
    return scope["type"] == "websocket" and get_route_path(scope) == path


__all__ = ["Relay", "SyncShortcut", "WEBSOCKET_PATH", "is_sync"]
