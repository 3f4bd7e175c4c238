"""The ack path of one subscription: what its client has acked, what the
tracker was told it holds, and since when the oldest unacked entry waits.

An ack moves the subscription's :class:`AckWindow`; when the window moves
past what the tracker holds, the offset goes to the process's
:class:`~yrelay.tracker.AckWriter`, which coalesces acks into one pipeline
per event-loop turn. An ack the tracker refuses because GC (or an operator)
evicted the session comes back through the process's registry of
subscriptions (:mod:`yrelay.app.subscribers`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from yrelay.app.limits import DeliveryBudget
from yrelay.storage.offsets import StreamId
from yrelay.tracker import AckWriter


class AckWindow:
    """One subscription's entries in flight: sent and not acked yet (in
    order), the client's cumulative ack, what the tracker was last told,
    and since when the oldest unacked entry waits (the resend clock).

    The connection's :class:`DeliveryBudget` counts the unacked entries of
    all its documents; this window keeps its part of that count current."""

    __slots__ = (
        "doc",
        "session",
        "_ack_writer",
        "_budget",
        "acked",
        "tracked",
        "_sent",
        "_counted",
        "_unacked_since",
        "resends",
    )

    def __init__(self, doc: str, session: str, ack_writer: AckWriter, budget: DeliveryBudget):
        self.doc = doc
        self.session = session
        self._ack_writer = ack_writer
        self._budget = budget
        #: The client's cumulative ack.
        self.acked = StreamId(0, 0)
        #: What the tracker was last told this session holds.
        self.tracked = StreamId(0, 0)
        #: () while nothing is unacked: an empty deque is a 760-byte block on
        #: every idle subscription (BENCHMARKS.md, "Issue 20: idle memory").
        self._sent: deque[StreamId] | tuple[()] = ()
        self._counted = 0  # our part of the budget's count
        self._unacked_since: float | None = None
        self.resends = 0

    def __len__(self) -> int:
        return len(self._sent)

    def restart(self, offset: StreamId) -> None:
        """The session holds everything up to ``offset``, and the tracker
        says so already (a subscribe or a sync answer recorded it)."""
        self.acked = self.tracked = offset
        self.drop()

    def drop(self) -> None:
        """Forget what was sent (it is sent again, or a resync replaces it)."""
        self._sent = ()
        self._count()
        self._unacked_since = None

    def close(self) -> None:
        self._sent = ()
        self._count()
        self._budget.forget(id(self))

    def sent(self, ids: list[StreamId]) -> None:
        if self._sent:
            self._sent.extend(ids)
        else:
            self._sent = deque(ids)
        self._count()
        if self._unacked_since is None:
            self._unacked_since = time.monotonic()

    def ack(self, offset: StreamId, cursor: StreamId) -> None:
        """The client holds everything up to ``offset`` (at most ``cursor``)."""
        if offset > self.acked:
            self.acked = offset
        while self._sent and self._sent[0] <= self.acked:
            self._sent.popleft()
        self._count()
        if self._sent:
            self._unacked_since = time.monotonic()  # progress: restart the resend clock
            self.hold_through(self.acked)
        else:
            self._sent = ()
            self._unacked_since = None
            self.hold_through(cursor)  # the rest up to the cursor is its own

    def hold_through(self, offset: StreamId) -> None:
        """Tell the tracker (through the ack writer) the session holds ``offset``."""
        if offset > self.tracked:
            self.tracked = offset
            self._ack_writer.submit(self.doc, self.session, offset)

    def resend_due(self, resend_after: float) -> bool:
        return self._unacked_since is not None and time.monotonic() - self._unacked_since >= resend_after

    def rewind(self) -> StreamId:
        """Everything after the ack is to be sent again: returns the ack."""
        self.drop()
        self.resends += 1
        return self.acked

    def full(self, max_unacked: int) -> bool:
        """Sending must wait for acks (what :meth:`paused` checks, without waiting)."""
        return len(self._sent) >= max_unacked or self._budget.spent

    def paused(self, max_unacked: int, wake: Callable[[], None]) -> bool:
        """True when sending must wait for acks: this window holds
        ``max_unacked`` entries (the next ack wakes the sender), or the
        connection's budget is spent (``wake`` is called when it has room)."""
        if not self.full(max_unacked):
            return False
        if len(self._sent) < max_unacked:  # the budget: the connection's other documents hold it
            self._budget.wait(id(self), wake)
        return True

    def _count(self) -> None:
        """Tell the connection's budget how many of ours are unacked now."""
        delta = len(self._sent) - self._counted
        if delta:
            self._counted = len(self._sent)
            self._budget.adjust(delta)


__all__ = ["AckWindow"]
