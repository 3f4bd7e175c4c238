"""Which relay an HTTP request is for, so routes read their settings and
server context from the :class:`yrelay.Relay` that owns them, never from
``app.state``: a host app may include several relays, and a mounted or
included router's app is the host's.

The relay's router carries one dependency, :func:`binder`, that puts the
relay in the request scope before any other dependency of its routes runs.
A route names the parts it uses as parameters (``redis: RelayRedis``,
``events: RelayEvents``, ...), as FastAPI dependencies, so its signature says
what it touches; the readiness and metrics routes, which report on the
whole process, take :func:`relay_context`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Protocol

from fastapi import Depends, HTTPException, Request, status
from redis.asyncio import Redis

from yrelay.app.context import ServerContext
from yrelay.app.metrics import Metrics
from yrelay.auth import Revocations
from yrelay.config import Settings
from yrelay.gc import Collector
from yrelay.observability.events import Events
from yrelay.tracker import Tracker

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


def relay_redis(request: Request) -> Redis:
    return relay_context(request).redis


def relay_events(request: Request) -> Events:
    return relay_context(request).events


def relay_tracker(request: Request) -> Tracker:
    return relay_context(request).tracker


def relay_collector(request: Request) -> Collector:
    return relay_context(request).collector


def relay_revocations(request: Request) -> Revocations:
    return relay_context(request).revocations


def relay_metrics(request: Request) -> Metrics:
    return relay_context(request).metrics


#: The running relay's parts, as a route's parameters (each 503 while it is not running).
RelayRedis = Annotated[Redis, Depends(relay_redis)]
RelayEvents = Annotated[Events, Depends(relay_events)]
RelayTracker = Annotated[Tracker, Depends(relay_tracker)]
RelayCollector = Annotated[Collector, Depends(relay_collector)]
RelayRevocations = Annotated[Revocations, Depends(relay_revocations)]
RelayMetrics = Annotated[Metrics, Depends(relay_metrics)]
RelaySettings = Annotated[Settings, Depends(relay_settings)]
