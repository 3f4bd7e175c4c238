"""What a ``/yws`` connection is sent of its document after its sync
answer: every stream entry past the answer's offset, from the process's
fan-out, with the gaps read from the stream.

Registered with the fan-out like a subscription, but never tracked: a stock
y-websocket client does not ack, so nothing here pins the stream or holds GC
back. The price: when GC trims past this feed's cursor (the connection fell
that far behind), the entries it still needed are gone, and the feed asks
its connection to close; the client's reconnect sync (step 1 / step 2) then
brings it everything from the snapshot. Memory: fan-out batches waiting for
the socket are capped (:class:`~.sending.PendingBatches`; on overflow they
are dropped and read back from the stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from yrelay.app.context import ServerContext
from yrelay.app.fanout import Batch
from yrelay.app.sending import PendingBatches
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import Entry, HistoryTrimmed, StreamRewound
from yrelay.storage.tombstones import DocumentDeleted, is_deletion
from yrelay.tasks import spawn
from yrelay.yjs import yprotocol

log = logging.getLogger(__name__)

SendBytes = Callable[[bytes], Awaitable[None]]
#: Ends the connection: (close code, reason).
Close = Callable[[int, str], Coroutine[Any, Any, None]]  # a coroutine: spawned from the fan-out's calls

#: Close code when GC trimmed entries this connection had not been sent.
CLOSE_TRIMMED = 4410
#: Close code when an operator deleted the document (DELETE /ops/docs/{doc}).
CLOSE_DELETED = 4404
#: Close code when the document's stream cannot be read.
CLOSE_DOCUMENT_FAILED = 1011
#: Close code when the stream lost entries this connection may hold (a
#: failover): the reconnect sync (step 1 / step 2 both ways) gives them back.
CLOSE_REWOUND = 1013
REWOUND_REASON = "storage lost entries; reconnect to resync"


class YwsFeed:
    """The fan-out's :class:`~.fanout.Subscriber` for one ``/yws`` connection."""

    def __init__(self, ctx: ServerContext, doc: str, session: str, send: SendBytes, close: Close):
        self.ctx = ctx
        self.doc = doc
        self.session = session
        self._send = send
        self._close = close
        #: Everything up to here was sent (None until the first sync answer).
        self.cursor: StreamId | None = None
        self._pending = PendingBatches(ctx.settings.max_pending_bytes)
        #: Batches were dropped (overflow): read from the stream instead.
        self._behind = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.ctx.fanout.register(self)

    def stop(self) -> None:
        self.ctx.fanout.unregister(self)
        if self._task is not None:
            self._task.cancel()

    def answered(self, offset: StreamId) -> None:
        """The first sync answer held the stream up to ``offset``: send what follows."""
        if self.cursor is not None:
            return
        self.cursor = offset
        self._behind = True  # entries past the answer may predate every batch offered from now on
        self._task = asyncio.create_task(self._pump(), name=f"yws-feed {self.doc}")
        self._wake.set()

    # --- the fan-out's Subscriber protocol
    def offer(self, batch: Batch) -> None:
        if self.cursor is None:
            return  # the sync answer and the catch-up after it cover it
        if not self._pending.offer(batch):
            self._behind = True
        self._wake.set()

    def document_failed(self, reason: str) -> None:
        self._closing(CLOSE_DOCUMENT_FAILED, "document unavailable; reconnect")

    def evicted(self) -> None:
        """Never tracked, so never evicted."""

    def stream_rewound(self) -> None:
        """The stream lost entries (a failover, :mod:`yrelay.storage.rewind`) that the
        client may hold: the connection closes, and the stock client's
        reconnect sync (step 1 / step 2 both ways) gives them back, as after
        any other close."""
        self._closing(CLOSE_REWOUND, REWOUND_REASON)

    def _closing(self, code: int, reason: str) -> None:
        """Close from the fan-out's (synchronous) call: :func:`~yrelay.tasks.spawn`
        keeps the task until done (the loop holds tasks weakly: a close must
        not vanish) and logs its error."""
        spawn(self._close(code, reason), name="yrelay-yws-close")

    # --- sending
    async def _pump(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._behind:
                    self._behind = False
                    self._pending.clear()
                    await self._catch_up()
                while len(self._pending):
                    await self._take(self._pending.popleft())
        except HistoryTrimmed:
            await self._close(CLOSE_TRIMMED, "history trimmed past this connection; reconnect to resync")
        except DocumentDeleted:
            await self._close(CLOSE_DELETED, "document_deleted: the document was deleted")
        except StreamRewound as exc:
            log.warning("/yws delivery of %s: %s; the connection closes to resync", self.doc, exc)
            await self._close(CLOSE_REWOUND, REWOUND_REASON)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the feed task's boundary (Redis gone): the client's reconnect sync heals it
            log.warning("/yws delivery of %s stopped: %s", self.doc, exc)
            await self._close(CLOSE_DOCUMENT_FAILED, "storage unavailable; reconnect")

    async def _catch_up(self, until: StreamId | None = None) -> None:
        """Read and send the stream after the cursor (up to ``until``). The
        read also checks that the cursor's entry is still there (or
        trimmed): this feed reads ahead of the fan-out (the sync answer and
        its catch-up read the stream itself), so the fan-out's check after a
        failover (:mod:`yrelay.storage.rewind`) may never have seen what it holds."""
        assert self.cursor is not None
        async for page in self.ctx.store.iter_entries(
            self.doc, self.cursor, until, self.ctx.settings.page_size, held=True
        ):
            await self._deliver(page)

    async def _take(self, batch: Batch) -> None:
        assert self.cursor is not None
        if batch.last <= self.cursor:
            return
        if batch.after > self.cursor:  # entries between the cursor and this batch: from the stream
            await self._catch_up(batch.after)
        elif batch.after < self.cursor and all(entry.id != self.cursor for entry in batch.entries):
            # The batch spans the cursor but lacks its entry: the stream went
            # back past it, or GC trimmed it; the read tells which.
            await self._catch_up(batch.last)
            return
        await self._deliver([entry for entry in batch.entries if entry.id > self.cursor])

    async def _deliver(self, entries: list[Entry]) -> None:
        """Send ``entries`` as y-protocols updates (the connection's own skipped)."""
        if not entries:
            return
        if is_deletion(entries[-1]):
            raise DocumentDeleted(self.doc)
        for entry in entries:
            if entry.session != self.session:
                await self._send(yprotocol.sync_update(entry.update))
        self.cursor = entries[-1].id


__all__ = ["CLOSE_DELETED", "CLOSE_DOCUMENT_FAILED", "CLOSE_REWOUND", "CLOSE_TRIMMED", "YwsFeed"]
