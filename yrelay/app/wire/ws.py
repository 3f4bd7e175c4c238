"""``/ws``: the yrelay protocol's JSON frames (docs/protocol.md), as a codec
of the connection core (:class:`.peer.Codec`).

Inbound, each text message is one frame (:func:`yrelay.protocol.parse_client_frame`)
turned into one of the connection's commands; outbound, what the core says
becomes frames (:mod:`yrelay.protocol`'s builders). Its policy: sessions
are tracked and acked, the first frame is ``hello``, one socket carries
many documents, and a refusal is an ``error`` frame with a code (the
socket stays open). A fan-out batch's deliver frame is encoded once for
every subscriber sending the same entries, and written at once, framed
once for many sockets, when the server offers that (:mod:`yrelay.transport.prepared_frames`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from yrelay import protocol
from yrelay.app.core.connection import Connection
from yrelay.app.core.handshake import SUBPROTOCOL, CutOff, Opened
from yrelay.app.core.peer import FrameKey
from yrelay.app.core.services import Services
from yrelay.app.fanout import Batch
from yrelay.app.limits import Refusal
from yrelay.app.wire import subscription_set
from yrelay.app.wire.payloads import decode_b64, decode_limited
from yrelay.auth import Authenticator, NoAuthenticator
from yrelay.auth.authenticator import JwtAuthenticator
from yrelay.observability import logs
from yrelay.protocol import (
    Ack,
    Awareness,
    CheckSubscriptions,
    ErrorCode,
    Hello,
    Ping,
    ProtocolError,
    Reconcile,
    ResyncReason,
    Subscribe,
    Sync,
    Unsubscribe,
    Update,
)
from yrelay.reconciliation.digest import Digest
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry
from yrelay.transport.prepared_frames import WritePrepared, text_frame

#: A deliver frame longer than this goes through the pump: a batch keeps its
#: prepared copy beside the encoded text for as long as it is pending, and
#: what the shortcut saves (a few microseconds per socket) is nothing next to
#: the bytes of a large update.
MAX_PREPARED_CHARS = 16 * 1024


class JsonCodec:
    """One ``/ws`` connection's frames; ``write_prepared``: the server's
    writer of prepared frames for it (None: every frame goes the ASGI way)."""

    __slots__ = ("connection", "services", "_write_prepared", "writes_now")

    subprotocol = SUBPROTOCOL
    tracked = True
    hello_first = True

    def __init__(self, connection: Connection, write_prepared: WritePrepared | None = None):
        self.connection = connection
        self.services = connection.services
        self._write_prepared = write_prepared
        self.writes_now = write_prepared is not None

    # ------------------------------------------------------------ inbound

    async def opened(self) -> None:
        """Nothing before ``hello``."""

    async def receive(self, message: Mapping[str, Any]) -> None:
        text = message.get("text")
        if text is None:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, "frames are JSON text, not binary")
        limit = self.services.settings.max_frame_bytes
        if len(text) > limit:
            doc, clock = frame_identity(text)  # bounded by ws_max_size; names the refused update
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame exceeds {limit} bytes; send a larger update in parts (feature update_parts)",
                doc=doc,
                clock=clock,
            )
        frame = protocol.parse_client_frame(text)
        named = logs.doc.set(getattr(frame, "doc", None))  # log lines (and tasks started here) name it
        try:
            await self._dispatch(frame)
        finally:
            logs.doc.reset(named)

    async def _dispatch(self, frame: object) -> None:
        connection = self.connection
        if not isinstance(frame, Hello):
            self._session()
        if isinstance(frame, Update):
            limit = self.services.settings.max_update_bytes
            await connection.write(
                frame, decode_limited(frame.update, limit, ErrorCode.UPDATE_TOO_LARGE, frame.doc, frame.clock)
            )
        elif isinstance(frame, Ack):
            connection.ack(frame.doc, StreamId.parse(frame.offset))
        elif isinstance(frame, Hello):  # the one frame before the session
            if frame.protocol != protocol.PROTOCOL_VERSION:
                raise ProtocolError(
                    ErrorCode.MALFORMED_FRAME,
                    f"protocol {frame.protocol} is not supported; use {protocol.PROTOCOL_VERSION}",
                )
            opened = await connection.hello(frame.session, frame.token)
            if opened is not None:
                await self._send(welcome(self.services, opened))
        elif isinstance(frame, Subscribe):
            await connection.allowance.take_answer()  # its snapshot and catch-up are booked as they are sent
            requested = StreamId.parse(frame.offset) if frame.offset is not None else None
            await connection.subscribe(frame.doc, requested, claimed(frame))
        elif isinstance(frame, Unsubscribe):
            await connection.unsubscribe(frame.doc)
        elif isinstance(frame, Sync):
            await connection.sync(frame.doc, decode_b64(frame.state_vector, frame.doc, None))
        elif isinstance(frame, CheckSubscriptions):
            await connection.pacer.control()
            await self._send(await subscription_set.check(self.services.reads.tracker, self._session(), frame))
        elif isinstance(frame, Reconcile):
            await connection.allowance.take_answer()
            answer = protocol.encode(
                await subscription_set.reconcile(self.services.reads.tracker, self._session(), frame)
            )
            connection.allowance.answered(len(answer))
            await connection.send(answer)
        elif isinstance(frame, Ping):
            await connection.pacer.control()
            await self._send(protocol.pong())
        elif isinstance(frame, Awareness):
            settings = self.services.settings
            await connection.awareness(
                frame.doc,
                decode_limited(
                    frame.update, settings.max_awareness_bytes, ErrorCode.AWARENESS_TOO_LARGE, frame.doc, None
                ),
            )

    def _session(self) -> str:
        """The open session (else ``handshake_required``)."""
        session = self.connection.session
        if session is None:
            raise ProtocolError(ErrorCode.HANDSHAKE_REQUIRED, "send 'hello' first")
        return session

    # ------------------------------------------------------------ outbound

    async def _send(self, frame: dict[str, Any]) -> None:
        await self.connection.send(protocol.encode(frame))

    async def refuse_connection(self, refusal: Refusal) -> None:
        """Accept only to say why not and when to come back, then close
        (browsers cannot read the status of a refused upgrade, only frames
        and close codes)."""
        websocket = self.connection.websocket
        try:
            await websocket.accept()
            await websocket.send_text(protocol.encode(protocol.error(refusal.error)))
            await websocket.close(refusal.close_code)
        except Exception:  # noqa: BLE001 - gone already (whatever the closed socket raises): the refusal is best effort
            pass

    async def ending(self, cut: CutOff) -> None:
        await self.refused(ProtocolError(cut.code, cut.reason, retry_after_ms=cut.retry_after_ms))

    async def refused(self, error: ProtocolError) -> None:
        self.services.metrics.rejected(error.code.value)
        await self._send(protocol.error(error))

    async def subscribed(self, doc: str, offset: StreamId, window: WindowDigest | None) -> None:
        await self._send(protocol.subscribed(doc, str(offset), window.to_wire() if window else None))

    async def snapshot(self, doc: str, offset: StreamId, update: bytes) -> int:
        return await self._send_parts(
            update, lambda part, index, parts: protocol.snapshot(doc, str(offset), part, index, parts)
        )

    async def sync_answer(self, doc: str, offset: StreamId, diff: bytes, state_vector: bytes) -> int:
        return await self._send_parts(
            diff, lambda part, index, parts: protocol.sync_reply(doc, str(offset), part, state_vector, index, parts)
        )

    async def _send_parts(self, data: bytes, frame: Callable[[bytes, int, int], dict[str, Any]]) -> int:
        """``data`` in frames of at most ``chunk_bytes`` each; the base64 bytes sent."""
        parts = protocol.chunks(data, self.services.settings.chunk_bytes)
        sent = 0
        for index, part in enumerate(parts):
            built = frame(part, index, len(parts))
            sent += len(built["update"])
            await self._send(built)
        return sent

    async def synced(self, doc: str, offset: StreamId) -> None:
        await self._send(protocol.synced(doc, str(offset)))

    async def resync_required(self, doc: str, reason: ResyncReason) -> None:
        await self._send(protocol.resync_required(doc, reason))

    async def unsubscribed(self, doc: str) -> None:
        await self._send(protocol.unsubscribed(doc))

    async def appended(
        self, doc: str, clock: int, entry_id: str | None, duplicate: bool, dropped: dict[int, list[tuple[int, int]]]
    ) -> None:
        await self._send(protocol.appended(doc, clock, entry_id, duplicate, dropped))

    async def presence(self, doc: str, update: bytes) -> None:
        await self._send(protocol.awareness(doc, update))

    async def deliver(self, doc: str, entries: list[Entry], key: FrameKey, batch: Batch | None) -> int:
        text = self._deliver_text(doc, entries, key, batch)
        await self.connection.send(text)
        return len(text)

    def deliver_now(self, doc: str, entries: list[Entry], key: FrameKey, batch: Batch) -> bool:
        """Write the deliver frame now, framed once for every socket it goes
        to, if no send of this connection is under way (frames stay whole and
        in order) and the server's writer takes it."""
        write = self._write_prepared
        if write is None or self.connection.sending():
            return False
        prepared = batch.prepared.get(key)
        if prepared is None:
            text = self._deliver_text(doc, entries, key, batch)
            if len(text) > MAX_PREPARED_CHARS:
                return False
            prepared = batch.prepared[key] = text_frame(text)
        return write(prepared)

    @staticmethod
    def _deliver_text(doc: str, entries: list[Entry], key: FrameKey, batch: Batch | None) -> str:
        """The deliver frame of ``entries``; from a fan-out batch, encoded once
        and shared by every subscriber sending the same entries (``key``)."""
        if batch is not None:
            text = batch.frames.get(key)
            if text is not None:
                return text
        text = protocol.encode(protocol.deliver(doc, [(str(entry.id), entry.b64) for entry in entries]))
        if batch is not None:
            batch.frames[key] = text
        return text


