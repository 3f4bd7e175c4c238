"""``/yws/{doc}``: the y-websocket protocol, so that an existing Yjs app's
``new WebsocketProvider('wss://host/yws', doc, ydoc)`` works unchanged.

One connection serves one document with binary y-protocols messages
(:mod:`yrelay.yjs.yprotocol`). Its credentials go through the same
:class:`~.handshake.Handshake` as ``/ws`` (origin allowlist, token as a
subprotocol ``yrelay.auth.<token>`` next to ``yrelay.yws``) and, for stock
clients that can only add URL parameters, ``?token=``, taken out of the
request before anything can log it (:mod:`.yws_endpoint`, docs/security.md).

* A codec of the connection core (:class:`.peer.Codec`): the one receive
  loop, the limits and the token checks are :class:`.connection.Connection`'s,
  the deliveries a :class:`.subscription.Subscription`'s, untracked: it
  waits for the client's sync step 1 and answers it with step 2 = exactly
  what its state vector lacks, from snapshot + stream in an engine worker
  (:func:`.resync.sync_answer`), then the server's own step 1; after the
  answer, every later entry of the stream as an update (its own left out).
* Step 2 and update go through the same :class:`~.write_path.WritePath` as
  ``/ws`` updates (rates, validation, causal admission, in-flight bytes,
  the appender); others see them only from the stream. Such a client never
  resends an update, so one that cannot be stored closes the socket: the
  client's reconnect sync sends it again. A step 2 is a sync push (only its
  causally ready part is stored, as for ``update {sync: true}``).
* A read-only token's updates are answered with y-protocols' permission
  denied and never stored; awareness goes through the presence relay, so
  ``/ws`` and ``/yws`` clients see each other.
* Nothing is tracked: these connections never pin a stream. What would make
  a ``/ws`` client resync closes the socket instead (the stock client's
  reconnect sync, step 1 / step 2 both ways, brings both sides back): GC
  trimmed past it (4410), the stream went back after a failover (1013), the
  document was deleted (4404) or cannot be read (1011).
* The room of ``/yws/<room>`` may be any name: it maps one-to-one to a
  document id (:func:`yrelay.storage.keys.room_doc_id`); one no id can hold is
  refused once and held open (stock clients reconnect after a close).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from yrelay.app.core.connection import CLOSE_TRY_AGAIN, Connection
from yrelay.app.core.handshake import CutOff
from yrelay.app.core.peer import FrameKey
from yrelay.app.fanout import Batch
from yrelay.app.limits import Refusal
from yrelay.protocol import ErrorCode, ProtocolError, ResyncReason, Update
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.keys import InvalidDocumentId, room_doc_id
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry
from yrelay.yjs import yprotocol
from yrelay.yjs.yprotocol import AwarenessMessage, QueryAwarenessMessage, SyncMessage, SyncStep, YProtocolError

log = logging.getLogger(__name__)

#: The subprotocol a client offers next to ``yrelay.auth.<token>``.
YWS_SUBPROTOCOL = "yrelay.yws"
#: The header of one message around its payload: type, step, length (at most 8 bytes).
MESSAGE_OVERHEAD = 10

CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_TOO_BIG = 1009
#: The document's stream cannot be read.
CLOSE_DOCUMENT_FAILED = 1011
#: The stream lost entries this connection may hold (a failover): the
#: reconnect sync (step 1 / step 2 both ways) gives them back.
CLOSE_REWOUND = 1013
REWOUND_REASON = "storage lost entries; reconnect to resync"
#: The document was deleted (DELETE /ops/docs/{doc}).
CLOSE_DELETED = 4404
#: GC trimmed entries this connection had not been sent.
CLOSE_TRIMMED = 4410
#: An update was not stored (the reason names why): reconnect, and the sync sends it again.
CLOSE_NOT_STORED = 4500
#: The token may not read this document.
CLOSE_FORBIDDEN = 4403
#: An awareness update of no client: what a refused socket hears while it
#: stays open (y-protocols applies it as a no-op).
EMPTY_AWARENESS = yprotocol.awareness(b"\x00")

#: How a refusal that is not about one update ends the connection.
_CLOSES = {
    ErrorCode.DOCUMENT_DELETED: (CLOSE_DELETED, "document_deleted: the document was deleted"),
    ErrorCode.DOCUMENT_UNAVAILABLE: (CLOSE_DOCUMENT_FAILED, "document unavailable; reconnect"),
    ErrorCode.UNAVAILABLE: (CLOSE_TRY_AGAIN, "storage unavailable; reconnect"),
    ErrorCode.INTERNAL_ERROR: (CLOSE_DOCUMENT_FAILED, "internal error; reconnect"),
    ErrorCode.MALFORMED_FRAME: (CLOSE_PROTOCOL_ERROR, "invalid state vector"),
}
#: How a resync a ``/ws`` client would make ends the connection.
_RESYNCS = {
    ResyncReason.TRIMMED: (CLOSE_TRIMMED, "history trimmed past this connection; reconnect to resync"),
    ResyncReason.AHEAD: (CLOSE_REWOUND, REWOUND_REASON),
}


class YwsCodec:
    """One y-websocket client on one document (the room of its URL)."""

    __slots__ = ("connection", "services", "unnamed", "doc", "_token", "_held", "_clock", "_last_sent")

    subprotocol = YWS_SUBPROTOCOL
    tracked = False
    hello_first = False
    writes_now = False

    def __init__(self, connection: Connection, room: str, token: str | None):
        self.connection = connection
        self.services = connection.services
        #: Why no document id can name the room (then ``doc`` is empty and nothing is served).
        self.unnamed: str | None = None
        try:
            doc = room_doc_id(room)  # any room name an app picks: docs/web.md#room-names
        except InvalidDocumentId as exc:
            doc, self.unnamed = "", str(exc)
        self.doc = doc
        self._token = token
        self._held = False
        self._clock = 0
        #: When the socket was last sent something (loop time): a silent one gets its awareness echoed.
        self._last_sent = asyncio.get_running_loop().time()

    # ------------------------------------------------------------ inbound

    async def opened(self) -> None:
        """Authenticate (token from the subprotocol or ``?token=``), check
        the document, open an untracked session subscribed to it; else say why."""
        connection = self.connection
        principal = await connection.authenticate(self._token)
        if principal is None:
            return
        if self.unnamed is not None:
            await self._hold(self.unnamed)
            return
        if not principal.can_read(self.doc):
            await connection.cut_off(
                CutOff("this token may not read this document", ErrorCode.FORBIDDEN, CLOSE_FORBIDDEN)
            )
            return
        connection.open("yws-" + secrets.token_hex(8), principal)  # dedup and presence identity; never tracked
        try:  # the subject's live-subscription limit counts this connection as one
            await connection.subscribe(self.doc)
        except ProtocolError as error:
            await connection.close(CLOSE_TRY_AGAIN, error.message)

    async def _hold(self, reason: str) -> None:
        """Refuse a room no document id can name, once, for good.

        y-websocket 1.x and 2.x reconnect after any close (3.x stops on
        4400-4499 only), every 2.5 s at most: a close would be a loop of
        refusals. So the socket stays open, told y-protocols' permission
        denied once, synced with nothing, and sent an empty awareness update
        whenever ``yws_echo_after`` passed (y-websocket closes, then
        reconnects, a socket silent for 30 s). Its messages are read and
        dropped, paced as before a token is checked. It is closed as any
        other once its token expires or is revoked: a held socket does not
        outlive the token that opened it.
        """
        log.info("/yws room refused: %s", reason)
        self._held = True  # open without a session (Connection.speak): the timer still checks its token
        await self._send(yprotocol.permission_denied(reason))
        self.connection.spawn(self._keep_alive())

    async def _keep_alive(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected, RuntimeError, OSError):
            while True:
                await asyncio.sleep(self.services.settings.yws_echo_after)
                await self._send(EMPTY_AWARENESS)

    async def receive(self, message: Mapping[str, Any]) -> None:
        if self._held:
            return
        connection = self.connection
        data = message.get("bytes")
        if data is None:
            await connection.close(CLOSE_UNSUPPORTED_DATA, "y-websocket messages are binary")
            return
        if len(data) > self.services.settings.max_update_bytes + MESSAGE_OVERHEAD:
            await connection.close(CLOSE_TOO_BIG, f"message exceeds {self.services.settings.max_update_bytes} bytes")
            return
        try:
            parsed = yprotocol.decode(data)
        except YProtocolError as exc:
            await connection.close(CLOSE_PROTOCOL_ERROR, f"not a y-protocols message: {exc}")
            return
        if isinstance(parsed, SyncMessage):
            await self._sync(parsed)
        elif isinstance(parsed, AwarenessMessage):
            await self._awareness(parsed.update)
        elif isinstance(parsed, QueryAwarenessMessage):
            await connection.query_awareness(self.doc)

    async def _sync(self, message: SyncMessage) -> None:
        if message.step is SyncStep.STEP1:
            await self.connection.sync(self.doc, message.payload)
            return
        if message.payload == b"\x00\x00":  # an empty update (the usual answer to our step 1)
            return
        frame = Update(
            doc=self.doc,
            clock=self._clock,
            update="",
            sync=message.step is SyncStep.STEP2,
            part=None,
            parts=None,
        )
        self._clock += 1
        await self.connection.write(frame, message.payload)

    async def _awareness(self, update: bytes) -> None:
        """Relay presence; one over a limit is dropped (a stock client
        cannot read why, and renews its state anyway)."""
        try:
            await self.connection.awareness(self.doc, update)
        except ProtocolError as error:
            log.debug("awareness update dropped: %s", error.message)
            return
        if asyncio.get_running_loop().time() - self._last_sent >= self.services.settings.yws_echo_after:
            await self._send(yprotocol.awareness(update))  # keeps a lone client's socket alive (y-websocket's way)

    # ------------------------------------------------------------ outbound

    async def _send(self, data: bytes) -> None:
        await self.connection.send(data)
        self._last_sent = asyncio.get_running_loop().time()

    async def refuse_connection(self, refusal: Refusal) -> None:
        """Accepted only to say why, in the close (no JSON error frame: this client reads y-protocols)."""
        websocket = self.connection.websocket
        with contextlib.suppress(Exception):
            await websocket.accept()
            await websocket.close(refusal.close_code, refusal.error.message[:120])

    async def ending(self, cut: CutOff) -> None:
        """A token refused or a document it may not read: y-protocols' permission denied first."""
        if cut.code in (ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN):
            await self.connection.websocket.send_bytes(yprotocol.permission_denied(cut.reason))

    async def refused(self, error: ProtocolError) -> None:
        """A read-only token's update: permission denied (the socket stays);
        an update not stored: close (the reconnect sync sends it again);
        whatever ends the document's deliveries: close with its code."""
        self.services.metrics.rejected(error.code.value)
        if error.code is ErrorCode.FORBIDDEN:
            await self._send(yprotocol.permission_denied(error.message))
            return
        if error.clock is not None or error.code not in _CLOSES:
            await self.connection.close(CLOSE_NOT_STORED, f"{error.code.value}: {error.message}")
            return
        code, reason = _CLOSES[error.code]
        await self.connection.close(code, reason)

    async def resync_required(self, doc: str, reason: ResyncReason) -> None:
        code, text = _RESYNCS.get(reason, (CLOSE_REWOUND, REWOUND_REASON))
        await self.connection.close(code, text)

    async def sync_answer(self, doc: str, offset: StreamId, diff: bytes, state_vector: bytes) -> int:
        await self._send(yprotocol.sync_step2(diff))
        await self._send(yprotocol.sync_step1(state_vector))  # the client answers with what we lack
        return len(diff)

    async def deliver(self, doc: str, entries: list[Entry], key: FrameKey, batch: Batch | None) -> int:
        for entry in entries:
            await self._send(yprotocol.sync_update(entry.update))
        return sum(len(entry.update) for entry in entries)

    def deliver_now(self, doc: str, entries: list[Entry], key: FrameKey, batch: Batch) -> bool:
        return False

    async def presence(self, doc: str, update: bytes) -> None:
        await self._send(yprotocol.awareness(update))

    async def subscribed(self, doc: str, offset: StreamId, window: WindowDigest | None) -> None:
        """Never sent: an untracked subscription starts with the client's sync."""

    async def snapshot(self, doc: str, offset: StreamId, update: bytes) -> int:
        """Never sent: the sync answer carries the snapshot's content."""
        return 0

    async def synced(self, doc: str, offset: StreamId) -> None:
        """y-protocols has no such message: the sync answer is it."""

    async def unsubscribed(self, doc: str) -> None:
        """A ``/yws`` connection is its one subscription."""

    async def appended(
        self, doc: str, clock: int, entry_id: str | None, duplicate: bool, dropped: dict[int, list[tuple[int, int]]]
    ) -> None:
        """y-protocols has no answer to an update: it is stored, or the socket closes."""


__all__ = ["CLOSE_NOT_STORED", "YWS_SUBPROTOCOL", "YwsCodec"]
