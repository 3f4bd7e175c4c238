"""One websocket: the handshake, then routing each frame to its document.

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
from collections.abc import Coroutine
from typing import Any

import redis.exceptions
from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketDisconnected

from .. import awareness, crdt, logs, protocol
from ..admission import Needs, needs_of
from ..store import NotAdmitted
from ..update_format import Layout, MalformedUpdate, read_layout
from ..auth import AuthError, Authenticator, NoAuthenticator, Principal, origin_allowed
from ..auth.origins import own_origins
from ..auth.authenticator import JwtAuthenticator
from ..keys import subject_id
from ..offsets import StreamId
from ..protocol import (Ack, Awareness, CheckSubscriptions, ErrorCode, Hello, Ping, ProtocolError, Reconcile, Subscribe,
                        Sync, Unsubscribe, Update)
from ..reconciliation import MalformedMessage, respond
from ..reconciliation.digest import Digest
from ..reconciliation.stream_digest import WindowDigest
from .context import ServerContext
from .limits import DeliveryBudget, Refusal, TokenBucket
from .presence import Member, NotOwner, PresenceFull
from .quotas import SubjectBuckets
from .appender import AppendResult
from .inflight import InflightUpdates
from .subscription import Send, Subscription
from .update_parts import UpdateParts, frame_identity
from .validator import ValidatorUnavailable

log = logging.getLogger(__name__)

#: Frames that answer a subscribe; presence greets the connection after them.
_ANSWERS = frozenset({"subscribed", "resync_required"})


#: The websocket subprotocol of this protocol; a client that offers it gets it back.
SUBPROTOCOL = "yrelay.v1"
#: A subprotocol ``yrelay.auth.<token>`` carries the token (browsers cannot set headers).
TOKEN_SUBPROTOCOL_PREFIX = "yrelay.auth."
#: Close code of a connection refused or ended for its credentials (missing,
#: invalid, expired or revoked token): get a new token before reconnecting.
CLOSE_UNAUTHORIZED = 4401
#: Close code of a connection that sent no ``hello`` within ``hello_timeout``.
CLOSE_HELLO_TIMEOUT = 4408


class ConnectionState(enum.Enum):
    AWAITING_HELLO = "awaiting_hello"
    OPEN = "open"
    CLOSED = "closed"


class Connection:
    def __init__(self, websocket: WebSocket, ctx: ServerContext):
        self.websocket = websocket
        self.ctx = ctx
        self.state = ConnectionState.AWAITING_HELLO
        self.session: str | None = None
        #: Who authenticated in ``hello``, and what they may read and write.
        self.principal: Principal | None = None
        self._subprotocol_token: str | None = None
        self.subscriptions: dict[str, Subscription] = {}
        self.presence: dict[str, Member] = {}
        self._send_lock = asyncio.Lock()
        self._inflight = InflightUpdates(ctx.settings.max_inflight_appends,
                                         ctx.settings.max_inflight_bytes_per_connection, ctx.inflight_bytes)
        self._tasks: set[asyncio.Task[None]] = set()
        self._received = 0.0  # when the frame being handled arrived (append latency)
        #: Unacked deliveries of all this connection's documents.
        self.budget = DeliveryBudget(ctx.settings.max_unacked_per_connection)
        #: The session's update rate (shared with its other connections here).
        self._rate: TokenBucket | None = None
        #: Presence updates of this connection, all documents together.
        self._presence_rate = TokenBucket(ctx.settings.presence_per_second, ctx.settings.presence_burst)
        #: The subject's deployment-wide buckets (acquired on first use).
        self._subject: SubjectBuckets | None = None
        #: Resolved once the last update received was submitted or rejected:
        #: updates are validated concurrently but appended in arrival order.
        self._turn: asyncio.Future[None] | None = None
        #: An update larger than a frame, arriving in parts.
        self._parts = UpdateParts(ctx.settings.max_update_bytes, self._reject)

    async def run(self) -> None:
        """Serve the websocket, unless a connection limit refuses it."""
        address = self.websocket.client.host if self.websocket.client else ""
        refusal = self.ctx.limits.open_connection(address)
        if refusal is not None:
            await self._refuse(refusal)
            return
        try:
            await self._serve()
        finally:
            self.ctx.limits.close_connection(address)
            if self._rate is not None and self.session is not None:
                self.ctx.limits.sessions.release(self.session)
            self._release_subject()

    async def _refuse(self, refusal: Refusal) -> None:
        """Accept only to say why not and when to come back, then close:
        browsers cannot read the status of a refused upgrade, only frames
        and close codes."""
        try:
            await self.websocket.accept()
            await self.websocket.send_text(protocol.encode(protocol.error(refusal.error)))
            await self.websocket.close(refusal.close_code)
        except Exception:  # gone already
            pass

    async def _serve(self) -> None:
        headers, settings = self.websocket.headers, self.ctx.settings
        own = own_origins(settings.public_url, settings.host, settings.port)
        if not origin_allowed(headers.get("origin"), own, settings.allowed_origins):
            log.warning("refused a browser connection from origin %s (allowed: %s and YRELAY_ALLOWED_ORIGINS; "
                        "set YRELAY_PUBLIC_URL if that is this server's own address)",
                        logs.untrusted(headers.get("origin", "")), ", ".join(sorted(own)))
            await self.websocket.close(code=4403)  # before accept: the handshake gets HTTP 403
            return
        offered = _offered_subprotocols(self.websocket)
        await self.websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        self._subprotocol_token = _token_in(offered)
        opened = time.monotonic()
        timer = asyncio.create_task(self._timer())
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self._handle_message(message)
        except (WebSocketDisconnect, WebSocketDisconnected):  # the peer left, or the server closed it
            pass
        finally:
            self.state = ConnectionState.CLOSED
            self._parts.close()
            timer.cancel()
            for task in list(self._tasks):
                task.cancel()
            # Unsubscribe locally only: the session stays tracked, so a quick
            # reconnect resumes from its offset.
            for subscription in list(self.subscriptions.values()):
                await subscription.close()
            for member in list(self.presence.values()):
                await self.ctx.presence.leave(member)
            if self.session is not None:
                self.ctx.events.emit("disconnect", session=self.session, docs=len(self.subscriptions),
                                     duration_ms=int((time.monotonic() - opened) * 1000))

    async def send(self, frame: dict[str, Any] | str) -> None:
        text = frame if isinstance(frame, str) else protocol.encode(frame)  # str: encoded once for many
        async with self._send_lock:
            await self.websocket.send_text(text)
        if not isinstance(frame, str) and frame["op"] == "error":  # shared text frames are deliveries
            self.ctx.metrics.rejected(frame["code"])

    async def _handle_message(self, message: dict[str, Any]) -> None:
        self._received = time.perf_counter()
        text = message.get("text")
        if text is None:
            await self._reject(ProtocolError(ErrorCode.MALFORMED_FRAME, "frames are JSON text, not binary"))
            return
        if len(text) > self.ctx.settings.max_frame_bytes:
            doc, clock = frame_identity(text)  # bounded by ws_max_size; names the refused update
            await self._reject(ProtocolError(
                ErrorCode.FRAME_TOO_LARGE, f"frame exceeds {self.ctx.settings.max_frame_bytes} bytes; "
                "send a larger update in parts (feature update_parts)", doc=doc, clock=clock
            ))
            return
        try:
            frame = protocol.parse_client_frame(text)
            doc = logs.doc.set(getattr(frame, "doc", None))  # log lines (and tasks started here) name it
            try:
                await self._dispatch(frame)
            finally:
                logs.doc.reset(doc)
        except ProtocolError as error:
            await self._reject(error)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("Redis error while handling a frame: %s", exc)
            await self._reject(ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; retry later"))
        except (WebSocketDisconnect, WebSocketDisconnected, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("unexpected error handling a frame")
            await self._reject(ProtocolError(ErrorCode.INTERNAL_ERROR, "internal error; the frame was not applied"))

    async def _reject(self, error: ProtocolError) -> None:
        self._parts.refused(error)  # the rest of a refused update's parts is ignored
        log.debug("rejected a frame: %s %s", error.code.value, error.message,
                  extra={"doc": error.doc} if error.doc is not None else None)
        await self.send(protocol.error(error))

    async def _dispatch(self, frame: object) -> None:
        if isinstance(frame, Hello):
            await self._hello(frame)
            return
        if self.state is not ConnectionState.OPEN:
            raise ProtocolError(ErrorCode.HANDSHAKE_REQUIRED, "send 'hello' first")
        if isinstance(frame, Update):
            await self._update(frame)
        elif isinstance(frame, Ack):
            self._subscription(frame.doc).on_ack(StreamId.parse(frame.offset))
        elif isinstance(frame, Subscribe):
            await self._subscribe(frame)
        elif isinstance(frame, Unsubscribe):
            await self._unsubscribe(frame)
        elif isinstance(frame, Sync):
            self._subscription(frame.doc).request_sync(_decode_b64(frame.state_vector, frame.doc, None))
        elif isinstance(frame, CheckSubscriptions):
            digest = await self.ctx.tracker.session_documents(self.session).digest()
            await self.send(protocol.subscriptions(digest.to_wire(), frame.ref))
        elif isinstance(frame, Reconcile):
            await self._reconcile(frame)
        elif isinstance(frame, Ping):
            await self.send(protocol.pong())
        elif isinstance(frame, Awareness):
            await self._awareness(frame)

    def _subscription(self, doc: str, clock: int | None = None) -> Subscription:
        subscription = self.subscriptions.get(doc)
        if subscription is None:
            raise ProtocolError(ErrorCode.NOT_SUBSCRIBED, "subscribe to the document first", doc=doc, clock=clock)
        return subscription

    async def _hello(self, frame: Hello) -> None:
        if self.state is not ConnectionState.AWAITING_HELLO:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, "'hello' was already sent on this connection")
        if frame.protocol != protocol.PROTOCOL_VERSION:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"protocol {frame.protocol} is not supported; use {protocol.PROTOCOL_VERSION}")
        try:
            principal = await self.ctx.authenticator.authenticate(frame.token or self._subprotocol_token,
                                                                  self.websocket.headers)
        except AuthError as exc:
            await self._cut_off(str(exc))
            return
        if self.ctx.revocations.is_revoked(principal.token_id):
            await self._cut_off("the token was revoked")
            return
        self.principal = principal
        self.session, resumed = await self.ctx.sessions.open(frame.session, owner=principal.subject)
        logs.session.set(self.session)  # this task's context: every later line and task carries it
        self._rate = self.ctx.limits.sessions.acquire(self.session)
        self.state = ConnectionState.OPEN
        self.ctx.events.emit("connect", session=self.session, resumed=resumed)
        auth = {"mode": _auth_mode(self.ctx.authenticator), "subject": principal.subject,
                "permission": principal.permission.value}
        await self.send(protocol.welcome(self.session, resumed, self.ctx.settings.client_limits(), auth))

    async def _cut_off(self, reason: str, code: ErrorCode = ErrorCode.UNAUTHORIZED,
                       close_code: int = CLOSE_UNAUTHORIZED) -> None:
        """Refuse or end the session: say why, then close (4401 by default; docs/security.md)."""
        self.state = ConnectionState.CLOSED
        await self._safe_send(protocol.error(ProtocolError(code, reason)))
        with contextlib.suppress(Exception):
            await self.websocket.close(code=close_code, reason=reason[:120])

    async def _check_token(self) -> None:
        """Cut the connection off when its token expired (``auth_leeway`` past
        its expiry, as ``hello`` allows) or was revoked (the revoked list
        itself is refreshed every ``revocation_refresh``)."""
        principal = self.principal
        if principal is None or self.state is not ConnectionState.OPEN:
            return
        if principal.expires_at is not None and time.time() > principal.expires_at + self.ctx.settings.auth_leeway:
            await self._cut_off("the token has expired")
        elif self.ctx.revocations.is_revoked(principal.token_id):
            await self._cut_off("the token was revoked")

    async def _subscribe(self, frame: Subscribe) -> None:
        assert self.session is not None and self.principal is not None
        if not self.principal.can_read(frame.doc):
            raise ProtocolError(ErrorCode.FORBIDDEN, "this token does not allow this document", doc=frame.doc)
        requested = StreamId.parse(frame.offset) if frame.offset is not None else None
        claimed = _claimed(frame)
        old = self.subscriptions.pop(frame.doc, None)
        if old is not None:
            await old.close()
        elif len(self.subscriptions) >= self.ctx.settings.max_docs_per_connection:
            raise ProtocolError(
                ErrorCode.MALFORMED_FRAME,
                f"at most {self.ctx.settings.max_docs_per_connection} documents per connection",
                doc=frame.doc,
            )
        elif not await self.ctx.limits.subjects.open_subscription(self._subject_buckets().subject):
            raise ProtocolError(ErrorCode.TOO_MANY_SUBSCRIPTIONS, f"at most "
                                f"{self.ctx.settings.max_subscriptions_per_subject} live subscriptions per user, "
                                "all connections together; unsubscribe from some", doc=frame.doc)
        self._join_presence(frame.doc)
        subscription = Subscription(self.ctx, frame.doc, self.session, self._document_sender(frame.doc), requested,
                                    claimed, budget=self.budget)
        self.subscriptions[frame.doc] = subscription
        subscription.start()

    async def _unsubscribe(self, frame: Unsubscribe) -> None:
        assert self.session is not None
        subscription = self.subscriptions.pop(frame.doc, None)
        if subscription is not None:
            await subscription.close()
            self.ctx.limits.subjects.close_subscription(self._subject_buckets().subject)
        member = self.presence.pop(frame.doc, None)
        if member is not None:
            await self.ctx.presence.leave(member)
        await self.ctx.tracker.untrack(frame.doc, self.session)
        await self.send(protocol.unsubscribed(frame.doc))

    def _join_presence(self, doc: str) -> None:
        member = self.presence.get(doc)
        if member is None:
            assert self.session is not None
            self.presence[doc] = self.ctx.presence.join(doc, self.session, self.send, self._presence_owner())
        else:
            member.listening = False  # subscribing again: greeted again once answered

    def _document_sender(self, doc: str) -> Send:
        """The subscription's send, which greets the connection's presence
        on ``doc`` once the subscribe is answered (the states of the others
        follow `subscribed` or `resync_required`, never precede it)."""
        async def send(frame: dict[str, Any] | str) -> None:
            await self.send(frame)
            member = self.presence.get(doc)
            if member is not None and not member.listening and isinstance(frame, dict) and frame["op"] in _ANSWERS:
                self._spawn(self.ctx.presence.greet(member))
        return send

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _awareness(self, frame: Awareness) -> None:
        """Relay a presence update; never stored in the document's stream.
        Over a limit: an error, nothing stored or relayed."""
        self._subscription(frame.doc)
        settings = self.ctx.settings
        if not self._presence_rate.take():
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {settings.presence_per_second:g} awareness updates/s "
                                "on this connection", doc=frame.doc, retry_after_ms=self._presence_rate.retry_after_ms())
        wait = await self._subject_buckets().presence.take()
        if wait is not None:
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {settings.subject_presence_per_second:g} awareness "
                                "updates/s for this user, all connections together", doc=frame.doc, retry_after_ms=wait)
        data = _decode_limited(frame.update, settings.max_awareness_bytes, ErrorCode.AWARENESS_TOO_LARGE,
                               frame.doc, None)
        try:
            entries = awareness.decode_update(data)
        except awareness.AwarenessError as exc:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"awareness update: {exc}", doc=frame.doc) from None
        member = self.presence[frame.doc]
        if member.clients_after(entries) > settings.max_presence_clients_per_connection:
            raise ProtocolError(ErrorCode.AWARENESS_TOO_MANY_CLIENTS, f"at most "
                                f"{settings.max_presence_clients_per_connection} clientIDs per connection and document",
                                doc=frame.doc)
        try:
            await self.ctx.presence.update(member, entries)
        except NotOwner as exc:
            raise ProtocolError(ErrorCode.AWARENESS_NOT_OWNER, str(exc), doc=frame.doc) from None
        except PresenceFull as exc:
            raise ProtocolError(ErrorCode.AWARENESS_TOO_MANY_CLIENTS, str(exc), doc=frame.doc) from None

    def _subject_buckets(self) -> SubjectBuckets:
        """The deployment-wide limits of who is connected: the token's
        subject, or with auth off the client address (docs/operations.md#limits)."""
        if self._subject is None:
            if isinstance(self.ctx.authenticator, NoAuthenticator) or self.principal is None:
                identity = "addr:" + (self.websocket.client.host if self.websocket.client else "")
            else:
                identity = "sub:" + self.principal.subject
            self._subject = self.ctx.limits.subjects.acquire(subject_id(identity))
        return self._subject

    def _release_subject(self) -> None:
        if self._subject is not None:
            subjects = self.ctx.limits.subjects
            if self.subscriptions:
                subjects.close_subscription(self._subject.subject, len(self.subscriptions))
            subjects.release(self._subject.subject)
            self._subject = None

    def _presence_owner(self) -> str:
        """Who may take this connection's clientIDs over: its subject's
        other connections, or with auth off its session's."""
        assert self.session is not None and self.principal is not None
        if isinstance(self.ctx.authenticator, NoAuthenticator):
            return subject_id("session:" + self.session)
        return subject_id("sub:" + self.principal.subject)

    async def _reconcile(self, frame: Reconcile) -> None:
        """Answer one range-reconciliation request over the documents that
        track this session (stateless: the client drives the rounds)."""
        assert self.session is not None
        request = _decode_b64(frame.payload, None, None)
        try:
            reply = await respond(self.ctx.tracker.session_documents(self.session), request)
        except MalformedMessage as exc:
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"reconcile payload: {str(exc)[:200]}") from None
        await self.send(protocol.reconcile_reply(reply, frame.ref))

    async def _update(self, frame: Update) -> None:
        assert self.session is not None and self.principal is not None
        if not self.principal.can_write(frame.doc):
            raise ProtocolError(ErrorCode.FORBIDDEN, "read-only: this token may not change this document",
                                doc=frame.doc, clock=frame.clock)
        self._subscription(frame.doc, frame.clock)
        if self._parts.ignored(frame):  # the rest of a refused update's parts
            return
        assert self._rate is not None
        if not self._rate.take():  # not stored; the client resends after retry_after_ms
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {self.ctx.settings.updates_per_second:g} updates/s",
                                doc=frame.doc, clock=frame.clock, retry_after_ms=self._rate.retry_after_ms())
        wait = await self._subject_buckets().updates.take()  # no Redis call for most updates: quotas.py
        if wait is not None:
            raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {self.ctx.settings.subject_updates_per_second:g} "
                                "updates/s for this user, all connections together", doc=frame.doc, clock=frame.clock,
                                retry_after_ms=wait)
        update = _decode_limited(frame.update, self.ctx.settings.max_update_bytes, ErrorCode.UPDATE_TOO_LARGE,
                                 frame.doc, frame.clock)
        update = await self._parts.feed(frame, update)  # None until the last part of an update in parts
        if update is None:
            return
        # A small update is read struct by struct here (a few us): that read is
        # also the layout check, so the validator skips its own in-loop one.
        reading = _read_layout_and_needs(update) if len(update) <= _READ_IN_LOOP_BYTES else None
        try:
            if isinstance(reading, Exception):
                raise reading
            verdict = self.ctx.validator.submit(update, layout_checked=reading is not None)
        except crdt.InvalidUpdate as exc:
            raise ProtocolError(ErrorCode.INVALID_UPDATE, str(exc), doc=frame.doc, clock=frame.clock) from None
        received = self._received
        await self._inflight.acquire(len(update))
        previous, self._turn = self._turn, asyncio.get_running_loop().create_future()
        self._spawn(self._append_when_valid(frame, update, verdict, reading, previous, self._turn, received))

    async def _append_when_valid(self, frame: Update, update: bytes, verdict: asyncio.Future[Exception | None],
                                 reading: tuple[Layout, Needs] | None, previous: asyncio.Future[None] | None,
                                 turn: asyncio.Future[None], received: float) -> None:
        """Wait for the validator and, for a large update, its causal reading
        in a thread (while the next frames are read), then for the update
        received before this one, then append."""
        assert self.session is not None
        try:
            if reading is None:
                reading = await asyncio.to_thread(_read_layout_and_needs, update)
            error = await verdict
            if error is None and isinstance(reading, Exception):
                error = reading
            if previous is not None:
                await previous
            if error is None:
                layout, needs = reading
                future = self.ctx.appender.submit(frame.doc, self.session, frame.clock, update, needs,
                                                  sync_layout=layout if frame.sync else None)
        except BaseException:
            self._inflight.release(len(update))
            raise
        finally:
            if not turn.done():
                turn.set_result(None)
        if error is None:
            await self._confirm(frame, future, len(update), received)
            return
        self._inflight.release(len(update))
        if isinstance(error, ValidatorUnavailable):
            error = ProtocolError(ErrorCode.UNAVAILABLE, "the update could not be checked; resend it",
                                  doc=frame.doc, clock=frame.clock)
        else:
            error = ProtocolError(ErrorCode.INVALID_UPDATE, str(error), doc=frame.doc, clock=frame.clock)
        await self._safe_send(protocol.error(error))

    async def _confirm(self, frame: Update, future: asyncio.Future[AppendResult], size: int,
                       received: float) -> None:
        """Ack an update once (and only once) the append script returned."""
        try:
            result = await future
        except asyncio.CancelledError:
            raise
        except NotAdmitted as refused:
            await self._safe_send(protocol.error(ProtocolError(
                ErrorCode.MISSING_DEPENDENCY,
                "not stored: the document lacks content this update builds on; send earlier updates first",
                doc=frame.doc, clock=frame.clock, missing=refused.lacking)))
            self.ctx.events.emit("refuse", frame.doc, self.session, clock=frame.clock,
                                 missing={str(c): k for c, k in refused.lacking.items()})
            return
        except Exception as exc:
            log.warning("append of %s clock %s failed: %s", frame.doc, frame.clock, exc)
            await self._safe_send(protocol.error(ProtocolError(
                ErrorCode.UNAVAILABLE, "the update was not stored; resend it", doc=frame.doc, clock=frame.clock
            )))
            return
        finally:
            self._inflight.release(size)
        entry_id, duplicate = result.entry_id, result.duplicate
        await self._safe_send(protocol.appended(frame.doc, frame.clock, entry_id, duplicate, result.dropped))
        if entry_id is None:
            return
        self.ctx.metrics.appended(time.perf_counter() - received)
        self.ctx.events.emit("append", frame.doc, self.session, offset=entry_id, clock=frame.clock,
                             bytes=size, duplicate=duplicate)

    async def _safe_send(self, frame: dict[str, Any]) -> None:
        try:
            await self.send(frame)
        except Exception:  # the socket is gone; the client resends unacked updates
            pass

    async def _timer(self) -> None:
        """The connection's one periodic task (a task per connection costs
        memory): the ``hello`` deadline, resends of quiet documents, and the
        token's expiry and revocation. A failing tick is logged and the next
        one runs: these checks must not end silently."""
        settings = self.ctx.settings
        hello_by = time.monotonic() + settings.hello_timeout
        while self.state is not ConnectionState.CLOSED:
            await asyncio.sleep(settings.resend_check_interval)
            if (self.state is ConnectionState.AWAITING_HELLO and settings.hello_timeout > 0
                    and time.monotonic() >= hello_by):
                await self._cut_off(f"no 'hello' within {settings.hello_timeout:g} s",
                                    ErrorCode.HANDSHAKE_REQUIRED, CLOSE_HELLO_TIMEOUT)
                return
            try:
                for subscription in list(self.subscriptions.values()):
                    subscription.check_resend()
            except Exception:
                log.exception("the resend check failed; the token check and the next tick still run")
            try:
                await self._check_token()
            except Exception:
                log.exception("the token check failed; it runs again next tick")


