"""One connection's subscription to one document: its state machine and
the task that sends everything about the document.

Every frame about this document is sent by the subscription's own pump task,
so a catch-up, a live batch, a resend and a sync answer can never interleave;
the one exception is a live batch for a caught-up subscriber whose pump has
nothing to do (idle or parked), which the fan-out's dispatch sends itself
(:meth:`.sending.Sender.deliver_now`): no frame of the pump can be under way then.
The parts: :mod:`.sending` (cursor, pending fan-out batches, stream pages,
deliver frames), :mod:`.acks` (what was sent and acked, what the tracker
holds, the resend clock), :mod:`.resync` (where a resubscribing client
resumes, sync answers). A consumer that does not read holds the pump in its
socket send: nothing queues up behind it but what the caps allow.

Calls go one way: the connection calls the subscription; the subscription
calls the fan-out's ``register``/``unregister``, and the fan-out and the
ack path call back only through their small protocols
(:class:`.fanout.Subscriber`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Protocol

from yrelay.app.core.acks import AckWindow
from yrelay.app.core.peer import Peer
from yrelay.app.core.resync import Resume, answer_from_current_stream, resume_point
from yrelay.app.core.sending import Sender
from yrelay.app.fanout import Batch
from yrelay.app.limits import DeliveryBudget
from yrelay.backoff import Reconnect
from yrelay.observability import logs
from yrelay.protocol import ErrorCode, ProtocolError, ResyncReason
from yrelay.reconciliation.digest import Digest
from yrelay.reconciliation.stream_digest import WindowDigest
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import HistoryTrimmed, StreamRewound
from yrelay.storage.tombstones import DocumentDeleted
from yrelay.tasks import BackgroundTask, lost_redis
from yrelay.transport.lean import Kick
from yrelay.yjs import crdt
from yrelay.yjs.engine_pool import EngineFailed

if TYPE_CHECKING:
    from yrelay.app.core.services import ReadServices

log = logging.getLogger(__name__)


class SubscriptionState(enum.Enum):
    STARTING = "starting"  # registered, first frames not sent yet
    LIVE = "live"  # sending from the cursor on
    RESYNC_REQUIRED = "resync_required"  # waiting for the client's sync frame
    CLOSED = "closed"


_TRANSITIONS = {
    SubscriptionState.STARTING: {SubscriptionState.LIVE, SubscriptionState.RESYNC_REQUIRED, SubscriptionState.CLOSED},
    SubscriptionState.LIVE: {SubscriptionState.RESYNC_REQUIRED, SubscriptionState.CLOSED},
    SubscriptionState.RESYNC_REQUIRED: {SubscriptionState.LIVE, SubscriptionState.CLOSED},
    SubscriptionState.CLOSED: set(),
}


class Owner(Protocol):
    """What a subscription tells the connection it belongs to
    (:class:`.documents.ConnectionDocuments`)."""

    def answered(self, doc: str) -> None:
        """The subscribe was answered (presence greets the client now)."""

    def booked(self, nbytes: int) -> None:
        """Bytes sent that answer a request (the connection's answer rates)."""

    async def deleted(self, doc: str) -> None:
        """The client was told the document was deleted; the subscription ended."""


class Subscription:
    """``peer`` is told everything about the document, in order
    (:class:`.peer.Peer`); ``owner`` that the subscribe was answered
    (presence greets the client then), the bytes of what answers the
    subscribe or a sync (the connection's answer rates) and that the
    document was deleted. ``tracked`` (the ``/ws`` policy): the client acks, the tracker
    holds its offset, and the subscription starts from ``requested``
    (``subscribed``, or a snapshot); untracked (``/yws``): nothing pins the
    stream, nothing is acked, and the subscription waits for the client's
    state vector (:meth:`request_sync`) before it sends anything."""

    __slots__ = (
        "services",
        "doc",
        "session",
        "_peer",
        "_owner",
        "tracked",
        "_requested",
        "_claimed",
        "state",
        "_window",
        "_sender",
        "_synced_at",
        "_sync_vector",
        "_failure",
        "_evicted",
        "_rewound",
        "_wake",
        "_pump",
        "_offered",
        "_deliver_inline",
        "__weakref__",
    )

    def __init__(
        self,
        services: ReadServices,
        doc: str,
        session: str,
        peer: Peer,
        requested: StreamId | None,
        claimed: WindowDigest | None = None,
        budget: DeliveryBudget | None = None,
        *,
        owner: Owner,
        tracked: bool = True,
        deliver_now: bool = False,
    ):
        self.services = services
        self.doc = doc
        self.session = session
        self._peer = peer
        self._owner = owner
        self.tracked = tracked
        self._requested = requested
        #: The client's drift digest over (claimed.since, requested], if it sent one.
        self._claimed = claimed
        self.state = SubscriptionState.STARTING
        #: Shared with the connection's other subscriptions (unacked entries).
        self._window = AckWindow(doc, session, services.ack_writer, budget or DeliveryBudget(0))
        self._sender = Sender(services, doc, session, peer, self._window, self, tracked)
        #: The document's last id when the subscribe was answered: once the
        #: cursor reaches it, the client holds the server's state (``synced``).
        self._synced_at: StreamId | None = None
        self._sync_vector: bytes | None = None
        self._failure: str | None = None
        self._evicted = False
        #: The stream lost entries this process had seen (:mod:`yrelay.storage.rewind`).
        self._rewound = False
        #: Work to do: setting it starts the pump, which runs while there is
        #: work and then ends; an idle subscription has no task (issue 20).
        self._wake = Kick(self._pump_if_open)
        self._pump = BackgroundTask(f"yrelay-sub-{doc}", self._run, kind="yrelay-subscription")
        #: The fan-out offered a batch since the pump last parked (it parks only then).
        self._offered = False
        #: The codec may write a caught-up delivery from the fan-out's dispatch (:meth:`.peer.Peer.deliver_now`).
        self._deliver_inline = deliver_now

    # ------------------------------------------------------------ lifecycle

    def _move(self, new: SubscriptionState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"subscription {self.doc}: {self.state.value} -> {new.value} is not allowed")
        self.state = new

    def start(self) -> None:
        self._wake.set()

    def _pump_if_open(self) -> None:
        if self.state is not SubscriptionState.CLOSED:
            self._pump.start()  # nothing when it runs already: it sees the work before it ends

    async def close(self) -> None:
        """Stop delivering. The pump stops first, then the fan-out forgets
        this subscription: a pump cancelled inside the fan-out's ``register``
        (a socket reset right after it opened) may still finish it, since
        redis-py can swallow that cancel, and an unregister before would
        leave it fed and read forever."""
        if self.state is not SubscriptionState.CLOSED:
            self._move(SubscriptionState.CLOSED)
        await self._pump.stop()
        self.services.fanout.unregister(self)
        self._window.close()

    @property
    def cursor(self) -> StreamId:
        """Every entry up to here was sent, or skipped as the session's own."""
        return self._sender.cursor

    @property
    def acked(self) -> StreamId:
        """The client's cumulative ack."""
        return self._window.acked

    @property
    def unacked(self) -> int:
        """Entries sent and not acked yet."""
        return len(self._window)

    @property
    def resends(self) -> int:
        return self._window.resends

    @property
    def answering(self) -> bool:
        """Still sending what its subscribe asked for: the snapshot and the
        entries up to ``synced`` (what the connection's answer rates count)."""
        return self.state is SubscriptionState.STARTING or self._synced_at is not None

    # ------------------------------------------------------ called by others

    def offer(self, batch: Batch) -> None:
        """A batch from the fan-out (synchronous: called for every subscriber)."""
        if self.state not in (SubscriptionState.LIVE, SubscriptionState.STARTING):
            return  # read back from the stream once live again
        if self._deliver_inline and self._pump_idle() and self._deliver_now(batch):
            return  # sent from here: a caught-up subscriber's pump is not woken
        self._sender.pending.offer(batch)  # a slow consumer catches up from the stream instead
        self._offered = True
        self._wake.set()

    def _deliver_now(self, batch: Batch) -> bool:
        """:meth:`.sending.Sender.deliver_now`, from inside the fan-out's
        dispatch: an error must not stop the dispatch to the document's
        other subscribers (the pump then sends the batch)."""
        try:
            return self._sender.deliver_now(batch)
        except Exception:
            log.exception("document %s: inline delivery failed; the pump sends the batch", self.doc)
            return False

    def _pump_idle(self) -> bool:
        """Live, with nothing for the pump to do and no step of it under way
        (parked or ended): a frame sent from outside cannot overtake one of its."""
        return (
            self.state is SubscriptionState.LIVE
            and not self._wake.is_set()
            and self._synced_at is None
            and (self._wake.parked or not self._pump.running)
        )

    def document_failed(self, reason: str) -> None:
        self._failure = reason
        self._wake.set()

    def stream_rewound(self) -> None:
        """The document's stream went back (a failover to a replica that
        lagged): the client may hold entries, its own or delivered, that the
        server lost. It resyncs as a resubscribe ahead of the stream would:
        the two-way exchange gives the server back what it lacks. (One still
        starting may have resumed from what it read before: it resyncs once live.)"""
        if self.state in (SubscriptionState.LIVE, SubscriptionState.STARTING):
            self._rewound = True
            self._wake.set()

    def evicted(self) -> None:
        """The tracker no longer holds this session (an ack found it gone)."""
        if self.state is SubscriptionState.LIVE:
            self._evicted = True
            self._wake.set()

    def on_ack(self, offset: StreamId) -> None:
        """The client holds everything up to ``offset``."""
        offset = min(offset, self.cursor)  # it cannot hold what was never sent
        self.services.events.emit("ack", self.doc, self.session, offset=str(offset), head=str(self._sender.head()))
        self._window.ack(offset, self.cursor)
        if self._sender.has_work():  # an ack only matters to a pump that waits for it
            self._wake.set()

    def request_sync(self, state_vector: bytes) -> None:
        self._sync_vector = state_vector
        self._wake.set()

    def check_resend(self) -> None:
        """Called periodically: resend when the document went quiet; a pump
        parked through a whole period without work ends."""
        if self.state is SubscriptionState.LIVE and self._window.resend_due(self.services.settings.resend_after):
            self._wake.set()
        self._wake.release_if_quiet()

    # ------------------------------------------------------------ the pump

    async def _run(self) -> None:
        logs.doc.set(self.doc)  # this task's own context
        logs.session.set(self.session)
        reconnect = Reconnect()  # a run ends only once a step succeeded: its backoff is this run's
        loop = asyncio.get_running_loop()
        try:
            while await self._work(reconnect) and await self._linger(loop):
                pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the pump's task boundary: the socket closed under us, most likely
            if self.state is not SubscriptionState.CLOSED:  # else: closed while a step was finishing
                log.warning("subscription %s stopped: %r", self.doc, exc)

    async def _work(self, reconnect: Reconnect) -> bool:
        """Steps while there is work; False once closed."""
        while self.state is not SubscriptionState.CLOSED and self._wake.is_set():
            self._wake.clear()
            try:
                if self.state is SubscriptionState.STARTING:  # retried like any step while Redis is away
                    await self.services.fanout.register(self)
                    await self._start()
                else:
                    await self._step()
                reconnect.succeeded()
            except HistoryTrimmed:
                await self._require_resync(ResyncReason.TRIMMED)
            except StreamRewound as exc:
                log.warning("document %s: %s; the client resyncs", self.doc, exc)
                await self._require_resync(ResyncReason.AHEAD)
            except DocumentDeleted:
                await self._deleted()
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.warning("document %s: Redis error %r; retrying", self.doc, exc)
                await self._error(ErrorCode.UNAVAILABLE, "storage unavailable; retrying")
                await reconnect.wait()
                self._wake.set()
        return self.state is not SubscriptionState.CLOSED

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> bool:
        """While the document is busy (the fan-out offered a batch since the
        last park), keep this task parked for the next batch instead of
        ending it and making a new one per batch; a tick without work ends
        the park (:meth:`check_resend`), so an idle subscription has no task.
        True: there is work again."""
        if not self._offered:
            return False
        self._offered = False
        return await self._wake.park(loop) or self._wake.is_set()

    async def _start(self) -> None:
        if not self.tracked:  # the client's state vector comes first (request_sync)
            self._move(SubscriptionState.RESYNC_REQUIRED)
            self._owner.answered(self.doc)
            if self._sync_vector is not None:  # it came while this started
                self._wake.set()
            return
        if self._requested is None:
            self._sender.own_visible_through = self._synced_at = await self.services.store.last_id(self.doc)
            snapshot = await self.services.store.load_snapshot(self.doc)
            await self._go_live(Resume(snapshot.offset, WindowDigest(snapshot.offset, snapshot.offset, Digest())))
            if snapshot.update:
                self._owner.booked(await self._peer.snapshot(self.doc, snapshot.offset, snapshot.update))
            return
        last = self._synced_at = await self.services.store.last_id(self.doc)
        point = await resume_point(self.services, self.doc, self.session, self._requested, self._claimed, last)
        if isinstance(point, Resume):
            await self._go_live(point)
        else:
            await self._require_resync(point)

    async def _go_live(self, point: Resume) -> None:
        await self.services.tracker.track(self.doc, self.session, point.offset)
        self._sender.cursor = point.offset
        self._window.restart(point.offset)
        self._move(SubscriptionState.LIVE)
        await self._peer.subscribed(self.doc, point.offset, point.window)
        self._owner.answered(self.doc)
        self._wake.set()

    async def _step(self) -> None:
        if self._evicted:
            self._evicted = False
            if self.state is SubscriptionState.LIVE:
                await self._require_resync(ResyncReason.EVICTED)
        if self._rewound:
            self._rewound = False
            if self.state is SubscriptionState.LIVE:
                await self._require_resync(ResyncReason.AHEAD)
        if self._failure is not None:
            reason, self._failure = self._failure, None
            await self._error(ErrorCode.DOCUMENT_UNAVAILABLE, f"document cannot be read: {reason[:200]}")
        if self._sync_vector is not None:
            await self._answer_sync()
        while self.state is SubscriptionState.LIVE and await self._sender.send_more(self._wake.set):
            pass
        if self._synced_at is not None and self.state is SubscriptionState.LIVE and self.cursor >= self._synced_at:
            await self._send_synced(self._synced_at)  # the cursor covers the session's own entries too

    # ------------------------------------------------------ resync and sync

    async def _require_resync(self, reason: ResyncReason) -> None:
        log.info("resync required: %s", reason.value)
        if self.tracked:
            self.services.events.emit(
                "resync",
                self.doc,
                self.session,
                reason=reason.value,
                offset=None if self._requested is None else str(self._requested),
            )
        self._move(SubscriptionState.RESYNC_REQUIRED)
        self._synced_at = None  # sent after the sync reply instead
        self._sender.pending.clear()
        self._window.drop()
        await self._peer.resync_required(self.doc, reason)
        self._owner.answered(self.doc)

    async def _answer_sync(self) -> None:
        """Two-way state-vector exchange (:func:`.resync.answer_from_current_stream`): send
        what the client lacks, with the server's state vector so the client
        can send back what the server lacks."""
        state_vector = self._sync_vector
        assert state_vector is not None
        try:
            answer = await answer_from_current_stream(
                self.services, self.doc, self.session if self.tracked else None, state_vector
            )
        except (crdt.InvalidUpdate, EngineFailed) as exc:
            self._sync_vector = None
            if isinstance(exc, EngineFailed):
                log.warning("document %s: sync answer failed: %s", self.doc, exc)
                await self._error(ErrorCode.DOCUMENT_UNAVAILABLE, "the sync answer could not be computed")
            else:
                await self._error(ErrorCode.MALFORMED_FRAME, "state_vector is not a Yjs state vector")
            return
        # Taken only now: a Redis error above leaves the request pending and the
        # pump's retry answers it (the client sends its sync once and waits).
        if self._sync_vector is state_vector:
            self._sync_vector = None
        offset = answer.offset
        self.live_from(offset)
        self._owner.booked(await self._peer.sync_answer(self.doc, offset, answer.diff, answer.state_vector))
        await self._send_synced(offset)

    def live_from(self, offset: StreamId) -> None:
        """The client holds the document up to ``offset`` (a sync answer's):
        send what follows."""
        self._sender.restart(offset)
        self._window.restart(offset)
        if self.state is SubscriptionState.RESYNC_REQUIRED:
            self._move(SubscriptionState.LIVE)
        self._wake.set()

    async def _send_synced(self, offset: StreamId) -> None:
        """The client has been sent everything admitted up to ``offset``
        (feature ``synced``); a sync answer also settles a pending subscribe's."""
        self._synced_at = None
        await self._peer.synced(self.doc, offset)

    async def _deleted(self) -> None:
        """The document was deleted (its marker was read): say so, end the
        subscription (from inside its own pump: close only forgets the task)."""
        if self.tracked:
            self.services.events.emit("deleted", self.doc, self.session)
        await self._error(ErrorCode.DOCUMENT_DELETED, "the document was deleted; subscribe again for a new, empty one")
        await self.close()
        await self._owner.deleted(self.doc)

    async def _error(self, code: ErrorCode, message: str) -> None:
        await self._peer.refused(ProtocolError(code, message, doc=self.doc))

    def book_delivery(self, nbytes: int) -> None:
        """Deliveries count against the answer rates while they answer the subscribe."""
        if self.answering:
            self._owner.booked(nbytes)


__all__ = ["Subscription", "SubscriptionState"]
