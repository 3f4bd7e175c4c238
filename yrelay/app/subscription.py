"""One connection's subscription to one document: what was sent, what was
acked, and the task that sends everything else.

Every frame about this document is sent by the subscription's own pump task,
so a catch-up, a live batch, a resend and a sync answer can never interleave.
Entries come from two places: batches the process-wide fan-out offers (shared
by all subscribers, encoded once), and pages read from the stream when the
subscription is behind the fan-out (new subscriber, resend, slow consumer).
Memory per subscription is bounded: pending batches are capped in number and
bytes (on overflow they are dropped and read back from the stream), a
catch-up page asks for fewer entries when they are large (``max_page_bytes``),
and at most ``max_unacked_entries`` (and, with the connection's other
documents, ``max_unacked_per_connection``) are in flight before sending
pauses for acks. A consumer that does not read holds the pump in its socket
send: nothing queues up behind it but what the caps allow.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis.exceptions

from .. import crdt, logs, protocol
from ..offsets import StreamId
from ..protocol import ErrorCode, ProtocolError, ResyncReason
from ..reconciliation.digest import Digest
from ..reconciliation.stream_digest import WindowDigest
from ..store import Entry, HistoryTrimmed
from .fanout import Batch
from . import sizing
from .limits import DeliveryBudget

if TYPE_CHECKING:
    from .context import ServerContext

log = logging.getLogger(__name__)

MAX_PENDING_BATCHES = 64

#: Sends a frame, or a frame already encoded (a deliver shared by many subscribers).
Send = Callable[[dict[str, Any] | str], Awaitable[None]]


class PendingBatches:
    """Fan-out batches waiting for the socket, capped in number and bytes."""

    def __init__(self, max_bytes: int, max_batches: int = MAX_PENDING_BATCHES):
        self.max_bytes = max_bytes
        self.max_batches = max_batches
        self._batches: deque[Batch] = deque()
        self.bytes = 0

    def offer(self, batch: Batch) -> bool:
        """Queue ``batch``; on overflow drop everything instead (False): the
        subscription then reads what it missed back from the stream."""
        if len(self._batches) >= self.max_batches or self.bytes + batch.nbytes > self.max_bytes:
            self.clear()
            return False
        self._batches.append(batch)
        self.bytes += batch.nbytes
        return True

    def popleft(self) -> Batch:
        batch = self._batches.popleft()
        self.bytes -= batch.nbytes
        return batch

    def appendleft(self, batch: Batch) -> None:
        self._batches.appendleft(batch)
        self.bytes += batch.nbytes

    def clear(self) -> None:
        self._batches.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._batches)


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


class Subscription:
    def __init__(
        self,
        ctx: "ServerContext",
        doc: str,
        session: str,
        send: Send,
        requested: StreamId | None,
        claimed: WindowDigest | None = None,
        budget: DeliveryBudget | None = None,
    ):
        self.ctx = ctx
        self.doc = doc
        self.session = session
        self._send = send
        self._requested = requested
        #: The client's drift digest over (claimed.since, requested], if it sent one.
        self._claimed = claimed
        self.state = SubscriptionState.STARTING
        #: Every entry up to the cursor was sent, or skipped as the session's own.
        self.cursor = StreamId(0, 0)
        #: The client's cumulative ack.
        self.acked = StreamId(0, 0)
        #: What the tracker was last told this session holds.
        self.tracked = StreamId(0, 0)
        #: A subscriber that holds nothing gets the session's own entries up
        #: to here too (written before this subscribe, e.g. by an earlier
        #: binding of the document); past it, never its own.
        self._own_visible_through = StreamId(0, 0)
        #: The document's last id when the subscribe was answered: once the
        #: cursor reaches it, the client holds the server's state (``synced``).
        self._synced_at: StreamId | None = None
        self._sent: deque[StreamId] = deque()  # sent, not yet acked, in order
        #: Shared by the connection's subscriptions; ``_counted`` is our part.
        self._budget = budget or DeliveryBudget(0)
        self._counted = 0
        #: Entries per catch-up read: grows while entries are small.
        self._page_count = sizing.first_count(ctx.settings.page_size, ctx.settings.max_page_bytes)
        self._unacked_since: float | None = None
        self._pending = PendingBatches(ctx.settings.max_pending_bytes)
        self._sync_vector: bytes | None = None
        self._failure: str | None = None
        self._evicted = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.resends = 0
        self.drift_detected = 0

    # ------------------------------------------------------------ lifecycle

    def _move(self, new: SubscriptionState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"subscription {self.doc}: {self.state.value} -> {new.value} is not allowed")
        self.state = new

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"yrelay-sub-{self.doc}")

    async def close(self) -> None:
        if self.state is not SubscriptionState.CLOSED:
            self._move(SubscriptionState.CLOSED)
        self.ctx.fanout.unregister(self)
        self._sent.clear()
        self._count_sent()
        self._budget.forget(id(self))
        if self._task and self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def unacked(self) -> int:
        """Entries sent and not acked yet."""
        return len(self._sent)

    # ------------------------------------------------------ called by others

    def offer(self, batch: Batch) -> None:
        """A batch from the fan-out (synchronous: called for every subscriber)."""
        if self.state not in (SubscriptionState.LIVE, SubscriptionState.STARTING):
            return  # read back from the stream once live again
        self._pending.offer(batch)  # a slow consumer catches up from the stream instead
        self._wake.set()

    def document_failed(self, reason: str) -> None:
        self._failure = reason
        self._wake.set()

    def evicted(self) -> None:
        """The tracker no longer holds this session (an ack found it gone)."""
        if self.state is SubscriptionState.LIVE:
            self._evicted = True
            self._wake.set()

    def on_ack(self, offset: StreamId) -> None:
        """The client holds everything up to ``offset``."""
        offset = min(offset, self.cursor)  # it cannot hold what was never sent
        self.ctx.events.emit("ack", self.doc, self.session, offset=str(offset), head=str(self._head()))
        if offset > self.acked:
            self.acked = offset
        while self._sent and self._sent[0] <= self.acked:
            self._sent.popleft()
        self._count_sent()
        if self._sent:
            self._unacked_since = time.monotonic()  # progress: restart the resend clock
            self._hold_through(self.acked)
        else:
            self._unacked_since = None
            self._hold_through(self.cursor)  # the rest up to the cursor is its own
        self._wake.set()

    def request_sync(self, state_vector: bytes) -> None:
        self._sync_vector = state_vector
        self._wake.set()

    def check_resend(self) -> None:
        """Called periodically: resend when the document went quiet."""
        if self._resend_due():
            self._wake.set()

    # ------------------------------------------------------------ the pump

    async def _run(self) -> None:
        logs.doc.set(self.doc)  # this task's own context
        logs.session.set(self.session)
        backoff = 0.1
        try:
            self._wake.set()
            while self.state is not SubscriptionState.CLOSED:
                await self._wake.wait()
                self._wake.clear()
                try:
                    if self.state is SubscriptionState.STARTING:  # retried like any step while Redis is away
                        await self.ctx.fanout.register(self)
                        await self._start()
                    else:
                        await self._step()
                    backoff = 0.1
                except HistoryTrimmed:
                    await self._require_resync(ResyncReason.TRIMMED)
                except (redis.exceptions.RedisError, OSError) as exc:
                    log.warning("document %s: Redis error %s; retrying", self.doc, exc)
                    await self._error(ErrorCode.UNAVAILABLE, "storage unavailable; retrying")
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    self._wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket closed under us, most likely
            if self.state is not SubscriptionState.CLOSED:  # else: closed while a step was finishing
                log.warning("subscription %s stopped: %r", self.doc, exc)

    async def _start(self) -> None:
        if self._requested is None:
            self._own_visible_through = self._synced_at = await self.ctx.store.last_id(self.doc)
            snapshot = await self.ctx.store.load_snapshot(self.doc)
            await self._go_live(snapshot.offset, WindowDigest(snapshot.offset, snapshot.offset, Digest()))
            if snapshot.update:
                parts = protocol.chunks(snapshot.update, self.ctx.settings.chunk_bytes)
                for index, part in enumerate(parts):
                    await self._send(protocol.snapshot(self.doc, str(snapshot.offset), part, index, len(parts)))
            return
        last = self._synced_at = await self.ctx.store.last_id(self.doc)
        claimed_end = self._claimed.end if self._claimed else self._requested
        if max(self._requested, claimed_end) > last:  # the client holds entries the server lost
            await self._require_resync(ResyncReason.AHEAD)
        elif self._requested < await self.ctx.store.trimmed_through(self.doc):
            await self._require_resync(ResyncReason.TRIMMED)
        else:
            await self._resume(self._requested)

    async def _resume(self, offset: StreamId) -> None:
        """Resume from ``offset`` once the drift digests agree (one round trip).

        The server compares when its window starts where the client's does;
        when GC trimmed past the client's ``since``, the client compares the
        digest it gets in ``subscribed``. Either side that sees a difference
        starts the two-way state-vector exchange."""
        claimed = self._claimed
        if claimed is None:  # a client that keeps no digest
            await self._go_live(offset)
            return
        window = await self.ctx.digests.window(self.doc, claimed.since, offset, claimed.through, self.session)
        if window is None or (window.since == claimed.since and window.digest != claimed.digest):
            log.warning("document %s session %s: drift detected (client %s, server %s)",
                        self.doc, self.session, claimed, window)
            self.drift_detected += 1
            await self._require_resync(ResyncReason.DRIFT)
        else:
            await self._go_live(offset, window)

    async def _go_live(self, offset: StreamId, window: WindowDigest | None = None) -> None:
        await self.ctx.tracker.track(self.doc, self.session, offset)
        self.cursor = self.acked = self.tracked = offset
        self._sent.clear()
        self._count_sent()
        self._move(SubscriptionState.LIVE)
        await self._send(protocol.subscribed(self.doc, str(offset), window.to_wire() if window else None))
        self._wake.set()

    async def _step(self) -> None:
        if self._evicted:
            self._evicted = False
            if self.state is SubscriptionState.LIVE:
                await self._require_resync(ResyncReason.EVICTED)
        if self._failure is not None:
            reason, self._failure = self._failure, None
            await self._error(ErrorCode.DOCUMENT_UNAVAILABLE, f"document cannot be read: {reason[:200]}")
        if self._sync_vector is not None:
            await self._answer_sync()
        while self.state is SubscriptionState.LIVE and await self._send_more():
            pass
        if self._synced_at is not None and self.state is SubscriptionState.LIVE and self.cursor >= self._synced_at:
            await self._send_synced(self._synced_at)  # the cursor covers the session's own entries too

    async def _send_more(self) -> bool:
        """Send one batch or page; False when there is nothing to send now."""
        if self._resend_due():
            self._rewind()
        if len(self._sent) >= self.ctx.settings.max_unacked_entries:
            return False  # paced: the next ack wakes us
        if self._budget.spent:  # the connection's other documents hold it: an ack there wakes us
            self._budget.wait(id(self), self._wake.set)
            return False
        if self._pending:
            batch = self._pending.popleft()
            if batch.last <= self.cursor:
                return True
            if batch.after > self.cursor:  # a gap before this batch: read it first
                self._pending.appendleft(batch)
                return await self._send_page(until=batch.after)
            await self._send_entries([entry for entry in batch.entries if entry.id > self.cursor], batch.frames)
            return True
        target = self.ctx.fanout.cursor(self.doc)
        if target is not None and self.cursor < target:
            return await self._send_page(until=target)
        return False

    async def _send_page(self, until: StreamId) -> bool:
        page = await self.ctx.store.read_page(self.doc, self.cursor, self._page_count)
        self._page_count = sizing.next_count(self._page_count, page, self.ctx.settings.page_size,
                                             self.ctx.settings.max_page_bytes)
        page = [entry for entry in page if entry.id <= until]
        if not page:
            return False
        await self._send_entries(page)
        return True

    def _count_sent(self) -> None:
        """Tell the connection's budget how many of ours are unacked now."""
        delta = len(self._sent) - self._counted
        if delta:
            self._counted = len(self._sent)
            self._budget.adjust(delta)

    async def _send_entries(self, entries: list[Entry], shared: dict[tuple[object, ...], str] | None = None) -> None:
        if not entries:
            return
        visible = [entry for entry in entries
                   if entry.session != self.session or entry.id <= self._own_visible_through]
        if visible:
            for frame in _frames(visible, self.ctx.settings.max_page_bytes):
                await self._send(self._deliver_frame(frame, len(visible) < len(entries), shared))
            self.ctx.events.emit("deliver", self.doc, self.session, first=str(visible[0].id), last=str(visible[-1].id),
                                 entries=len(visible), bytes=sum(len(entry.update) for entry in visible),
                                 head=str(max(self._head(), entries[-1].id)))
            self._sent.extend(entry.id for entry in visible)
            self._count_sent()
            if self._unacked_since is None:
                self._unacked_since = time.monotonic()
        self.cursor = entries[-1].id
        if not self._sent:
            self._hold_through(self.cursor)  # only its own entries: nothing to ack

    def _deliver_frame(self, visible: list[Entry], filtered: bool,
                       shared: dict[tuple[object, ...], str] | None) -> dict[str, Any] | str:
        """The deliver frame of ``visible``; from a fan-out batch it is encoded
        once and shared by every subscriber sending the same entries of it
        (named by the first, the count, and whose own entries were left out)."""
        if shared is None:
            return protocol.deliver(self.doc, [(str(entry.id), entry.b64) for entry in visible])
        key = (visible[0].id, len(visible), *((self.session, self._own_visible_through) if filtered else ()))
        text = shared.get(key)
        if text is None:
            text = shared[key] = protocol.encode(
                protocol.deliver(self.doc, [(str(entry.id), entry.b64) for entry in visible]))
        return text

    # ------------------------------------------------------ resend and sync

    def _head(self) -> StreamId:
        """The last id this process knows for the document (for lag figures)."""
        return self.ctx.fanout.cursor(self.doc) or self.cursor

    def _resend_due(self) -> bool:
        return (
            self.state is SubscriptionState.LIVE
            and self._unacked_since is not None
            and time.monotonic() - self._unacked_since >= self.ctx.settings.resend_after
        )

    def _rewind(self) -> None:
        """Send again everything after the client's ack, read from the stream."""
        self.ctx.events.emit("resend", self.doc, self.session, offset=str(self.acked), entries=len(self._sent))
        self.cursor = self.acked
        self._sent.clear()
        self._count_sent()
        self._pending.clear()
        self._unacked_since = None
        self.resends += 1

    def _hold_through(self, offset: StreamId) -> None:
        if offset > self.tracked:
            self.tracked = offset
            self.ctx.ack_writer.submit(self.doc, self.session, offset)

    async def _require_resync(self, reason: ResyncReason) -> None:
        log.info("resync required: %s", reason.value)
        self.ctx.events.emit("resync", self.doc, self.session, reason=reason.value,
                             offset=None if self._requested is None else str(self._requested))
        self._move(SubscriptionState.RESYNC_REQUIRED)
        self._synced_at = None  # sent after the sync reply instead
        self._pending.clear()
        self._sent.clear()
        self._count_sent()
        self._unacked_since = None
        await self._send(protocol.resync_required(self.doc, reason))

    async def _answer_sync(self) -> None:
        """Two-way state-vector exchange: send what the client lacks, with the
        server's state vector so the client can send back what the server lacks."""
        state_vector = self._sync_vector
        assert state_vector is not None
        ydoc, offset = await self.ctx.store.load_document(self.doc, self.ctx.settings.page_size)
        try:
            diff = crdt.encode_state(ydoc, state_vector)
        except crdt.InvalidUpdate:
            self._sync_vector = None
            await self._error(ErrorCode.MALFORMED_FRAME, "state_vector is not a Yjs state vector")
            return
        server_vector = crdt.state_vector(ydoc)
        await self.ctx.tracker.track(self.doc, self.session, offset)
        # Taken only now: a Redis error above leaves the request pending and the
        # pump's retry answers it (the client sends its sync once and waits).
        if self._sync_vector is state_vector:
            self._sync_vector = None
        self.cursor = self.acked = self.tracked = offset
        self._sent.clear()
        self._count_sent()
        self._pending.clear()
        self._unacked_since = None
        if self.state is SubscriptionState.RESYNC_REQUIRED:
            self._move(SubscriptionState.LIVE)
        parts = protocol.chunks(diff, self.ctx.settings.chunk_bytes)
        for index, part in enumerate(parts):
            await self._send(protocol.sync_reply(self.doc, str(offset), part, server_vector, index, len(parts)))
        await self._send_synced(offset)
        self._wake.set()

    async def _send_synced(self, offset: StreamId) -> None:
        """The client has been sent everything admitted up to ``offset``
        (feature ``synced``); a sync answer also settles a pending subscribe's."""
        self._synced_at = None
        await self._send(protocol.synced(self.doc, str(offset)))

    async def _error(self, code: ErrorCode, message: str) -> None:
        await self._send(protocol.error(ProtocolError(code, message, doc=self.doc)))


def _frames(entries: list[Entry], max_bytes: int) -> list[list[Entry]]:
    """Split entries into deliver frames of about ``max_bytes`` of base64 each."""
    frames: list[list[Entry]] = [[]]
    size = 0
    for entry in entries:
        if frames[-1] and size + len(entry.b64) > max_bytes:
            frames.append([])
            size = 0
        frames[-1].append(entry)
        size += len(entry.b64)
    return frames