#: Updates up to this size are read causally on the event loop (a few us,
#: and the read doubles as the layout check); larger ones in a thread, so a
#: 16 MiB paste does not stall other sockets.
_READ_IN_LOOP_BYTES = 64 * 1024


def _read_layout_and_needs(update: bytes) -> tuple[Layout, Needs] | Exception:
    """The update's structs and what the document must hold to apply it, or
    why it can never apply (an ``InvalidUpdate``)."""
    try:
        layout = read_layout(update)
        return layout, needs_of(layout)
    except MalformedUpdate as exc:
        return crdt.InvalidUpdate(f"not a Yjs update: {exc}")


def _claimed(frame: Subscribe) -> WindowDigest | None:
    """The client's drift digest, meaningful only with an offset to end its window."""
    if frame.digest is None or frame.offset is None:
        return None
    since, offset = StreamId.parse(frame.digest.since), StreamId.parse(frame.offset)
    through = StreamId.parse(frame.digest.through) if frame.digest.through is not None else offset
    if since > offset or through < offset:
        raise ProtocolError(ErrorCode.INVALID_OFFSET, "digest needs since <= offset <= through", doc=frame.doc)
    digest = Digest(count=frame.digest.count, hash=int(frame.digest.hash, 16))
    return WindowDigest(since, offset, digest, through)


