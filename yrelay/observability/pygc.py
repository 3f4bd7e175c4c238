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

import gc

#: Fewest connections closed since the last full collection that start one.
MIN_CLOSED = 100


class Churn:
    """Full collections driven by closed connections.

    A closed connection's objects lived long, so they sit in the old
    generation, many in reference cycles (asyncio tasks and their frames):
    only a full collection frees them. With the young threshold raised, few
    objects are promoted and Python's own rule (a quarter of the old
    generation promoted since the last full collection) rarely fires, so a
    wave of closed connections stayed garbage and the next wave took new
    memory (tests/test_deadlines.py). Here: once a quarter of the open
    connections (at least ``MIN_CLOSED``) closed since the last time."""

    def __init__(self) -> None:
        self.enabled = False
        self.open = 0
        self.closed = 0

    def opened(self) -> None:
        self.open += 1

    def closed_one(self) -> None:
        self.open -= 1
        self.closed += 1
        if self.enabled and self.closed >= max(MIN_CLOSED, self.open // 4):
            self.closed = 0
            gc.collect()


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
