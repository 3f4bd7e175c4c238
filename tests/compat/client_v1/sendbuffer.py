"""Updates sent and not yet acked, keyed by the session's logical clock."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from .backoff import Backoff


@dataclass
class PendingUpdate:
    clock: int
    doc: str
    update: bytes
    attempts: int = 0
    next_send: float = 0.0  # monotonic time of the next (re)send
    sent: bool = False  # ever sent (by this process, or before a restart)


class SendBuffer:
    """Clock-ordered pending updates; an update leaves only when acked (or
    rejected for good)."""

    def __init__(self, backoff: Backoff):
        self.backoff = backoff
        self._items: OrderedDict[int, PendingUpdate] = OrderedDict()
        self._clock = 0
        #: Update frames sent, and how many of them were resends (for figures).
        self.sends = 0
        self.resends = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, doc: str, update: bytes) -> PendingUpdate:
        self._clock += 1
        item = PendingUpdate(self._clock, doc, update)
        self._items[item.clock] = item
        return item

    @property
    def clock(self) -> int:
        """The last clock issued."""
        return self._clock

    def restore(self, clock: int, items: list[tuple[int, str, bytes]]) -> None:
        """Take back a persisted buffer: its clock and its unacked updates."""
        self._clock = max(self._clock, clock)
        for item_clock, doc, update in items:
            self._items[item_clock] = PendingUpdate(item_clock, doc, update, sent=True)

    def pop(self, clock: int) -> PendingUpdate | None:
        return self._items.pop(clock, None)

    def all(self) -> list[PendingUpdate]:
        return list(self._items.values())

    def mark_sent(self, item: PendingUpdate) -> None:
        item.next_send = time.monotonic() + self.backoff.delay(item.attempts)
        item.attempts += 1
        self.sends += 1
        self.resends += item.sent
        item.sent = True

    def defer(self, clock: int, delay: float) -> None:
        """The server refused the update for now (``rate_limited``): send it
        again after ``delay`` seconds; that send was not an attempt."""
        item = self._items.get(clock)
        if item is not None:
            item.next_send = max(item.next_send, time.monotonic() + delay)
            item.attempts = max(item.attempts - 1, 0)

    def due(self) -> list[PendingUpdate]:
        now = time.monotonic()
        return [item for item in self._items.values() if item.next_send <= now]

    def exhausted(self) -> bool:
        """Has any update used up its attempts (the client is 'offline')?"""
        return any(item.attempts >= self.backoff.max_attempts for item in self._items.values())

    def reset_attempts(self) -> None:
        for item in self._items.values():
            item.attempts = 0
            item.next_send = 0.0
