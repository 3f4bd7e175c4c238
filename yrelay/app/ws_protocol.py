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

import functools
import logging
from typing import Any

from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.protocol import State
from websockets.server import ServerProtocol

from .lean import Flag, Inbox
from .prepared_frames import PREPARED_FRAMES
from .receiving import RECEIVING

#: The ASGI scope extension the app calls once the connection authenticated:
#: its messages may then be as large as ``ws_max_size`` (before: the
#: protocol's ``preauth_max_size``). See :func:`trust`.
TRUST = "yrelay.trust"
#: Messages parsed ahead of the app at most: the rest of a read stays raw
#: bytes until the app has read them, and the socket is not read meanwhile.
PARSED_AHEAD = 8
#: Bytes of a read parsed at a time while small messages are parsed ahead.
FEED_BYTES = 4 * 1024
#: Bytes read after the server sent its close, waiting for the peer's
#: answer; a peer that sends more (a flood that goes on) is disconnected.
DISCARD_AFTER_CLOSE = 256 * 1024
#: Close code of a connection closed for the process's ``max_receiving_bytes``.
CLOSE_TRY_AGAIN_LATER = 1013

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
    """uvicorn's websockets-sansio protocol, leaner per connection and
    bounded in what it holds for a client (docs/security.md#frames):

    - :func:`deflate_without_context` when ``ws_per_message_deflate`` is on
      (uvicorn's own keeps contexts); its receive queue and ``writable``
      event without their empty deques (:mod:`.lean`); the handshake's
      request and response (headers parsed twice over, ~3 kB) let go once
      the socket is accepted: uvicorn reads them only until then;
    - until the app says the connection authenticated (:data:`TRUST`), a
      message may be at most ``preauth_max_size`` bytes: a frame header
      declaring more closes the socket (1009) before its payload is read;
    - a read is parsed :data:`FEED_BYTES` at a time and only while fewer
      than :data:`PARSED_AHEAD` messages wait for the app: one read of
      thousands of tiny frames is not turned into thousands of queued
      messages, and the socket is not read again until the app caught up
      (uvicorn's own parses all of a read at once);
    - what is being received (partial frames, fragments, unparsed bytes)
      is booked in the process's :data:`~.receiving.RECEIVING`; a read that
      takes the process past ``max_receiving`` closes its socket (1013);
    - once the server sent its close, at most :data:`DISCARD_AFTER_CLOSE`
      bytes more are read for the peer's answer: a flood that goes on is
      disconnected instead of parsed and discarded until the close timeout.

    :func:`yrelay_protocol` makes the class with the two limits."""

    preauth_max_size: int = 64 * 1024
    max_receiving: int = 128 * 1024 * 1024

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        if config.ws_per_message_deflate:
            self.conn = ServerProtocol(extensions=[deflate_without_context()], max_size=config.ws_max_size,
                                       logger=logging.getLogger("uvicorn.error"))
        if self.preauth_max_size and config.ws_max_size:
            self.conn.max_message_size = min(self.preauth_max_size, config.ws_max_size)
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag()  # type: ignore[assignment]
        self.writable.set()
        self._unparsed = b""  # the rest of a read, parsed once the app caught up
        self._held = 0  # bytes this connection has booked in RECEIVING
        self._discarded = 0  # bytes read after the close was sent

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is None:
            return
        scope["extensions"][TRUST] = self.trust
        if not self.conn.extensions:  # refused, or compressed: every frame the ASGI way
            scope["extensions"][PREPARED_FRAMES] = self.write_prepared

    def trust(self) -> None:
        """The connection authenticated: messages up to ``ws_max_size``."""
        self.conn.max_message_size = self.config.ws_max_size

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._unparsed = b""
        self._book(0)
        scope = getattr(self, "scope", None)
        if scope is not None:  # bound to this protocol: a cycle the young GC may not reach for long
            scope["extensions"].pop(PREPARED_FRAMES, None)
            scope["extensions"].pop(TRUST, None)

    # ------------------------------------------------------------ reading

    def data_received(self, data: bytes) -> None:
        if self._unparsed:  # a read that arrived before reading paused: after what waits
            data = self._unparsed + data
            self._unparsed = b""
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` while the app keeps up; keep the rest raw and stop reading."""
        if self.close_sent:  # only the peer's close is wanted now, not what a flood still sends
            self._discarded += len(data)
            if self._discarded > DISCARD_AFTER_CLOSE:
                self._unparsed = b""
                self._book(0)
                self.transport.close()
                return
        position, size = 0, len(data)
        while position < size and (self.queue.qsize() < PARSED_AHEAD or self.close_sent):
            step = FEED_BYTES if len(self.conn.reader.buffer) < FEED_BYTES else size  # inside a large frame: all
            chunk = data[position:position + step]
            position += len(chunk)
            self.conn.receive_data(chunk)
            if self.conn.parser_exc is not None:
                self._book(0)
                self.handle_parser_exception()
                return
            self.handle_events()
            if self.transport.is_closing():
                self._book(0)
                return
        self._unparsed = data[position:]
        if self._unparsed and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        held = len(self.conn.reader.buffer) + sum(map(len, self.frames)) + len(self._unparsed)
        if not self._book(held) and self.handshake_complete and not self.close_sent:
            self._refuse_receiving()

    def _book(self, held: int) -> bool:
        """This connection now holds ``held`` bytes being received."""
        within = RECEIVING.change(self._held, held, self.max_receiving)
        self._held = held
        return within

    def _refuse_receiving(self) -> None:
        RECEIVING.closed += 1
        self.conn.fail(CLOSE_TRY_AGAIN_LATER, "the server is receiving too much; try again later")
        self._unparsed = b""
        self._book(0)
        self.handle_parser_exception()

    async def receive(self) -> Any:
        """uvicorn's, and the rest of the last read is parsed once the app
        has read every message parsed before it."""
        message = await self.queue.get()
        if self.queue.empty():
            if self._unparsed:
                data, self._unparsed = self._unparsed, b""
                self._feed(data)
            if self.read_paused and self.queue.empty() and not self._unparsed and not self.transport.is_closing():
                self.read_paused = False
                self.transport.resume_reading()
        return message

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


@functools.lru_cache(maxsize=None)
def yrelay_protocol(preauth_max_size: int, max_receiving: int) -> type[YrelayWebSocketProtocol]:
    """The protocol class for ``uvicorn.Config(ws=...)`` with these limits."""
    return type("YrelayWebSocketProtocol", (YrelayWebSocketProtocol,),
                {"preauth_max_size": preauth_max_size, "max_receiving": max_receiving})


def trust(websocket: WebSocket) -> None:
    """Tell yrelay's protocol that this connection authenticated: its
    messages may be as large as ``ws_max_size`` from now on. Does nothing
    under any other server. A host app's own websocket routes served by
    yrelay's protocol call it once they know who is connected."""
    extension = (websocket.scope.get("extensions") or {}).get(TRUST)
    if extension is not None:
        extension()


def uvicorn_ws_options(implementation: str, compression: bool, preauth_max_size: int = 64 * 1024,
                       max_receiving: int = 128 * 1024 * 1024) -> dict[str, object]:
    """``ws`` and ``ws_per_message_deflate`` for ``uvicorn.Config``."""
    ws: object = (yrelay_protocol(preauth_max_size, max_receiving) if implementation == "websockets-sansio"
                  else implementation)
    return {"ws": ws, "ws_per_message_deflate": compression}
