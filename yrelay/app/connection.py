"""One websocket: the socket loop, each frame parsed and handed to its flow.

The flows are modules of their own, called one way from here:
:mod:`.handshake` (origin, token, ``hello``, expiry and the cut-off
decision), :mod:`.write_path` (one update from frame to answer),
:mod:`.connection_documents` (subscribe, unsubscribe, the document a frame
names), :mod:`.connection_presence` (awareness) and :mod:`.allowance` (rates
and the subject's quotas); documents are delivered by :mod:`.subscription`.

Every rejection becomes an ``error`` frame with a code and a plain message;
nothing a client sends can raise out of this module, store anything invalid,
or stop other documents on the same socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketDisconnected

from yrelay import protocol
from yrelay.app import subscription_set
from yrelay.app.allowance import Allowance
from yrelay.app.connection_documents import ConnectionDocuments
from yrelay.app.connection_presence import ConnectionPresence
from yrelay.app.context import ServerContext
from yrelay.app.handshake import CLOSE_FORBIDDEN_ORIGIN, CutOff, Handshake, Opened, refuse
from yrelay.app.pacing import CLOSE_TOO_MANY_MESSAGES, Flooded
from yrelay.app.payloads import decode_b64
from yrelay.app.update_parts import frame_identity
from yrelay.app.write_path import WritePath
from yrelay.auth import Principal
from yrelay.observability import logs, pygc
from yrelay.protocol import (
    Ack,
    AckFrame,
    AnyUpdate,
    Awareness,
    CheckSubscriptions,
    ErrorCode,
    Hello,
    Ping,
    ProtocolError,
    Reconcile,
    Subscribe,
    Sync,
    Unsubscribe,
    Update,
    UpdateFrame,
)
from yrelay.storage.offsets import StreamId
from yrelay.tasks import TaskSet, lost_redis
from yrelay.transport.prepared_frames import WritePrepared
from yrelay.transport.ws_protocol import trust

log = logging.getLogger(__name__)


def _nothing() -> None:
    pass


class ConnectionState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


class Connection:
    def __init__(self, websocket: WebSocket, ctx: ServerContext, write_prepared: WritePrepared | None = None):
        """``write_prepared``: the server's writer of prepared frames
        (:func:`yrelay.transport.prepared_frames.prepared_writer`), for the fan-out's inline deliveries."""
        self.websocket = websocket
        self.ctx = ctx
        self.state = ConnectionState.AWAITING_HELLO
        self.session: str | None = None
        self.handshake = Handshake(ctx, websocket.headers)
        self._send_lock = asyncio.Lock()
        self._tasks = TaskSet("yrelay-connection")
        self._received = 0.0  # when the frame being handled arrived (append latency)
        self._stop_ticking: Callable[[], None] = _nothing
        self.address = websocket.client.host if websocket.client else ""
        self.allowance = Allowance(ctx, self.address)
        self.pacer = self.allowance.pacer
        self.presence = ConnectionPresence(ctx, self.allowance, self.send, self._spawn)
        self.writes = WritePath(ctx, self.allowance, self.send, self._reject, self._spawn)
        self.documents = ConnectionDocuments(
            ctx, self.allowance, self.presence, self.send, self.send_prepared if write_prepared is not None else None
        )
        self._write_prepared = write_prepared

    @property
    def principal(self) -> Principal | None:
        """Who authenticated in ``hello``, and what they may read and write."""
        return self.handshake.principal

    async def run(self) -> None:
        """Serve the websocket, unless a connection limit refuses it."""
        refusal = self.ctx.limits.open_connection(self.address)
        if refusal is not None:
            await refuse(self.websocket, refusal)
            return
        pygc.CHURN.opened()
        try:
            await self._serve()
        finally:
            pygc.CHURN.closed_one()
            self.ctx.limits.close_connection(self.address)
            self.allowance.release(len(self.documents))

    async def _serve(self) -> None:
        if self.handshake.origin_refused():
            await self.websocket.close(code=CLOSE_FORBIDDEN_ORIGIN)  # before accept: the handshake gets HTTP 403
            return
        await self.websocket.accept(subprotocol=self.handshake.subprotocol)
        self.handshake.accepted()
        opened = time.monotonic()
        self._stop_ticking = self.ctx.ticker.add(self._tick)
        try:
            while not self.closed:  # cut off (a tick, a flood): its socket is closing
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.pacer.admit(len(message.get("text") or message.get("bytes") or ""))
                if not self.closed:  # read again: the pacer's wait may have seen it cut off
                    await self._handle_message(message)
        except (WebSocketDisconnect, WebSocketDisconnected):  # the peer left, or the server closed it
            pass
        except Flooded as flood:
            await self._cut_off(
                CutOff(str(flood), ErrorCode.RATE_LIMITED, CLOSE_TOO_MANY_MESSAGES, flood.retry_after_ms)
            )
        finally:
            self.state = ConnectionState.CLOSED
            self.writes.close()
            self._stop_ticking()
            self._tasks.cancel()
            await self.documents.close()
            await self.presence.leave_all()
            if self.session is not None:
                self.ctx.events.emit(
                    "disconnect",
                    session=self.session,
                    docs=len(self.documents),
                    duration_ms=int((time.monotonic() - opened) * 1000),
                )

    @property
    def closed(self) -> bool:
        """Cut off or ended (a property, read again after each await, where a
        tick or a flood may have closed it)."""
        return self.state is ConnectionState.CLOSED

    def send_prepared(self, frame: bytes) -> bool:
        """Write a deliver frame framed once for many sockets now, from the
        fan-out's dispatch (:meth:`.sending.Sender.deliver_now`), if the
        websocket server offers it and no send of this connection is under
        way (frames stay whole and in order); False: send it with ``send``."""
        write = self._write_prepared
        if write is None or self._send_lock.locked() or self.state is ConnectionState.CLOSED:
            return False
        return write(frame)

    async def send(self, frame: dict[str, Any] | str) -> None:
        text = frame if isinstance(frame, str) else protocol.encode(frame)  # str: encoded once for many
        async with self._send_lock:
            await self.websocket.send_text(text)
        if not isinstance(frame, str) and frame["op"] == "error":  # shared text frames are deliveries
            self.ctx.metrics.rejected(frame["code"])

    async def _handle_message(self, message: Mapping[str, Any]) -> None:
        self._received = time.perf_counter()
        text = message.get("text")
        if text is None:
            await self._reject(ProtocolError(ErrorCode.MALFORMED_FRAME, "frames are JSON text, not binary"))
            return
        if len(text) > self.ctx.settings.max_frame_bytes:
            doc, clock = frame_identity(text)  # bounded by ws_max_size; names the refused update
            await self._reject(
                ProtocolError(
                    ErrorCode.FRAME_TOO_LARGE,
                    f"frame exceeds {self.ctx.settings.max_frame_bytes} bytes; "
                    "send a larger update in parts (feature update_parts)",
                    doc=doc,
                    clock=clock,
                )
            )
            return
        try:
            frame = protocol.parse_client_frame(text)
            named = logs.doc.set(getattr(frame, "doc", None))  # log lines (and tasks started here) name it
            try:
                await self._dispatch(frame)
            finally:
                logs.doc.reset(named)
        except ProtocolError as error:
            await self._reject(error)
        except (WebSocketDisconnect, WebSocketDisconnected, asyncio.CancelledError, Flooded):
            raise
        except Exception as exc:
            if lost_redis(exc):
                log.warning("Redis error while handling a frame: %r", exc)
                await self._reject(ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; retry later"))
            else:
                log.exception("unexpected error handling a frame")
                await self._reject(ProtocolError(ErrorCode.INTERNAL_ERROR, "internal error; the frame was not applied"))

    async def _reject(self, error: ProtocolError) -> None:
        self.writes.refused(error)  # the rest of a refused update's parts is ignored
        log.debug(
            "rejected a frame: %s %s",
            error.code.value,
            error.message,
            extra={"doc": error.doc} if error.doc is not None else None,
        )
        await self.send(protocol.error(error))

    async def _dispatch(self, frame: object) -> None:
        if isinstance(frame, Hello):
            await self._hello(frame)
            return
        if self.state is not ConnectionState.OPEN:
            raise ProtocolError(ErrorCode.HANDSHAKE_REQUIRED, "send 'hello' first")
        assert self.session is not None
        if isinstance(frame, (UpdateFrame, Update)):
            await self._update(frame)
        elif isinstance(frame, (AckFrame, Ack)):
            self.documents.get(frame.doc).on_ack(StreamId.parse(frame.offset))
        elif isinstance(frame, Subscribe):
            assert self.principal is not None
            await self.allowance.take_answer()  # its snapshot and catch-up are booked as they are sent
            await self.documents.subscribe(frame, self.session, self.principal)
        elif isinstance(frame, Unsubscribe):
            await self.pacer.control()
            await self.documents.unsubscribe(frame, self.session)
        elif isinstance(frame, Sync):
            await self.allowance.take_answer()
            self.documents.get(frame.doc).request_sync(decode_b64(frame.state_vector, frame.doc, None))
        elif isinstance(frame, CheckSubscriptions):
            await self.pacer.control()
            await self.send(await subscription_set.check(self.ctx, self.session, frame))
        elif isinstance(frame, Reconcile):
            await self.allowance.take_answer()
            answer = protocol.encode(await subscription_set.reconcile(self.ctx, self.session, frame))
            self.allowance.answered(len(answer))
            await self.send(answer)
        elif isinstance(frame, Ping):
            await self.pacer.control()
            await self.send(protocol.pong())
        elif isinstance(frame, Awareness):
            self.documents.get(frame.doc)
            await self.presence.receive(frame)

    async def _hello(self, frame: Hello) -> None:
        if self.state is not ConnectionState.AWAITING_HELLO:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, "'hello' was already sent on this connection")
        opened = await self.handshake.hello(frame)
        if isinstance(opened, CutOff):
            await self._cut_off(opened)
            return
        self._open(opened)
        await self.send(self.handshake.welcome(opened))

    def _open(self, opened: Opened) -> None:
        self.session = self.writes.session = opened.session
        self.allowance.open(opened.session, opened.principal)
        trust(self.websocket)  # messages may now be as large as ws_max_size
        self.state = ConnectionState.OPEN
        self.ctx.events.emit(
            "connect",
            session=opened.session,
            resumed=opened.resumed,
            **self.ctx.events.log.subject(opened.principal.subject),
        )

    async def _cut_off(self, cut: CutOff) -> None:
        """Refuse or end the session: say why, then close (docs/security.md)."""
        self.state = ConnectionState.CLOSED
        with contextlib.suppress(Exception):  # the socket may be gone already
            await self.send(protocol.error(ProtocolError(cut.code, cut.reason, retry_after_ms=cut.retry_after_ms)))
        with contextlib.suppress(Exception):
            await self.websocket.close(code=cut.close_code, reason=cut.reason[:120])

    async def _update(self, frame: AnyUpdate) -> None:
        assert self.principal is not None
        if not self.principal.can_write(frame.doc):
            raise ProtocolError.about(frame, ErrorCode.FORBIDDEN, "read-only: this token may not change this document")
        self.documents.get(frame.doc, frame.clock)
        await self.writes.receive(frame, self._received)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(work)

    def _tick(self) -> None:
        """The connection's periodic checks, once per ``resend_check_interval``
        on the process's one timer task (:mod:`.ticker`; a sleeping task per
        connection cost memory): the ``hello`` deadline, resends of quiet
        documents, and the token's expiry and revocation. A failing check is
        logged and the others and the next tick still run."""
        if self.state is ConnectionState.CLOSED:
            return
        overdue = self.handshake.hello_overdue() if self.state is ConnectionState.AWAITING_HELLO else None
        if overdue is not None:
            self._end(overdue)
            return
        try:
            self.documents.check_resends()
        except Exception:
            log.exception("the resend check failed; the token check and the next tick still run")
        lapsed = self.handshake.token_lapsed() if self.state is ConnectionState.OPEN else None
        if lapsed is not None:
            self._end(lapsed)

    def _end(self, cut: CutOff) -> None:
        """Cut off from a tick: no more ticks, and the closing on a task of its own."""
        self._stop_ticking()
        self._spawn(self._cut_off(cut))
