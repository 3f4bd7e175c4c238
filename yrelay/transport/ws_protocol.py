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

import asyncio
import functools
import logging
from typing import Any

from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.protocol import State
from websockets.server import ServerProtocol

from yrelay.transport.buckets import DebtBucket
from yrelay.transport.frame_walker import FrameWalker
from yrelay.transport.lean import Flag, Inbox
from yrelay.transport.prepared_frames import PREPARED_FRAMES
from yrelay.transport.receiving import RECEIVING

#: The ASGI scope extension through which the app says the connection
#: authenticated: its messages may then be as large as ``ws_max_size``
#: (before: the protocol's ``preauth_max_size``). Its value is the protocol;
#: call :func:`trust`.
TRUST = "yrelay.trust"
#: Messages parsed ahead of the app at most: the rest of a read stays raw
#: bytes until the app has read them, and the socket is not read meanwhile.
PARSED_AHEAD = 8
#: Frames handed to the parser at a time (:mod:`.frame_walker` finds where they end).
FEED_FRAMES = 8
#: Frames (of any kind) parsed per event-loop turn; the rest on a later turn.
FRAMES_PER_TURN = 32
#: Websocket pings and pongs per second, and at once: the library answers
#: a ping itself, so these never reach the app's pacing (browsers send none;
#: client libraries one every 20 s or so).
CONTROL_FRAMES_PER_SECOND = 10.0
CONTROL_FRAMES_BURST = 20
#: Continuation frames that cost one ping of that rate (a message's fragments
#: are parsed one by one, and only whole messages reach the app's pacing:
#: 200 fragments per second past a burst of 400).
FRAGMENTS_PER_CONTROL = 20
#: Frames one message may arrive in, and what a fragment costs besides its bytes.
MAX_FRAGMENTS = 1024
FRAGMENT_OVERHEAD = 64
CLOSE_MESSAGE_TOO_BIG = 1009
#: Bytes read after the server sent its close, waiting for the peer's
#: answer; a peer that sends more (a flood that goes on) is disconnected.
DISCARD_AFTER_CLOSE = 256 * 1024
#: Close code of a connection closed for the process's ``max_receiving_bytes``.
CLOSE_TRY_AGAIN_LATER = 1013

#: zlib window (2**bits bytes) and memLevel of the per-message compressor:
#: a frame of yrelay is mostly base64, which gains little from a longer window.
WINDOW_BITS = 12
MEM_LEVEL = 5


def deflate_without_context() -> ServerPerMessageDeflateFactory:
    """permessage-deflate that keeps nothing between messages (RFC 7692: a
    server may ask for ``client_no_context_takeover`` and declare
    ``server_no_context_takeover`` whether or not the client offered them)."""
    return ServerPerMessageDeflateFactory(
        server_no_context_takeover=True,
        client_no_context_takeover=True,
        server_max_window_bits=WINDOW_BITS,
        client_max_window_bits=WINDOW_BITS,
        compress_settings={"memLevel": MEM_LEVEL},
    )


class YrelayWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, leaner per connection and
    bounded in what it holds and parses for a client (docs/security.md#frames):

    - :func:`deflate_without_context` when ``ws_per_message_deflate`` is on
      (uvicorn's own keeps contexts); its receive queue and ``writable``
      event without their empty deques (:mod:`.lean`); the handshake's
      request and response (headers parsed twice over, ~3 kB) let go once
      the socket is accepted: uvicorn reads them only until then;
    - until the app says the connection authenticated (:data:`TRUST`), a
      message may be at most ``preauth_max_size`` bytes: a frame header
      declaring more closes the socket (1009) before its payload is read;
    - a read is parsed :data:`FEED_FRAMES` frames at a time (a large frame
      whole; :mod:`.frame_walker` finds where they end), only while fewer than
      :data:`PARSED_AHEAD` messages wait for the app, at most
      :data:`FRAMES_PER_TURN` frames of any kind per event-loop turn, and
      websocket pings and pongs (which the library answers itself, never
      reaching the app or its pacing) at :data:`CONTROL_FRAMES_PER_SECOND`:
      past any of these the rest of the read stays raw bytes and the socket
      is not read until it is parsed (uvicorn's own parses all of a read at
      once, so one read of tiny frames held the event loop);
    - a message in at most :data:`MAX_FRAGMENTS` frames (1009 past it);
    - what is being received (partial frames, fragments, unparsed bytes)
      is booked in the process's :data:`~.receiving.RECEIVING`; past
      ``max_receiving`` the connection holding the most is closed (1013);
    - once the server sent its close, frames are walked, not parsed, for
      the peer's close (the bytes that wait included), and at most
      :data:`DISCARD_AFTER_CLOSE` bytes are read without it: a flood that
      goes on is disconnected instead of parsed and discarded until the
      close timeout.

    :func:`yrelay_protocol` makes the class with the two limits."""

    preauth_max_size: int = 64 * 1024
    max_receiving: int = 128 * 1024 * 1024

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        if config.ws_per_message_deflate:
            self.conn = ServerProtocol(
                extensions=[deflate_without_context()],
                max_size=config.ws_max_size,
                logger=logging.getLogger("uvicorn.error"),
            )
        if self.preauth_max_size and config.ws_max_size:
            self.conn.max_message_size = min(self.preauth_max_size, config.ws_max_size)
        # uvicorn declares these as asyncio's Queue and Event; the lean ones
        # (.lean) offer the same calls uvicorn makes, at less cost per frame.
        self.queue = Inbox()  # type: ignore[assignment]
        self.writable = Flag()  # type: ignore[assignment]
        self.writable.set()
        self._unparsed = b""  # the rest of a read, parsed once the app caught up
        self._resume: asyncio.TimerHandle | asyncio.Handle | None = None  # parses the rest later
        self._walker = FrameWalker()  # where the client's frames end, before they are parsed
        self._turn_frames = 0  # frames parsed in this event-loop turn
        self._controls: DebtBucket | None = None  # pings and pongs (made with the first)
        self._fragments = 0  # frames of the message being received
        self._message_bytes = 0  # and its bytes so far (with a per-fragment overhead)
        self._held = 0  # bytes this connection has booked in RECEIVING
        self._discarded = 0  # bytes read after the close was sent

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is None:
            return
        scope["extensions"][TRUST] = self  # the protocol, not a bound method: 64 bytes less per connection
        if not self.conn.extensions:  # refused, or compressed: every frame the ASGI way
            scope["extensions"][PREPARED_FRAMES] = self.write_prepared

    def trust(self) -> None:
        """The connection authenticated: messages up to ``ws_max_size``."""
        self.conn.max_message_size = self.config.ws_max_size

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._unparsed = b""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self._book(0)
        scope = getattr(self, "scope", None)
        if scope is not None:  # bound to this protocol: a cycle the young GC may not reach for long
            scope["extensions"].pop(PREPARED_FRAMES, None)
            scope["extensions"].pop(TRUST, None)

    # ------------------------------------------------------------ reading

    def data_received(self, data: bytes) -> None:
        if self._unparsed or self._resume is not None:  # arrived before reading paused: after what waits
            self._unparsed += data
            if self._resume is None:
                self._continue()
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` within this turn's budgets; keep the rest raw and stop reading."""
        if self.close_sent and self.handshake_complete:
            self._await_close(data)
            return
        self._turn_frames = 0
        position, size = 0, len(data)
        while position < size:
            if not self.close_sent:
                if self.queue.qsize() >= (PARSED_AHEAD if not self.conn.extensions else 1):
                    break  # receive() parses on once the app has read them (compressed: one, it may inflate)
                wait = self._controls.wait() if self._controls is not None else 0.0
                if wait > 0 or self._turn_frames >= FRAMES_PER_TURN:
                    self._resume = (
                        self.loop.call_later(wait, self._resumed) if wait > 0 else self.loop.call_soon(self._resumed)
                    )
                    break
            if self.handshake_initiated:  # frames: a few at a time, a large one whole
                end, _ = self._walker.walk(data, position, FEED_FRAMES)
            else:  # the upgrade request (uvicorn hands it over in one piece)
                end = size
            chunk = data[position:end]
            position = end
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
        if (self._unparsed or self._resume is not None) and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        self._book(len(self.conn.reader.buffer) + self._message_bytes + len(self._unparsed))
        if self.handshake_complete:
            RECEIVING.enforce(self.max_receiving)

    def _await_close(self, data: bytes) -> None:
        """The server sent its close: only the peer's close is wanted now.
        Frames are walked, not parsed (a flood that goes on would cost as
        much to discard), a turn's worth at a time; the peer's close ends
        the connection, and so does a peer that sends
        :data:`DISCARD_AFTER_CLOSE` bytes without it."""
        end, _ = self._walker.walk(data, 0, FRAMES_PER_TURN)
        self._discarded += end
        if self._walker.close_seen or self._discarded > DISCARD_AFTER_CLOSE:
            self._unparsed = b""
            self._book(0)
            if self.close_timer is not None:
                self.close_timer.cancel()
                self.close_timer = None
            self.transport.close()
            return
        self._unparsed = data[end:]
        if self._unparsed:
            self._resume = self.loop.call_soon(self._resumed)
            if not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()
        self._book(len(self._unparsed))

    def _resumed(self) -> None:
        self._resume = None
        self._continue()

    def _continue(self) -> None:
        """Parse what waits, and read the socket again once nothing does."""
        if self._unparsed and self._resume is None and not self.transport.is_closing():
            data, self._unparsed = self._unparsed, b""
            self._feed(data)
        if (
            self.read_paused
            and (self.queue.empty() or self.close_sent)
            and not self._unparsed
            and self._resume is None
            and not self.transport.is_closing()
        ):
            self.read_paused = False
            self.transport.resume_reading()

    # Every frame counts towards the turn; pings and pongs also against their
    # rate; fragments of one message are counted and bounded.

    def handle_text(self, event: Any) -> None:
        self._turn_frames += 1
        self._start_message(event)
        super().handle_text(event)

    def handle_bytes(self, event: Any) -> None:
        self._turn_frames += 1
        self._start_message(event)
        super().handle_bytes(event)

    def handle_cont(self, event: Any) -> None:
        self._turn_frames += 1
        self._fragments += 1
        self._control_bucket().spend(1 / FRAGMENTS_PER_CONTROL)  # fragments are cheap to send, not to parse
        if self._fragments > MAX_FRAGMENTS and not self.close_sent:
            self.frames = []
            self._message_bytes = 0
            self.conn.fail(CLOSE_MESSAGE_TOO_BIG, f"a message in more than {MAX_FRAGMENTS} frames")
            self.handle_parser_exception()
            return
        self._message_bytes = 0 if event.fin else self._message_bytes + len(event.data) + FRAGMENT_OVERHEAD
        super().handle_cont(event)

    def handle_ping(self) -> None:
        self._control_frame()
        super().handle_ping()

    def handle_pong(self, event: Any) -> None:
        self._control_frame()
        super().handle_pong(event)

    def _control_frame(self) -> None:
        self._turn_frames += 1
        self._control_bucket().spend(1)

    def _control_bucket(self) -> DebtBucket:
        if self._controls is None:
            self._controls = DebtBucket(CONTROL_FRAMES_PER_SECOND, CONTROL_FRAMES_BURST)
        return self._controls

    def _start_message(self, event: Any) -> None:
        self._fragments = 0 if event.fin else 1
        self._message_bytes = 0 if event.fin else len(event.data) + FRAGMENT_OVERHEAD

    def _book(self, held: int) -> None:
        """This connection now holds ``held`` bytes being received."""
        if held != self._held:
            self._held = held
            RECEIVING.book(self, held)

    def refuse_receiving(self) -> None:
        """The process receives too much and this connection holds the most: close it (1013)."""
        self._unparsed = b""
        self._held = 0
        if self.transport.is_closing():
            return
        if self.conn.state is State.OPEN:
            self.conn.fail(CLOSE_TRY_AGAIN_LATER, "the server is receiving too much; try again later")
            self.handle_parser_exception()
        else:
            self.transport.close()

    def keepalive_timeout(self) -> None:
        """uvicorn's keepalive gave up on the pong of its ping: unless the
        peer's frames wait unread (the connection is read slowly, by its
        rates: its pong is behind them) while it still reads what the server
        sends; then the pong gets another period. A closed connection is
        dropped after the close timeout even if the peer reads nothing (a
        close waits for the send buffer to drain)."""
        if (self._unparsed or self._resume is not None or not self.queue.empty()) and self.writable.is_set():
            self.pong_timer = self.loop.call_later(self.ping_timeout or 20.0, self.keepalive_timeout)
            return
        super().keepalive_timeout()
        self.loop.call_later(self.close_timeout, self.transport.abort)

    async def receive(self) -> Any:
        """uvicorn's, and the rest of the last read is parsed once the app
        has read every message parsed before it."""
        message = await self.queue.get()
        if self.queue.empty():
            self._continue()
        return message

    def write_prepared(self, frame: bytes) -> bool:
        """Write ``frame`` (from :func:`text_frame`) now, if the socket is open
        and takes it: what ``send`` does for a text message after websockets
        has framed it, for a frame framed once for many sockets. No when
        permessage-deflate was negotiated (the frame would have to be
        compressed) or while uvicorn waits for the socket to drain."""
        if (
            self.disconnected
            or not self.handshake_complete
            or self.close_sent
            or self.initial_response is not None
            or self.conn.extensions
            or self.conn.state is not State.OPEN
            or not self.writable.is_set()
            or self.transport.is_closing()
        ):
            return False
        self.transport.write(frame)
        return True

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.close" and self.close_sent:  # the peer's answer may wait unparsed
            if self._resume is not None:
                self._resume.cancel()
                self._resume = None
            self._continue()
        if message["type"] == "websocket.accept" and self.handshake_complete:
            self.request.headers.clear()  # websockets' parser keeps the request until the socket closes
            # uvicorn declares them non-optional, but reads them only during the handshake, which is over.
            self.request = self.response = None  # type: ignore[assignment]


@functools.cache
def yrelay_protocol(preauth_max_size: int, max_receiving: int) -> type[YrelayWebSocketProtocol]:
    """The protocol class for ``uvicorn.Config(ws=...)`` with these limits."""
    return type(
        "YrelayWebSocketProtocol",
        (YrelayWebSocketProtocol,),
        {"preauth_max_size": preauth_max_size, "max_receiving": max_receiving},
    )


def trust(websocket: WebSocket) -> None:
    """Tell yrelay's protocol that this connection authenticated: its
    messages may be as large as ``ws_max_size`` from now on. Does nothing
    under any other server. A host app's own websocket routes served by
    yrelay's protocol call it once they know who is connected."""
    protocol = (websocket.scope.get("extensions") or {}).get(TRUST)
    if isinstance(protocol, YrelayWebSocketProtocol):
        protocol.trust()


def uvicorn_ws_options(
    implementation: str, compression: bool, preauth_max_size: int = 64 * 1024, max_receiving: int = 128 * 1024 * 1024
) -> dict[str, object]:
    """``ws`` and ``ws_per_message_deflate`` for ``uvicorn.Config``."""
    ws: object = (
        yrelay_protocol(preauth_max_size, max_receiving) if implementation == "websockets-sansio" else implementation
    )
    return {"ws": ws, "ws_per_message_deflate": compression}