def welcome(services: Services, opened: Opened) -> dict[str, Any]:
    """The answer to ``hello``: the session, the limits, who authenticated."""
    auth = {
        "mode": _auth_mode(services.authenticator),
        "subject": opened.principal.subject,
        "permission": opened.principal.permission.value,
    }
    return protocol.welcome(opened.session, opened.resumed, services.settings.client_limits(), auth)


def _auth_mode(authenticator: Authenticator) -> str:
    if isinstance(authenticator, NoAuthenticator):
        return "disabled"
    return "jwt" if isinstance(authenticator, JwtAuthenticator) else "custom"


def frame_identity(text: str) -> tuple[str | None, int | None]:
    """The doc and clock an oversized frame names, so that ``frame_too_large``
    can name the update it refuses. A full JSON parse: the websocket layer
    already bounds the text (``ws_max_size``), and parsing it costs about a
    fifth of decoding its base64 (2 ms for 6 MB), far less than a client
    that resends an update it cannot identify as refused."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(raw, dict):
        return None, None
    doc = raw.get("doc") if isinstance(raw.get("doc"), str) else None
    clock = raw.get("clock") if type(raw.get("clock")) is int else None
    return doc, clock


def claimed(frame: Subscribe) -> WindowDigest | None:
    """The client's drift digest, meaningful only with an offset to end its window."""
    if frame.digest is None or frame.offset is None:
        return None
    since, offset = StreamId.parse(frame.digest.since), StreamId.parse(frame.offset)
    through = StreamId.parse(frame.digest.through) if frame.digest.through is not None else offset
    if since > offset or through < offset:
        raise ProtocolError(ErrorCode.INVALID_OFFSET, "digest needs since <= offset <= through", doc=frame.doc)
    digest = Digest(count=frame.digest.count, hash=int(frame.digest.hash, 16))
    return WindowDigest(since, offset, digest, through)


__all__ = ["MAX_PREPARED_CHARS", "JsonCodec", "frame_identity", "welcome"]
