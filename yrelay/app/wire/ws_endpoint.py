"""The ``/ws`` endpoint as a raw ASGI app: Starlette routes to it without
its per-connection ``websocket_session`` wrapper, and FastAPI without
dependencies or their exit stacks (docs/embedding.md, memory). The
connection speaks the JSON frames (:mod:`.ws`)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from yrelay.app.core.connection import CLOSE_TRY_AGAIN, Connection
from yrelay.app.core.handshake import SUBPROTOCOL
from yrelay.app.core.services import Services
from yrelay.app.wire.ws import JsonCodec
from yrelay.transport.prepared_frames import prepared_writer


class SyncEndpoint:
    """``services`` returns what the running relay gives a connection, or
    None (the host did not enter ``relay.lifespan()``: the upgrade is
    refused, HTTP 403)."""

    __slots__ = ("_services",)

    def __init__(self, services: Callable[[], Services | None]):
        self._services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        websocket = WebSocket(scope, receive, send)
        services = self._services()
        if services is None:
            await websocket.close(CLOSE_TRY_AGAIN)
            return
        connection = Connection(websocket, services, SUBPROTOCOL)
        connection.speak(JsonCodec(connection, prepared_writer(scope, send)))
        await connection.run()


__all__ = ["SyncEndpoint"]
