"""The websocket protocol uvicorn runs for yrelay, and its compression.

Browsers offer permessage-deflate on every connection, and uvicorn accepts it
by default, with context takeover: the server then keeps a zlib compressor
(and after the first compressed message from the client, a decompressor)
for the whole life of every connection, idle or not. Measured at 10,000
idle connections (BENCHMARKS.md, "Issue 20: idle memory") that was about
half of yrelay's memory per connection. yrelay's frames are small JSON
frames of a few base64 updates, so compression is off by default
(``ws_compression``). Turned on, it is deflate *without* context takeover
either way and with small windows: nothing of zlib is kept between
messages, so an idle connection costs what it costs uncompressed, and each
message pays for a compressor of its own (CPU, measured in the same
section).
"""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.protocol import State
from websockets.server import ServerProtocol

from .lean import Flag, Inbox
from .prepared_frames import PREPARED_FRAMES

#: uvicorn's ``ws`` choices a deployment may pick (``ws_implementation``).
IMPLEMENTATIONS = ("websockets-sansio", "websockets", "wsproto")
#: zlib window (2**bits bytes) and memLevel of the per-message compressor:
#: a frame of yrelay is mostly base64, which gains little from a longer window.
WINDOW_BITS = 12
MEM_LEVEL = 5


def deflate_without_context() -> ServerPerMessageDeflateFactory:
    """permessage-deflate that keeps nothing between messages (RFC 7692: a
    server may ask for ``client_no_context_takeover`` and declare
    ``server_no_context_takeover`` whether or not the client offered them)."""
    return ServerPerMessageDeflateFactory(server_no_context_takeover=True, client_no_context_takeover=True,
                                          server_max_window_bits=WINDOW_BITS, client_max_window_bits=WINDOW_BITS,
                                          compress_settings={"memLevel": MEM_LEVEL})


class YrelayWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, leaner per connection:
    :func:`deflate_without_context` when ``ws_per_message_deflate`` is on
    (uvicorn's own keeps contexts); its receive queue and ``writable`` event
    without their empty deques (:mod:`.lean`); and the handshake's request and
    response (headers parsed twice over, ~3 kB) let go once the socket is
    accepted: uvicorn reads them only until then."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        if config.ws_per_message_deflate:
            self.conn = ServerProtocol(extensions=[deflate_without_context()], max_size=config.ws_max_size,
                                       logger=logging.getLogger("uvicorn.error"))
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag()  # type: ignore[assignment]
        self.writable.set()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None and not self.conn.extensions:  # refused, or compressed: every frame the ASGI way
            scope["extensions"][PREPARED_FRAMES] = self.write_prepared

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the writer is bound to this protocol: a cycle the young GC may not reach for long
            scope["extensions"].pop(PREPARED_FRAMES, None)

    def write_prepared(self, frame: bytes) -> bool:
        """Write ``frame`` (from :func:`text_frame`) now, if the socket is open
        and takes it: what ``send`` does for a text message after websockets
        has framed it, for a frame framed once for many sockets. No when
        permessage-deflate was negotiated (the frame would have to be
        compressed) or while uvicorn waits for the socket to drain."""
        if (self.disconnected or not self.handshake_complete or self.close_sent or self.initial_response is not None
                or self.conn.extensions or self.conn.state is not State.OPEN or not self.writable.is_set()
                or self.transport.is_closing()):
            return False
        self.transport.write(frame)
        return True

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.accept" and self.handshake_complete:
            self.request.headers.clear()  # websockets' parser keeps the request until the socket closes
            self.request = self.response = None  # type: ignore[assignment]


def uvicorn_ws_options(implementation: str, compression: bool) -> dict[str, object]:
    """``ws`` and ``ws_per_message_deflate`` for ``uvicorn.Config``."""
    ws: object = YrelayWebSocketProtocol if implementation == "websockets-sansio" else implementation
    return {"ws": ws, "ws_per_message_deflate": compression}
