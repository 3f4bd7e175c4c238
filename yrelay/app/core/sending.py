"""A subscription's sending side: its cursor, the fan-out batches waiting
for its socket, the stream pages that fill the gaps, and the deliver frames.

Entries come from two places: batches the process-wide fan-out offers
(shared by all subscribers, encoded once), and pages read from the stream
when the subscription is behind the fan-out (new subscriber, resend, slow
consumer). Memory is bounded: pending batches are capped in number and
bytes (on overflow they are dropped and read back from the stream), a
catch-up page asks for fewer entries when they are large
(``max_page_bytes``), and the :class:`~.acks.AckWindow` pauses sending
while ``max_unacked_entries`` (or the connection's budget) are in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from yrelay.app import sizing
from yrelay.app.core.acks import AckWindow
from yrelay.app.core.peer import FrameKey, Peer
from yrelay.app.fanout import Batch
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry
from yrelay.storage.tombstones import DocumentDeleted, is_deletion

if TYPE_CHECKING:
    from yrelay.app.core.services import ReadServices

MAX_PENDING_BATCHES = 64


class PendingBatches:
    """Fan-out batches waiting for the socket, capped in number and bytes."""

    def __init__(self, max_bytes: int, max_batches: int = MAX_PENDING_BATCHES):
        self.max_bytes = max_bytes
        self.max_batches = max_batches
        #: A list, not a deque: at most max_batches, and an empty deque is a
        #: 760-byte block on every idle subscription (BENCHMARKS.md, issue 20).
        self._batches: list[Batch] = []
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
        batch = self._batches.pop(0)
        self.bytes -= batch.nbytes
        return batch

    def appendleft(self, batch: Batch) -> None:
        self._batches.insert(0, batch)
        self.bytes += batch.nbytes

    def clear(self) -> None:
        self._batches.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._batches)


class Booking(Protocol):
    """Where a sender books the bytes it delivers (its subscription)."""

    def book_delivery(self, nbytes: int) -> None: ...


class Sender:
    """Sends one document's entries to one client, from the cursor on, in
    its codec's words (:class:`.peer.Peer`); ``booking`` is told the bytes
    of each delivery (the connection's answer rates); ``tracked``: the
    deliveries are acked, and logged (event ``deliver``)."""

    __slots__ = (
        "services",
        "doc",
        "session",
        "peer",
        "window",
        "_booking",
        "_tracked",
        "cursor",
        "own_visible_through",
        "pending",
        "_page_count",
    )

    def __init__(
        self,
        services: ReadServices,
        doc: str,
        session: str,
        peer: Peer,
        window: AckWindow,
        booking: Booking,
        tracked: bool = True,
    ):
        self.services = services
        self.doc = doc
        self.session = session
        self.peer = peer
        self.window = window
        self._booking = booking
        self._tracked = tracked
        #: Every entry up to the cursor was sent, or skipped as the session's own.
        self.cursor = StreamId(0, 0)
        #: A subscriber that holds nothing gets the session's own entries up
        #: to here too (written before this subscribe, e.g. by an earlier
        #: binding of the document); past it, never its own.
        self.own_visible_through = StreamId(0, 0)
        self.pending = PendingBatches(services.settings.max_pending_bytes)
        #: Entries per catch-up read: grows while entries are small.
        self._page_count = sizing.first_count(services.settings.page_size, services.settings.max_page_bytes)

    def restart(self, offset: StreamId) -> None:
        """Send from ``offset`` on; batches already queued are read again."""
        self.cursor = offset
        self.pending.clear()

    def head(self) -> StreamId:
        """The last id this process knows for the document (for lag figures)."""
        return self.services.fanout.cursor(self.doc) or self.cursor

    def has_work(self) -> bool:
        """Batches wait, or the fan-out has read past the cursor: what a paused
        window resumes once acked (a resend comes from the periodic check)."""
        if self.pending:
            return True
        target = self.services.fanout.cursor(self.doc)
        return target is not None and self.cursor < target

    async def send_more(self, wake: Callable[[], None]) -> bool:
        """Send one batch or page; False when there is nothing to send now
        (``wake`` is called when the connection's budget has room again)."""
        if self.window.resend_due(self.services.settings.resend_after):
            self.rewind()
        if self.window.paused(self.services.settings.max_unacked_entries, wake):
            return False  # an ack wakes us
        if self.pending:
            batch = self.pending.popleft()
            if batch.last <= self.cursor:
                return True
            if batch.after > self.cursor:  # a gap before this batch: read it first
                self.pending.appendleft(batch)
                return await self._send_page(until=batch.after)
            await self._send_entries([entry for entry in batch.entries if entry.id > self.cursor], batch)
            return True
        target = self.services.fanout.cursor(self.doc)
        if target is not None and self.cursor < target:
            return await self._send_page(until=target)
        return False

    def rewind(self) -> None:
        """Send again everything after the client's ack, read from the stream."""
        self.services.events.emit(
            "resend", self.doc, self.session, offset=str(self.window.acked), entries=len(self.window)
        )
        self.restart(self.window.rewind())

    async def _send_page(self, until: StreamId) -> bool:
        # Untracked, the cursor is always an entry the server read itself (a
        # sync answer's, read ahead of the fan-out): the read checks it is
        # still there (StreamRewound), as the fan-out's check after a
        # failover may never have seen it.
        page = await self.services.store.read_page(self.doc, self.cursor, self._page_count, held=not self._tracked)
        self._page_count = sizing.next_count(
            self._page_count, page, self.services.settings.page_size, self.services.settings.max_page_bytes
        )
        page = [entry for entry in page if entry.id <= until]
        if not page:
            return False
        await self._send_entries(page)
        return True

    async def _send_entries(self, entries: list[Entry], batch: Batch | None = None) -> None:
        if not entries:
            return
        if is_deletion(entries[-1]):  # the marker is the stream's last entry (yrelay/gc/deletion.py)
            raise DocumentDeleted(self.doc)
        visible = self._visible(entries)
        if visible:
            filtered = len(visible) < len(entries)
            for frame in frames(visible, self.services.settings.max_page_bytes):
                self._booking.book_delivery(
                    await self.peer.deliver(self.doc, frame, self._frame_key(frame, filtered), batch)
                )
        self._sent(entries, visible)

    def deliver_now(self, batch: Batch) -> bool:
        """Send a fan-out batch from the fan-out's dispatch, without the pump
        (a task wake-up and the ASGI send path per subscriber were most of a
        busy document's CPU): only when this subscriber is caught up, i.e.
        nothing waits, the batch follows the cursor, the window has room, no
        resend is due, the entries fit one frame and hold no deletion
        marker, and the codec can write them now
        (:meth:`.peer.Peer.deliver_now`). False: nothing was done, queue it."""
        settings = self.services.settings
        if (
            self.pending
            or not batch.after <= self.cursor < batch.last
            or self.window.full(settings.max_unacked_entries)
            or self.window.resend_due(settings.resend_after)
        ):
            return False
        entries = [entry for entry in batch.entries if entry.id > self.cursor]
        if is_deletion(entries[-1]):
            return False
        visible = self._visible(entries)
        if visible:
            [frame, *more] = frames(visible, settings.max_page_bytes)
            if more or not self.peer.deliver_now(
                self.doc, visible, self._frame_key(visible, len(visible) < len(entries)), batch
            ):
                return False
        self._sent(entries, visible)
        return True

    def _visible(self, entries: list[Entry]) -> list[Entry]:
        """What the client is sent of ``entries``: not its own (past ``own_visible_through``)."""
        return [entry for entry in entries if entry.session != self.session or entry.id <= self.own_visible_through]

    def _sent(self, entries: list[Entry], visible: list[Entry]) -> None:
        """``entries`` were sent (``visible`` of them to the client): the event, the window, the cursor."""
        head = entries[-1].id
        self.cursor = head
        if not self._tracked:
            return  # nothing is acked, nothing held for it
        if visible:
            self.services.events.emit(
                "deliver",
                self.doc,
                self.session,
                first=str(visible[0].id),
                last=str(visible[-1].id),
                entries=len(visible),
                bytes=sum(len(entry.update) for entry in visible),
                head=str(max(self.head(), head)),
            )
            self.window.sent([entry.id for entry in visible])
        if not self.window:
            self.window.hold_through(head)  # only its own entries: nothing to ack

    def _frame_key(self, visible: list[Entry], filtered: bool) -> FrameKey:
        """A shared frame's name: its first entry, its count, and whose own
        entries were left out (if any were)."""
        return (visible[0].id, len(visible), *((self.session, self.own_visible_through) if filtered else ()))


def frames(entries: list[Entry], max_bytes: int) -> list[list[Entry]]:
    """Split entries into deliver frames of about ``max_bytes`` of base64 each."""
    result: list[list[Entry]] = [[]]
    size = 0
    for entry in entries:
        if result[-1] and size + len(entry.b64) > max_bytes:
            result.append([])
            size = 0
        result[-1].append(entry)
        size += len(entry.b64)
    return result


__all__ = ["MAX_PENDING_BATCHES", "PendingBatches", "Sender", "frames"]
