"""Deliver frames framed once for many sockets, and the way to write them.

A fan-out batch's deliver frame is encoded once for every subscriber
(:meth:`yrelay.app.wire.ws.JsonCodec.deliver`); websockets then framed it again for
each socket, and the frame went through Starlette's, uvicorn's and
websockets' send paths per reader. A server frame is not masked, so the
same bytes serve every socket: yrelay's uvicorn protocol
(:mod:`.ws_protocol`) offers a writer for them in the ASGI scope's
extensions, and the fan-out's dispatch writes a caught-up subscriber's
frame with it at once, without waking its pump (BENCHMARKS.md, "Issue 20:
hot p99"). Any other server, or a connection that negotiated compression,
goes the ASGI way as before.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any, cast

#: The ASGI scope extension through which the app writes a text frame framed
#: once for many sockets (:func:`text_frame`) straight to this connection's
#: transport; a callable ``(frame: bytes) -> bool``, False when it cannot
#: now (not open, closing, the socket's buffer is full, compression is on),
#: and the app then sends the ASGI way.
PREPARED_FRAMES = "yrelay.prepared_frames"
#: Writes a prepared frame now, or says it cannot (False).
WritePrepared = Callable[[bytes], bool]


def prepared_writer(scope: Mapping[str, Any], send: object) -> WritePrepared | None:
    """The server's prepared-frame writer for this connection, if it offers
    one and ``send`` is the server's own: ASGI middleware that wraps ``send``
    (an embedding app's telemetry, say) would not see what the writer sends,
    so then every frame goes through ``send``."""
    write = (scope.get("extensions") or {}).get(PREPARED_FRAMES)
    owner = getattr(write, "__self__", None)
    if owner is None or getattr(send, "__self__", None) is not owner:
        return None
    return cast(WritePrepared, write)  # the server's own writer (its __self__ is send's)


def text_frame(text: str) -> bytes:
    """An unfragmented, unmasked websocket text frame (RFC 6455 5.2) of
    ``text``, as a server sends it: the same bytes serve every reader."""
    payload = text.encode()
    size = len(payload)
    if size < 126:
        header = struct.pack("!BB", 0x81, size)
    elif size < 1 << 16:
        header = struct.pack("!BBH", 0x81, 126, size)
    else:
        header = struct.pack("!BBQ", 0x81, 127, size)
    return header + payload


__all__ = ["PREPARED_FRAMES", "WritePrepared", "prepared_writer", "text_frame"]
