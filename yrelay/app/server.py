"""The standalone application (``yrelay serve``): a :class:`yrelay.Relay`
at the root, its lifespan as the app's, and the browser client
(:mod:`yrelay.app.web`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from yrelay import __version__
from yrelay.app.relay import WEBSOCKET_PATH, Relay, is_sync
from yrelay.app.web import mount_web_client
from yrelay.app.wire.yws_endpoint import yws_doc
from yrelay.auth import Authenticator
from yrelay.config import Settings


class _YrelayApp(FastAPI):
    """FastAPI, with the websocket endpoint ``/ws`` served straight from the
    ASGI call: its connections skip the middleware stack and routing, whose
    exit stacks and suspended coroutines were ~11 kB of traced allocations
    per open connection, and a wrapper around every send (BENCHMARKS.md,
    scenario idle; the server's RSS did not show the saving)."""

    relay: Relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_sync(scope, WEBSOCKET_PATH):
            scope["app"] = self
            await self.relay.endpoint(scope, receive, send)
            return
        if yws_doc(scope) is not None:  # /yws/<doc>: the same shortcut
            scope["app"] = self
            await self.relay.yws_endpoint(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, redis_url: str, authenticator: Authenticator | None = None) -> FastAPI:
    """An app bound to one Redis; the process-wide parts start with it.

    ``authenticator`` is the hook for apps with their own user system
    (yrelay.auth.Authenticator); by default the settings choose one (JWT)."""
    relay = Relay(settings, redis_url=redis_url, authenticator=authenticator)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with relay.lifespan():
            yield

    app = _YrelayApp(title="yrelay", version=__version__, lifespan=lifespan)
    app.relay = relay
    app.include_router(relay.router)
    mount_web_client(app, settings=settings)
    return app
