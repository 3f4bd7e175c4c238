"""``/yws/{doc}``: the y-websocket protocol, so that an existing Yjs app's
``new WebsocketProvider('wss://host/yws', doc, ydoc)`` works unchanged.

One connection serves one document with binary y-protocols messages
(:mod:`yrelay.yjs.yprotocol`). Its credentials go through the same
:class:`~.handshake.Handshake` as ``/ws`` (origin allowlist, token as a
subprotocol ``yrelay.auth.<token>`` next to ``yrelay.yws``) and, for stock
clients that can only add URL parameters, ``?token=``, taken out of the
request before anything can log it (:mod:`.yws_endpoint`, docs/security.md).

* The client's sync step 1 is answered with step 2 = exactly what its state
  vector lacks, from snapshot + stream in an engine worker
  (:func:`.resync.sync_answer`), then the server's own step 1; after the
  first answer, every later entry of the stream (:mod:`.yws_feed`).
* Step 2 and update go through the same :class:`~.write_path.WritePath` as
  ``/ws`` updates (rates, validation, causal admission, in-flight bytes,
  the appender); others see them only from the stream. Such a client never
  resends an update, so one that cannot be stored closes the socket: the
  client's reconnect sync sends it again. A step 2 is a sync push (only its
  causally ready part is stored, as for ``update {sync: true}``).
* A read-only token's updates are answered with y-protocols' permission
  denied and never stored; awareness goes through the presence relay, so
  ``/ws`` and ``/yws`` clients see each other.
* Nothing is tracked: these connections never pin a stream.
* The room of ``/yws/<room>`` may be any name: it maps one-to-one to a
  document id (:func:`yrelay.storage.keys.room_doc_id`); one no id can hold is
  refused once and held open (stock clients reconnect after a close).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from yrelay.app.allowance import Allowance
from yrelay.app.connection_presence import ConnectionPresence
from yrelay.app.context import ServerContext
from yrelay.app.handshake import CLOSE_FORBIDDEN_ORIGIN, CLOSE_UNAUTHORIZED, Handshake
from yrelay.app.pacing import CLOSE_TOO_MANY_MESSAGES, Flooded
from yrelay.app.resync import sync_answer
from yrelay.app.write_path import WritePath
from yrelay.app.yws_feed import YwsFeed
from yrelay.auth import Principal
from yrelay.observability import logs
from yrelay.protocol import ProtocolError, Update
from yrelay.storage.keys import InvalidDocumentId, room_doc_id
from yrelay.tasks import TaskSet
from yrelay.transport.ws_protocol import trust
from yrelay.yjs import yprotocol
from yrelay.yjs.crdt import InvalidUpdate
from yrelay.yjs.engine_pool import EngineFailed
from yrelay.yjs.yprotocol import AwarenessMessage, QueryAwarenessMessage, SyncMessage, SyncStep, YProtocolError

log = logging.getLogger(__name__)

#: The subprotocol a client offers next to ``yrelay.auth.<token>``.
YWS_SUBPROTOCOL = "yrelay.yws"
#: The header of one message around its payload: type, step, length (at most 8 bytes).
MESSAGE_OVERHEAD = 10

CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN = 1013
#: An update was not stored (the reason names why): reconnect, and the sync sends it again.
CLOSE_NOT_STORED = 4500
#: The token may not read this document.
CLOSE_FORBIDDEN = 4403
#: An awareness update of no client: what a refused socket hears while it
#: stays open (y-protocols applies it as a no-op).
EMPTY_AWARENESS = yprotocol.awareness(b"\x00")


class YwsConnection:
    """One y-websocket client on one document."""

    def __init__(self, websocket: WebSocket, ctx: ServerContext, room: str, token: str | None):
        self.websocket = websocket
        self.ctx = ctx
        #: Why no document id can name the room (then ``doc`` is empty and nothing is served).
        self.unnamed: str | None = None
        try:
            doc = room_doc_id(room)  # any room name an app picks: docs/web.md#room-names
        except InvalidDocumentId as exc:
            doc, self.unnamed = "", str(exc)
        self.doc = doc
        self._token = token
        self.session = "yws-" + secrets.token_hex(8)  # dedup and presence identity; never tracked
        self.address = websocket.client.host if websocket.client else ""
        self.handshake = Handshake(ctx, websocket.headers, YWS_SUBPROTOCOL)
        self.allowance = Allowance(ctx, self.address)
        self.pacer = self.allowance.pacer
        self._tasks = TaskSet("yrelay-yws")
        #: The greeting answering an awareness query, while it runs: queries
        #: meanwhile are answered by it (one at a time per connection).
        self._greeting: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        #: When the socket was last sent something (loop time): a silent one gets its awareness echoed.
        self._last_sent = asyncio.get_running_loop().time()
        self._clock = 0
        self._closed = False
        self._subscriptions = 0  # counted against the subject's limit
        self.presence = ConnectionPresence(ctx, self.allowance, self._send_awareness, self._spawn)
        self.writes = WritePath(ctx, self.allowance, self._answer, self._refused, self._spawn)
        self.writes.session = self.session
        self.feed = YwsFeed(ctx, doc, self.session, self.send, self.close)

    async def run(self) -> None:
        refusal = self.ctx.limits.open_connection(self.address)
        if refusal is not None:  # accepted only to say why (no JSON error frame: this client reads y-protocols)
            with contextlib.suppress(Exception):
                await self.websocket.accept()
                await self.websocket.close(refusal.close_code, refusal.error.message[:120])
            return
        try:
            await self._serve()
        finally:
            self.ctx.limits.close_connection(self.address)
            self.allowance.release(self._subscriptions)

    async def _serve(self) -> None:
        if self.handshake.origin_refused():
            await self.websocket.close(code=CLOSE_FORBIDDEN_ORIGIN)  # before accept: HTTP 403
            return
        await self.websocket.accept(subprotocol=self.handshake.subprotocol)
        principal = await self._admit()
        if principal is None:
            return
        logs.session.set(self.session)
        logs.doc.set(self.doc)
        self.allowance.open(self.session, principal)
        trust(self.websocket)  # messages may now be as large as ws_max_size
        if not await self._count_subscription():
            return
        self._stop_ticking = self.ctx.ticker.add(self._tick)
        try:
            await self.feed.start()
            self.presence.join(self.doc, self.session)
            self._spawn(self.presence.greet(self.presence.members[self.doc]))
            while not self._closed:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.pacer.admit(len(message.get("bytes") or message.get("text") or ""))
                await self._handle(message, principal)
        except (WebSocketDisconnect, WebSocketDisconnected):
            pass
        except Flooded as flood:
            await self.close(CLOSE_TOO_MANY_MESSAGES, str(flood))
        except Exception as exc:  # noqa: BLE001 - the connection's boundary: the fan-out could not read the document (Redis down)
            log.warning("/yws connection to %s failed: %s", self.doc, exc)
            await self.close(CLOSE_TRY_AGAIN, "storage unavailable; reconnect")
        finally:
            self._closed = True
            self._stop_ticking()
            self.writes.close()
            self.feed.stop()
            self._tasks.cancel()
            await self.presence.leave_all()

    async def _count_subscription(self) -> bool:
        """The subject's live-subscription limit counts this connection as one."""
        try:
            await self.allowance.open_subscription(self.doc)
        except ProtocolError as error:
            await self.close(CLOSE_TRY_AGAIN, error.message)
            return False
        self._subscriptions = 1
        return True

    async def _admit(self) -> Principal | None:
        """Authenticate and check the document; else say why and close."""
        principal = await self.handshake.authenticate(self._token)
        if not isinstance(principal, Principal):
            await self._deny(principal.reason, principal.close_code)
            return None
        if self.unnamed is not None:
            await self._hold(self.unnamed)
            return None
        if not principal.can_read(self.doc):
            await self._deny("this token may not read this document", CLOSE_FORBIDDEN)
            return None
        return principal

    async def _hold(self, reason: str) -> None:
        """Refuse a room no document id can name, once, for good.

        y-websocket 1.x and 2.x reconnect after any close (3.x stops on
        4400-4499 only), every 2.5 s at most: a close would be a loop of
        refusals. So the socket stays open, told y-protocols' permission
        denied once, synced with nothing, and sent an empty awareness update
        whenever ``yws_echo_after`` passed (y-websocket closes, then
        reconnects, a socket silent for 30 s). Its messages are read and
        dropped, paced as before a token is checked. It is closed as any
        other once its token expires or is revoked (:meth:`_tick`): a held
        socket does not outlive the token that opened it.
        """
        log.info("/yws room refused: %s", reason)
        keepalive = self._tasks.spawn(self._keep_alive())
        self._stop_ticking = self.ctx.ticker.add(self._tick)
        try:
            await self.send(yprotocol.permission_denied(reason))
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                await self.pacer.admit(len(message.get("bytes") or message.get("text") or ""))
        except (WebSocketDisconnect, WebSocketDisconnected, RuntimeError, OSError):
            pass  # the client left (a send after its close raises RuntimeError)
        except Flooded as flood:
            await self.close(CLOSE_TOO_MANY_MESSAGES, str(flood))
        finally:
            self._stop_ticking()
            keepalive.cancel()

    async def _keep_alive(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, WebSocketDisconnected, RuntimeError, OSError):
            while True:
                await asyncio.sleep(self.ctx.settings.yws_echo_after)
                await self.send(EMPTY_AWARENESS)

    async def _deny(self, reason: str, code: int) -> None:
        with contextlib.suppress(Exception):
            await self.websocket.send_bytes(yprotocol.permission_denied(reason))
        await self.close(code, reason)

    async def _handle(self, message: Mapping[str, Any], principal: Principal) -> None:
        data = message.get("bytes")
        if data is None:
            await self.close(CLOSE_UNSUPPORTED_DATA, "y-websocket messages are binary")
            return
        if len(data) > self.ctx.settings.max_update_bytes + MESSAGE_OVERHEAD:
            await self.close(CLOSE_TOO_BIG, f"message exceeds {self.ctx.settings.max_update_bytes} bytes")
            return
        received = time.perf_counter()
        try:
            parsed = yprotocol.decode(data)
        except YProtocolError as exc:
            await self.close(CLOSE_PROTOCOL_ERROR, f"not a y-protocols message: {exc}")
            return
        try:
            if isinstance(parsed, SyncMessage):
                await self._sync(parsed, principal, received)
            elif isinstance(parsed, AwarenessMessage):
                await self._awareness(parsed.update)
            elif isinstance(parsed, QueryAwarenessMessage):
                await self._query_awareness()
        except ProtocolError as error:
            await self._refused(error)
        except InvalidUpdate as exc:
            await self.close(CLOSE_PROTOCOL_ERROR, f"invalid state vector: {exc}")
        except (WebSocketDisconnect, WebSocketDisconnected, asyncio.CancelledError, Flooded):
            raise
        except EngineFailed:
            await self.close(CLOSE_TRY_AGAIN, "the document could not be read; reconnect")
        except Exception as exc:  # noqa: BLE001 - Redis down, or a bug: never a trace to the client
            log.warning("/yws message on %s failed: %s", self.doc, exc)
            await self.close(CLOSE_TRY_AGAIN, "storage unavailable; reconnect")

    async def _sync(self, message: SyncMessage, principal: Principal, received: float) -> None:
        if message.step is SyncStep.STEP1:
            await self.allowance.take_answer()
            answer = await sync_answer(self.ctx, self.doc, message.payload)
            await self.send(yprotocol.sync_step2(answer.diff))
            self.allowance.answered(len(answer.diff))
            await self.send(yprotocol.sync_step1(answer.state_vector))  # the client answers with what we lack
            self.feed.answered(answer.offset)
            return
        if message.payload == b"\x00\x00":  # an empty update (the usual answer to our step 1)
            return
        if not principal.can_write(self.doc):
            await self.send(yprotocol.permission_denied("read-only: this token may not change this document"))
            return
        frame = Update.model_construct(
            op="update",
            doc=self.doc,
            clock=self._clock,
            update="",
            sync=message.step is SyncStep.STEP2,
            part=None,
            parts=None,
        )
        self._clock += 1
        await self.allowance.take_update(frame)
        await self.writes.submit(frame, message.payload, received)

    async def _query_awareness(self) -> None:
        """Send the others' states again, at the rate of answers; a query
        while the last one's greeting still runs is answered by it."""
        await self.allowance.take_answer()
        if self._greeting is None or self._greeting.done():
            self._greeting = self._tasks.spawn(self.presence.greet(self.presence.members[self.doc]))

    async def _awareness(self, update: bytes) -> None:
        """Relay presence; one over a limit is dropped (a stock client
        cannot read why, and renews its state anyway)."""
        if len(update) > self.ctx.settings.max_awareness_bytes:
            return
        try:
            await self.allowance.take_awareness(self.doc)
            await self.presence.receive_update(self.doc, update)
        except ProtocolError as error:
            log.debug("awareness update dropped: %s", error.message)
            return
        if asyncio.get_running_loop().time() - self._last_sent >= self.ctx.settings.yws_echo_after:
            await self.send(yprotocol.awareness(update))  # keeps a lone client's socket alive (y-websocket's way)

    async def _answer(self, frame: dict[str, Any]) -> None:
        """The write path's answer: ``appended`` needs none; an error closes."""
        if frame["op"] == "error":
            await self.close(CLOSE_NOT_STORED, f"{frame['code']}: {frame['message']}")

    async def _refused(self, error: ProtocolError) -> None:
        await self.close(CLOSE_NOT_STORED, f"{error.code.value}: {error.message}")

    async def _send_awareness(self, frame: dict[str, Any]) -> None:
        await self.send(yprotocol.awareness(base64.b64decode(frame["update"])))

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.websocket.send_bytes(data)
            self._last_sent = asyncio.get_running_loop().time()

    async def close(self, code: int, reason: str) -> None:
        """End the connection (once); the reason fits a close frame (123 bytes)."""
        if self._closed:
            return
        self._closed = True
        log.info("closing a /yws connection to %s: %s %s", self.doc, code, reason)
        with contextlib.suppress(Exception):
            await self.websocket.close(code, reason.encode()[:123].decode(errors="ignore"))

    def _tick(self) -> None:
        """Close once the token expired or was revoked (as ``/ws`` does);
        once per ``resend_check_interval`` on the process's timer (:mod:`.ticker`)."""
        lapsed = None if self._closed else self.handshake.token_lapsed()
        if lapsed is not None:
            self._stop_ticking()
            self._spawn(self.close(CLOSE_UNAUTHORIZED, lapsed.reason))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(work)


__all__ = ["CLOSE_NOT_STORED", "YWS_SUBPROTOCOL", "YwsConnection"]
