"""Deadlines and caps for HTTP connections before their request is read.

uvicorn's HTTP protocols start no timer before a connection's first request
is complete (their keep-alive timer runs only between requests), so a socket
that connects and sends nothing, or half a request head, is held for ever:
enough of them use up the process's file descriptors and nothing else gets
in, ``/healthz`` included (the slowloris finding of issue 16). No uvicorn
setting changes that, so this module is uvicorn's httptools protocol with
three additions, passed as ``uvicorn.Config(http=...)`` by
:meth:`yrelay.config.Settings.uvicorn_options` (``yrelay serve``, the
tests' in-process servers and every server process alike):

- **a deadline**: a request's head (and body, if any) must arrive within
  ``header_timeout`` seconds of the connect, or of its first byte on a
  kept-alive connection; otherwise the connection is closed;
- **a cap**: at most ``max_pending_connections`` connections of the process
  may be waiting for their request; one more closes the *oldest* of them
  (a real client sends its request within a round trip, so the oldest
  waiting is the likeliest attacker, and a flood cannot keep newcomers out).
  Only connections that have waited ``EVICT_AFTER`` seconds are closed so:
  a burst of connects is accepted before any of their requests is read, and
  must not close its own first members;
- **a size bound**: a request head over ``max_header_bytes`` is answered 431,
  and so is a websocket upgrade with a line the websockets library would
  refuse (over 8,192 bytes, e.g. a long token in ``Sec-WebSocket-Protocol``):
  uvicorn's websockets protocol queues that library's 431 but never sends
  it, so such a handshake used to hang.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import weakref
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS

log = logging.getLogger(__name__)

#: Seconds between two warnings about the pending-connection cap.
WARN_INTERVAL = 10.0
#: A waiting connection is closed for the cap only after waiting this long.
EVICT_AFTER = 1.0

_Pending = OrderedDict["GuardedHttpToolsProtocol", None]
#: Connections waiting for their request, oldest first, per uvicorn server.
_pending: weakref.WeakKeyDictionary[ServerState, _Pending] = weakref.WeakKeyDictionary()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request deadline, a cap on
    connections waiting for their request, and a bound on the head's size.
    Subclassed by :func:`guarded_protocol` with the three settings."""

    header_timeout: float = 10.0
    max_pending: int = 1024
    max_header_bytes: int = 16 * 1024
    _last_warning = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = False  # for a request: on the deadline, in the pending list
        self._waiting_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_done = False

    # uvicorn's own override narrows asyncio's BaseTransport to Transport (its ignore): this one keeps its signature.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._request_received()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_done or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self.max_header_bytes and self._head_bytes > self.max_header_bytes:
            self._refuse(431, f"request head over {self.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes, self._head_done = 0, False
        self._await_request()  # a kept-alive connection's next request

    def on_headers_complete(self) -> None:
        self._head_done = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._request_received()
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        if (
            len(self.scope["method"]) + len(self.url) + 10 > MAX_LINE_LENGTH
            or len(self.headers) > MAX_NUM_HEADERS
            or any(len(name) + len(value) + 2 > MAX_LINE_LENGTH for name, value in self.headers)
        ):
            self._refuse(
                431,
                f"a websocket handshake line over {MAX_LINE_LENGTH} bytes, or over "
                f"{MAX_NUM_HEADERS} headers; send a long token in 'hello' instead",
            )
            return
        self._request_received()
        super().handle_websocket_upgrade()

    def _await_request(self) -> None:
        """Start the deadline and join the waiting connections (closing the
        oldest waiting one when the cap is reached)."""
        if self._waiting or self.transport.is_closing():
            return
        self._waiting, self._waiting_since = True, self.loop.time()
        if self.header_timeout > 0:
            self._deadline = self.loop.call_later(self.header_timeout, self._expire)
        pending = _pending.setdefault(self.server_state, OrderedDict())
        pending[self] = None
        while self.max_pending and len(pending) > self.max_pending:
            oldest = next(iter(pending))
            if self._waiting_since - oldest._waiting_since < EVICT_AFTER:
                break  # a burst of connects, not yet read: over the cap for a moment
            oldest._warn_cap(len(pending))
            oldest._close()

    def _request_received(self) -> None:
        if not self._waiting:
            return
        self._waiting = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        pending = _pending.get(self.server_state)
        if pending is not None:
            pending.pop(self, None)

    def _expire(self) -> None:
        self._deadline = None
        self._close()

    def _close(self) -> None:
        self._request_received()
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with a short plain-text reason and close."""
        body = message.encode("ascii", "replace")
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: ",
                    str(len(body)).encode(),
                    b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self._close()

    def _warn_cap(self, waiting: int) -> None:
        now = time.monotonic()
        if now - GuardedHttpToolsProtocol._last_warning >= WARN_INTERVAL:
            GuardedHttpToolsProtocol._last_warning = now
            log.warning(
                "%d connections are waiting for their request (max_pending_connections): "
                "closing the oldest ones (a slowloris attack, or raise the cap)",
                waiting,
            )


@functools.cache
def guarded_protocol(header_timeout: float, max_pending: int, max_header_bytes: int) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these limits."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "header_timeout": header_timeout,
            "max_pending": max_pending,
            "max_header_bytes": max_header_bytes,
        },
    )
