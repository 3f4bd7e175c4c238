"""Token buckets: a rate with a burst, in process memory (no Redis call).

- :class:`DebtBucket`: ``rate`` tokens per second, at most ``burst`` saved,
  where what was used already is booked and may take the balance below
  zero (an answer's size, a frame parsed); ``wait`` says until when.
- :class:`TokenBucket`: one taken at a time, only while there is one.

A rate of 0 means unlimited. Used by the per-process limits (:mod:`.limits`),
a websocket's pacing (:mod:`.pacing`) and its protocol (:mod:`.ws_protocol`);
the per-subject buckets shared through Redis are :mod:`.quotas`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["DebtBucket", "TokenBucket"]


class DebtBucket:
    """A token bucket whose balance may go negative: ``spend`` books what
    was used already (an answer sent, a frame parsed), ``wait`` says how
    long until it is paid back. Tokens refill at ``rate``/s up to
    ``burst``; a rate of 0 means unlimited."""

    __slots__ = ("rate", "burst", "_clock", "_balance", "_at")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._balance = self.burst
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._balance = min(self.burst, self._balance + (now - self._at) * self.rate)
        self._at = now

    def spend(self, amount: float) -> None:
        if self.rate > 0:
            self._refill()
            self._balance -= amount

    def wait(self) -> float:
        """Seconds until the balance is back above zero (0: now)."""
        if self.rate <= 0:
            return 0.0
        self._refill()
        return 0.0 if self._balance >= 0 else -self._balance / self.rate


class TokenBucket(DebtBucket):
    """``take()`` succeeds while a whole token remains (never below zero)."""

    __slots__ = ()

    def take(self) -> bool:
        if self.rate <= 0:
            return True
        self._refill()
        if self._balance >= 1.0:
            self._balance -= 1.0
            return True
        return False

    def retry_after_ms(self) -> int:
        """Milliseconds until one token is back (at least 1)."""
        if self.rate <= 0:
            return 0
        self._refill()
        return max(1, math.ceil((1.0 - self._balance) / self.rate * 1000))
