"""Python's cyclic garbage collector, set for a server process.

With Python's default thresholds (a young collection every 700 net
allocations) anything alive for a few milliseconds -- a frame in flight, a
task awaiting Redis -- survives two young collections and lands in the old
generation; once a quarter of the heap got there a full collection walks
every object of every connection. Under 1,000 documents x 2 clients that
was ~0.6 s per full collection, several times a minute: more of the
server's CPU than any other part of the hot path, and its p99 stalls
(BENCHMARKS.md, issue 20). A young collection every ``young`` allocations
lets short-lived objects die young: they are freed by their reference
counts before a collection could promote them, and the old generation
grows by what really lives long. Reference cycles are still collected, in
larger, rarer young collections (a few MB more garbage at most). Nothing is
frozen (``gc.freeze``): a process that starts several relays, like the
tests, would pin each one's objects for good.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

#: Fewest connections closed since the last full collection that start one.
MIN_CLOSED = 100
#: Most of the process's time full collections started by churn may take:
#: after one that took ``d`` seconds, the next waits until ``d / MAX_SHARE``
#: after it began (deferred, not dropped).
MAX_SHARE = 0.1


class Churn:
    """Full collections driven by closed connections.

    A closed connection's objects lived long, so they sit in the old
    generation, many in reference cycles (asyncio tasks and their frames):
    only a full collection frees them. With the young threshold raised, few
    objects are promoted and Python's own rule (a quarter of the old
    generation promoted since the last full collection) rarely fires, so a
    wave of closed connections stayed garbage and the next wave took new
    memory (tests/test_deadlines.py). Here: once a quarter of the open
    connections (at least ``MIN_CLOSED``) closed since the last time, and
    at most ``MAX_SHARE`` of the time: a client that opened websockets and
    closed them before ``hello``, 600 a second, started a full collection
    every 100 of them, 43% of the event loop's time (py-spy; issue 36). A
    collection due before its time runs when it is due. (Each one still
    holds the loop for as long as it takes, most of it walking the objects
    every import made: 60-80 ms on a loaded 2-core host, which other
    clients see as their p99 round trip while such a flood lasts.)"""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = False
        self.open = 0
        self.closed = 0
        self._clock = clock
        #: When the next full collection may start.
        self._not_before = 0.0
        self._deferred: asyncio.TimerHandle | None = None
        self._deferred_in: asyncio.AbstractEventLoop | None = None

    def opened(self) -> None:
        self.open += 1

    def closed_one(self) -> None:
        self.open -= 1
        self.closed += 1
        if self.enabled and self.closed >= max(MIN_CLOSED, self.open // 4) and not self._waiting():
            wait = self._not_before - self._clock()
            if wait <= 0:
                self._collect()
                return
            try:
                self._deferred_in = asyncio.get_running_loop()
            except RuntimeError:  # no event loop: the next close after the wait collects
                return
            self._deferred = self._deferred_in.call_later(wait, self._collect)

    def _waiting(self) -> bool:
        """A deferred collection will run (not one whose loop closed first:
        a process may run several loops, one after the other, like tests)."""
        return self._deferred is not None and self._deferred_in is not None and not self._deferred_in.is_closed()

    def _collect(self) -> None:
        self._deferred = None
        self.closed = 0
        began = self._clock()
        gc.collect()
        self._not_before = began + (self._clock() - began) / MAX_SHARE


#: This process's connections (``Connection.run`` counts them).
CHURN = Churn()


def tune(young: int) -> None:
    """Collect the young generation every ``young`` allocations, and the
    old one after connection churn (0: leave Python's settings).
    Process-wide (the relay's default is 50,000): an application embedding
    the relay keeps its own with ``gc_young_threshold=0``."""
    if young > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young, middle, old)
        CHURN.enabled = True


__all__ = ["CHURN", "Churn", "MIN_CLOSED", "tune"]
