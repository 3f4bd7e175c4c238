"""Updates sent and not yet acked, keyed by the session's logical clock.

Per document, updates go out in clock order, and one the server refused
(or that went unanswered) holds back the later ones of its document until
it is sent again: Yjs applies one client's changes only in clock order, so
a later update stored before an earlier one would wait for ever
(docs/protocol.md#causal-admission). Other documents are never held back.

An update on the wire is resent only when the connection makes no progress:
its backoff delay is over *and* no answer came for that long. The server
answers a connection's updates in order and, over its rates, reads the
socket more slowly instead of refusing (issue 30): while answers keep
coming, the update's own is on its way, and a resend would only add to the
load that slowed it. Refused updates keep their own schedule.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from yrelay.backoff import Backoff


@dataclass
class PendingUpdate:
    clock: int
    doc: str
    update: bytes
    attempts: int = 0
    next_send: float = 0.0  # monotonic time of the next (re)send
    #: Seconds of silence on the connection after which it is resent (its
    #: backoff delay); 0 until sent on this connection.
    silence: float = 0.0
    sent: bool = False  # ever sent (by this process, or before a restart)
    #: A two-way sync's diff (``update {sync: true}``): it covers the
    #: document's earlier updates, which wait while it is unacked.
    sync: bool = False
    #: Refused by the server: later updates of its document wait for its resend.
    waiting: bool = False
    #: Its parts are going out: later updates of its document wait.
    sending: bool = False


class SendBuffer:
    """Clock-ordered pending updates; an update leaves only when acked (or
    rejected for good)."""

    def __init__(self, backoff: Backoff, timer: Callable[[], float] = time.monotonic):
        self.backoff = backoff
        self._timer = timer
        self._items: OrderedDict[int, PendingUpdate] = OrderedDict()
        #: The last clock issued.
        self.clock = 0
        #: When the connection last answered an update (``appended``, or an
        #: ``error`` with a clock); -inf on a new connection.
        self.last_answer = float("-inf")
        #: Update frames sent, and how many of them were resends (for figures).
        self.sends = 0
        self.resends = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, doc: str, update: bytes, sync: bool = False) -> PendingUpdate:
        self.clock += 1
        item = PendingUpdate(self.clock, doc, update, sync=sync)
        self._items[item.clock] = item
        return item

    def restore(self, clock: int, items: list[tuple[int, str, bytes]]) -> None:
        """Take back a persisted buffer: its clock and its unacked updates."""
        self.clock = max(self.clock, clock)
        for item_clock, doc, update in items:
            self._items[item_clock] = PendingUpdate(item_clock, doc, update, sent=True)

    def pop(self, clock: int) -> PendingUpdate | None:
        return self._items.pop(clock, None)

    def get(self, clock: int) -> PendingUpdate | None:
        return self._items.get(clock)

    def all(self) -> list[PendingUpdate]:
        return list(self._items.values())

    def earlier(self, item: PendingUpdate) -> list[PendingUpdate]:
        """The unacked updates of ``item``'s document before it."""
        return [other for other in self._items.values() if other.doc == item.doc and other.clock < item.clock]

    def drop_covered(self, push: PendingUpdate) -> list[PendingUpdate]:
        """A sync push was stored: it held every update of its document that
        was made before it, so those need not be sent again."""
        covered = self.earlier(push)
        for item in covered:
            del self._items[item.clock]
        return covered

    def mark_sent(self, item: PendingUpdate) -> None:
        item.silence = self.backoff.delay(item.attempts)
        item.next_send = self._timer() + item.silence
        item.attempts += 1
        self.sends += 1
        self.resends += item.sent
        item.sent = True
        item.waiting = False

    def sent_in_full(self, item: PendingUpdate) -> None:
        """Its last part went out only now (a large update takes a while):
        its answer is awaited from now on."""
        item.next_send = max(item.next_send, self._timer() + self.backoff.delay(item.attempts - 1))

    def refused(self, clock: int) -> None:
        """The server did not store it (``unavailable``, ``missing_dependency``):
        resent when its backoff delay is over; until then later updates of
        its document wait."""
        item = self._items.get(clock)
        if item is not None:
            item.waiting = True

    def defer(self, clock: int, delay: float) -> None:
        """The server refused the update for now (``rate_limited``): send it
        again after ``delay`` seconds; that send was not an attempt."""
        item = self._items.get(clock)
        if item is not None:
            item.next_send = max(item.next_send, self._timer() + delay)
            item.attempts = max(item.attempts - 1, 0)
            item.waiting = True

    def answered(self) -> None:
        """The connection answered an update: it is being read."""
        self.last_answer = self._timer()

    def due(self) -> list[PendingUpdate]:
        """What to send now, in clock order: new updates, refused ones whose
        backoff delay is over, and unanswered ones whose delay is over with
        no answer on the connection for that long; except behind an update
        of the same document that waits (refused, or its parts still going
        out), and except the updates a sync push of their document covers."""
        now = self._timer()
        pushed = {item.doc: item.clock for item in self._items.values() if item.sync}  # the last push wins
        held: set[str] = set()
        due = []
        for item in self._items.values():
            if item.doc in held or item.clock < pushed.get(item.doc, 0):
                continue
            if item.sending or (item.waiting and item.next_send > now):
                held.add(item.doc)
            elif item.next_send <= now and (item.waiting or self.last_answer + item.silence <= now):
                due.append(item)
        return due

    def exhausted(self) -> bool:
        """Has any update used up its attempts (the client is 'offline')?"""
        return any(item.attempts >= self.backoff.max_attempts for item in self._items.values())

    def reset_attempts(self) -> None:
        """A new connection: everything goes out again, and nothing was answered on it yet."""
        self.last_answer = float("-inf")
        for item in self._items.values():
            item.attempts = 0
            item.next_send = item.silence = 0.0
            item.waiting = item.sending = False
