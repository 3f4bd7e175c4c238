"""The ``/yws/<doc>`` endpoint as a raw ASGI app (as :class:`~.ws_endpoint.SyncEndpoint`
for ``/ws``): which document a request names, and its ``?token=``, taken
out of the request's scope before anything can log the URL with it
(uvicorn's ``WebSocket ... [accepted]`` line reads the same scope). The
connection itself is :mod:`.yws`."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode

from starlette._utils import get_route_path  # Starlette's own (routing re-exports it without declaring it)
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from yrelay.app.core.connection import CLOSE_TRY_AGAIN, Connection
from yrelay.app.core.services import Services
from yrelay.app.wire.yws import YWS_SUBPROTOCOL, YwsCodec

#: Where the endpoint is, relative to the relay's root: ``/yws/<doc>``.
YWS_PREFIX = "/yws/"
#: The URL parameter a stock client's ``params: {token}`` becomes.
TOKEN_PARAM = "token"


def take_token(scope: Scope) -> str | None:
    """The ``token`` URL parameter, removed from ``scope`` in place, so
    uvicorn's ``WebSocket ... [accepted]`` line and every later reader of
    the scope see the URL without it."""
    raw = scope.get("query_string", b"")
    if not raw:
        return None
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    tokens = [value for name, value in pairs if name == TOKEN_PARAM]
    if tokens:
        scope["query_string"] = urlencode([(n, v) for n, v in pairs if n != TOKEN_PARAM]).encode("latin-1")
    return tokens[-1] if tokens else None


def yws_doc(scope: Scope) -> str | None:
    """The room of a ``/yws/<room>`` websocket (percent-decoded, as the
    server received it), or None for any other request. The room becomes a
    document id in :class:`.yws.YwsCodec` (:func:`yrelay.storage.keys.room_doc_id`)."""
    if scope["type"] != "websocket":
        return None
    routed = scope.get("path_params", {}).get("doc")
    if routed is None:
        path = get_route_path(scope)
        routed = path[len(YWS_PREFIX) :] if path.startswith(YWS_PREFIX) else None
    return None if routed is None else _undecodable_left_out(scope, routed)


#: What a U+FFFD the URL itself holds looks like in a raw path (escaped, or
#: as its UTF-8 bytes).
_REPLACEMENT = ("%EF%BF%BD", "\ufffd".encode())


def _undecodable_left_out(scope: Scope, room: str) -> str:
    """``room``, or, when its URL escaped bytes that are not UTF-8 (``%FF``),
    the room with those U+FFFD as lone surrogates: no document id names it.

    The server decodes the path with U+FFFD for each such byte, so every
    room like ``%FF``, ``%FE`` or ``%C3`` would otherwise share the
    document of the room U+FFFD (``%EF%BF%BD``). A replacement character
    that the raw path does not spell is one of those."""
    if "\ufffd" not in room:
        return room
    raw = scope.get("raw_path") or b""
    spelled = raw.upper().count(_REPLACEMENT[0].encode()) + raw.count(_REPLACEMENT[1])
    return room if room.count("\ufffd") <= spelled else room.replace("\ufffd", "\udcff")


class YwsEndpoint:
    """The endpoint as a raw ASGI app (as :class:`~.ws_endpoint.SyncEndpoint`);
    ``services`` returns what the running relay gives a connection, or None."""

    def __init__(self, services: Callable[[], Services | None]):
        self._services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = take_token(scope)  # first: nothing may log the URL with it
        websocket = WebSocket(scope, receive, send)
        services = self._services()
        if services is None:
            await websocket.close(CLOSE_TRY_AGAIN)
            return
        connection = Connection(websocket, services, YWS_SUBPROTOCOL)
        connection.speak(YwsCodec(connection, yws_doc(scope) or "", token))
        await connection.run()


__all__ = ["TOKEN_PARAM", "YWS_PREFIX", "YwsEndpoint", "take_token", "yws_doc"]
