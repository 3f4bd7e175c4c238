"""One websocket, whatever protocol it speaks: the one receive loop, and
the commands a codec calls with what the client sent.

The connection owns the socket and everything that must hold for every
protocol: the connection limits, the origin check, the pacing of what is
read (a flood is cut off), the token's expiry and revocation, the
subject's rates and quotas (:mod:`.allowance`), one send at a time, and the
tasks that end with it. What differs per protocol is its codec
(:class:`.peer.Codec`): how bytes become commands (:meth:`.peer.Codec.receive`
calls :meth:`Connection.write`, :meth:`Connection.subscribe`, ...) and how
what the core says becomes bytes (:class:`.peer.Peer`). Calls go one way:
the codec calls the connection, the connection calls the flows
(:mod:`.write_path`, :mod:`.documents`,
:mod:`.presence`), each given only the services it uses (:mod:`.services`), and the flows speak to the client only
through the codec's :class:`~.peer.Peer` methods.

Every refusal goes to the codec's :meth:`~.peer.Peer.refused`; nothing a
client sends can raise out of this module, store anything invalid, or stop
other documents on the same socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from yrelay.app.core.allowance import Allowance
from yrelay.app.core.documents import ConnectionDocuments
from yrelay.app.core.handshake import CLOSE_FORBIDDEN_ORIGIN, CutOff, Handshake, Opened
from yrelay.app.core.pacing import CLOSE_TOO_MANY_MESSAGES, Flooded
from yrelay.app.core.peer import Codec
from yrelay.app.core.presence import ConnectionPresence
from yrelay.app.core.services import Services
from yrelay.app.core.write_path import WritePath
from yrelay.auth import Principal
from yrelay.auth.host import HostAuthenticator, current_connection
from yrelay.observability import logs, pygc
from yrelay.protocol import ErrorCode, ProtocolError, Update
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import StreamId
from yrelay.tasks import TaskSet, lost_redis
from yrelay.transport.ws_protocol import trust

log = logging.getLogger(__name__)

#: Close code when the server cannot serve the connection now (storage down): reconnect.
CLOSE_TRY_AGAIN = 1013


def _nothing() -> None:
    pass


class ConnectionState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


class Connection:
    """One client's socket; ``codec`` is set by the endpoint (:meth:`speak`)
    before :meth:`run`."""

    __slots__ = (
        "websocket",
        "services",
        "state",
        "session",
        "handshake",
        "_send_lock",
        "_tasks",
        "received",
        "_stop_ticking",
        "address",
        "allowance",
        "pacer",
        "codec",
        "presence",
        "writes",
        "documents",
    )

    def __init__(self, websocket: WebSocket, services: Services, subprotocol: str):
        self.websocket = websocket
        self.services = services
        self.state = ConnectionState.AWAITING_HELLO
        self.session: str | None = None
        self.handshake = Handshake(services.handshake, websocket.headers, subprotocol)
        self._send_lock = asyncio.Lock()
        self._tasks = TaskSet("yrelay-connection")
        #: When the message being handled arrived (append latency).
        self.received = 0.0
        self._stop_ticking: Callable[[], None] = _nothing
        self.address = websocket.client.host if websocket.client else ""
        self.allowance = Allowance(services.allowance, self.address)
        self.pacer = self.allowance.pacer

    def speak(self, codec: Codec) -> None:
        """Serve this connection in ``codec``'s wire format and policy."""
        self.codec = codec
        if not codec.hello_first:
            self.state = ConnectionState.OPEN  # authenticated as it opens (Codec.opened)
        self.presence = ConnectionPresence(
            self.services.presence, self.services.settings, self.allowance, codec, self._tasks.spawn
        )
        self.writes = WritePath(self.services.writes, self.allowance, codec, self.reject, self.spawn)
        self.documents = ConnectionDocuments(
            self.services.reads,
            self.allowance,
            self.presence,
            codec,
            tracked=codec.tracked,
            deliver_now=codec.writes_now,
        )

    @property
    def principal(self) -> Principal | None:
        """Who authenticated, and what they may read and write."""
        return self.handshake.principal

    @property
    def closed(self) -> bool:
        """Cut off or ended (a property, read again after each await, where a
        tick or a flood may have closed it)."""
        return self.state is ConnectionState.CLOSED

    # ------------------------------------------------------------ the socket

    async def run(self) -> None:
        """Serve the websocket, unless a connection limit refuses it."""
        if isinstance(self.services.authenticator, HostAuthenticator):  # ~0.4 kB per connection: only when read
            current_connection.set(self.websocket)  # this connection's task only: for the host's authenticate
        refusal = self.services.limits.open_connection(self.address)
        if refusal is not None:
            await self.codec.refuse_connection(refusal)
            return
        pygc.CHURN.opened()
        try:
            await self._serve()
        finally:
            pygc.CHURN.closed_one()
            self.services.limits.close_connection(self.address)
            self.allowance.release(len(self.documents))
            await self._forget_empty()

    async def _forget_empty(self) -> None:
        """After everything else is given back: the documents that hold
        nothing stop tracking the session (:meth:`.documents.ConnectionDocuments.forget_empty`)."""
        if self.session is None:
            return
        try:
            await self.documents.forget_empty(self.session)
        except Exception as exc:  # noqa: BLE001 - only Redis space: the tracking stays, as it did before
            log.info("could not forget the empty documents' tracking: %r", exc)

    async def _serve(self) -> None:
        if self.handshake.origin_refused():
            await self.websocket.close(code=CLOSE_FORBIDDEN_ORIGIN)  # before accept: the handshake gets HTTP 403
            return
        await self.websocket.accept(subprotocol=self.handshake.subprotocol)
        self.handshake.accepted()
        opened = time.monotonic()
        self._stop_ticking = self.services.ticker.add(self._tick)
        try:
            await self.codec.opened()
            while not self.closed:  # cut off (a tick, a flood): its socket is closing
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.pacer.admit(len(message.get("text") or message.get("bytes") or ""))
                if not self.closed:  # read again: the pacer's wait may have seen it cut off
                    await self._handle(message)
        except (WebSocketDisconnect, WebSocketDisconnected):  # the peer left, or the server closed it
            pass
        except Flooded as flood:
            await self.cut_off(
                CutOff(str(flood), ErrorCode.RATE_LIMITED, CLOSE_TOO_MANY_MESSAGES, flood.retry_after_ms)
            )
        except Exception as exc:  # noqa: BLE001 - the connection's boundary (a codec's opening met Redis down)
            log.warning("connection failed: %r", exc)
            await self.cut_off(CutOff("storage unavailable; reconnect", ErrorCode.UNAVAILABLE, CLOSE_TRY_AGAIN))
        finally:
            self.state = ConnectionState.CLOSED
            self.writes.close()
            self._stop_ticking()
            self._tasks.cancel()
            await self.documents.close()
            await self.presence.leave_all()
            if self.session is not None and self.codec.tracked:
                self.services.events.emit(
                    "disconnect",
                    session=self.session,
                    docs=len(self.documents),
                    duration_ms=int((time.monotonic() - opened) * 1000),
                )

    async def _handle(self, message: Mapping[str, Any]) -> None:
        self.received = time.perf_counter()
        try:
            await self.codec.receive(message)
        except ProtocolError as error:
            await self.reject(error)
        except (WebSocketDisconnect, WebSocketDisconnected, asyncio.CancelledError, Flooded):
            raise
        except Exception as exc:
            if lost_redis(exc):
                log.warning("Redis error while handling a message: %r", exc)
                await self.reject(ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; retry later"))
            else:
                log.exception("unexpected error handling a message")
                await self.reject(ProtocolError(ErrorCode.INTERNAL_ERROR, "internal error; the frame was not applied"))

    async def reject(self, error: ProtocolError) -> None:
        """Refuse what the client sent, in its codec's way."""
        self.writes.refused(error)  # the rest of a refused update's parts is ignored
        log.debug(
            "rejected a frame: %s %s",
            error.code.value,
            error.message,
            extra={"doc": error.doc} if error.doc is not None else None,
        )
        await self.codec.refused(error)

    async def send(self, data: str | bytes) -> None:
        """Write one message; one at a time (frames stay whole and in order)."""
        async with self._send_lock:
            if isinstance(data, str):
                await self.websocket.send_text(data)
            else:
                await self.websocket.send_bytes(data)

    def sending(self) -> bool:
        """A send is under way (a frame written around it would cut into it) or the connection ended."""
        return self._send_lock.locked() or self.state is ConnectionState.CLOSED

    async def close(self, code: int, reason: str) -> None:
        """End the connection (once)."""
        if not self.closed:
            self.state = ConnectionState.CLOSED
            log.info("closing a connection: %s %s", code, reason)
            await self._close_socket(code, reason)

    async def cut_off(self, cut: CutOff) -> None:
        """Refuse or end the session: the codec says why, then the close (docs/security.md)."""
        self.state = ConnectionState.CLOSED
        with contextlib.suppress(Exception):  # the socket may be gone already
            await self.codec.ending(cut)
        await self._close_socket(cut.close_code, cut.reason)

    async def _close_socket(self, code: int, reason: str) -> None:
        """The close frame; its reason cut to fit one (123 bytes)."""
        with contextlib.suppress(Exception):  # the socket may be gone already
            await self.websocket.close(code, reason.encode()[:123].decode(errors="ignore"))

    # ------------------------------------------------------------ the session

    async def hello(self, session: str | None, token: str | None) -> Opened | None:
        """A ``hello``: authenticate (``token``, else the subprotocol's) and
        open its session (``session``: the one the client resumes); None:
        cut off."""
        if self.state is not ConnectionState.AWAITING_HELLO:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, "'hello' was already sent on this connection")
        opened = await self.handshake.hello(session, token)
        if isinstance(opened, CutOff):
            await self.cut_off(opened)
            return None
        self.open(opened.session, opened.principal)
        self.services.events.emit(
            "connect",
            session=opened.session,
            resumed=opened.resumed,
            **self.services.events.log.subject(opened.principal.subject),
        )
        return opened

    async def authenticate(self, token: str | None) -> Principal | None:
        """A protocol without ``hello``: who ``token`` (else the
        subprotocol's) is; None: the connection was cut off."""
        principal = await self.handshake.authenticate(token)
        if isinstance(principal, CutOff):
            await self.cut_off(principal)
            return None
        return principal

    def open(self, session: str, principal: Principal) -> None:
        """The session is open: the subject's rates and quotas apply."""
        self.session = self.writes.session = session
        logs.session.set(session)  # the connection's context: every later line and task carries it
        self.allowance.open(session, principal)
        trust(self.websocket)  # messages may now be as large as ws_max_size
        self.state = ConnectionState.OPEN

    def _opened(self) -> str:
        if self.state is not ConnectionState.OPEN or self.session is None:
            raise ProtocolError(ErrorCode.HANDSHAKE_REQUIRED, "send 'hello' first")
        return self.session

    # ------------------------------------------------------------ commands

    async def write(self, frame: Update, update: bytes) -> None:
        """Store ``update``, of a subscribed document (``frame`` names it, its
        clock, whether it is a sync push, and which part of an update it is)."""
        self._opened()
        assert self.principal is not None
        if not self.principal.can_write(frame.doc):
            raise ProtocolError.about(frame, ErrorCode.FORBIDDEN, "read-only: this token may not change this document")
        self.documents.get(frame.doc, frame.clock)
        await self.writes.receive(frame, update, self.received)

    def ack(self, doc: str, offset: StreamId) -> None:
        """The client holds ``doc`` up to ``offset``."""
        self._opened()
        self.documents.get(doc).on_ack(offset)

    async def subscribe(self, doc: str, requested: StreamId | None = None, claimed: WindowDigest | None = None) -> None:
        """Deliver ``doc`` from ``requested`` on (None: from its snapshot; or,
        untracked, from the client's first sync)."""
        session = self._opened()
        assert self.principal is not None
        await self.documents.subscribe(doc, session, self.principal, requested, claimed)

    async def unsubscribe(self, doc: str) -> None:
        session = self._opened()
        await self.pacer.control()
        await self.documents.unsubscribe(doc, session)

    async def sync(self, doc: str, state_vector: bytes) -> None:
        """The two-way exchange: answer with what the client lacks."""
        self._opened()
        subscription = self.documents.get(doc)
        await self.allowance.take_answer()
        subscription.request_sync(state_vector)

    async def awareness(self, doc: str, update: bytes) -> None:
        """Relay the client's presence on a subscribed document."""
        self._opened()
        self.documents.get(doc)
        await self.presence.receive(doc, update)

    async def query_awareness(self, doc: str) -> None:
        """Send the others' presence on ``doc`` again."""
        self._opened()
        await self.presence.query(doc)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that ends with the connection."""
        self._tasks.spawn(work)

    # ------------------------------------------------------------ the timer

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
        self.spawn(self.cut_off(cut))


__all__ = ["CLOSE_TRY_AGAIN", "Connection", "ConnectionState"]
