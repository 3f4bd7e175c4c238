"""Which relay an HTTP request is for, so routes read their settings and
server context from the :class:`yrelay.Relay` that owns them, never from
``app.state``: a host app may include several relays, and a mounted or
included router's app is the host's.

The relay's router carries one dependency, :func:`binder`, that puts the
relay in the request scope before any other dependency of its routes runs;
routes then call :func:`relay_settings` or :func:`relay_context`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fastapi import HTTPException, Request, status

from yrelay.app.context import ServerContext
from yrelay.config import Settings

#: The request scope key the relay of a request is kept under.
RELAY_KEY = "yrelay.relay"


class BoundRelay(Protocol):
    settings: Settings
    context: ServerContext | None


def binder(relay: BoundRelay) -> Callable[[Request], None]:
    """The dependency that marks a request as ``relay``'s."""

    def bind_relay(request: Request) -> None:
        request.scope[RELAY_KEY] = relay

    return bind_relay


def relay_settings(request: Request) -> Settings:
    """The settings of the relay the request is for (known before its lifespan)."""
    relay: BoundRelay = request.scope[RELAY_KEY]
    return relay.settings


def relay_context(request: Request) -> ServerContext:
    """The running server context; 503 while the relay's lifespan is not
    entered (the host app forgot ``async with relay.lifespan()``, or is
    shutting down)."""
    relay: BoundRelay = request.scope[RELAY_KEY]
    context = relay.context
    if context is None:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, "yrelay is not running: enter relay.lifespan() from the app's lifespan"
        )
    return context