def _decode_limited(text: str, limit: int, code: ErrorCode, doc: str, clock: int | None) -> bytes:
    """Base64 of at most ``limit`` bytes; the length is checked before decoding."""
    what = code.value.removesuffix("_too_large")
    too_large = ProtocolError(code, f"{what} exceeds {limit} bytes", doc=doc, clock=clock)
    if len(text) > (limit + 2) // 3 * 4:  # base64 length of `limit` bytes
        raise too_large
    data = _decode_b64(text, doc, clock)
    if len(data) > limit:
        raise too_large
    return data


def _decode_b64(text: str, doc: str | None, clock: int | None) -> bytes:
    try:
        return protocol.b64decode(text)
    except ValueError:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, "payload is not valid base64", doc=doc, clock=clock) from None


def _offered_subprotocols(websocket: WebSocket) -> list[str]:
    raw = websocket.headers.get("sec-websocket-protocol", "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def _token_in(offered: list[str]) -> str | None:
    for protocol_name in offered:
        if protocol_name.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return protocol_name[len(TOKEN_SUBPROTOCOL_PREFIX):] or None
    return None


def _auth_mode(authenticator: Authenticator) -> str:
    if isinstance(authenticator, NoAuthenticator):
        return "disabled"
    return "jwt" if isinstance(authenticator, JwtAuthenticator) else "custom"
