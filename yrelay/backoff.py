"""Exponential backoff: the schedule (with jitter and a maximum), and the
state of one loop that keeps reconnecting to Redis.

The Python client uses :class:`Backoff` for resends and reconnects
(:mod:`yrelay.client`); the server's Redis readers (fan-out, presence,
subscription pumps) use :class:`Reconnect` over a jitter-free schedule of
0.1 s doubling to 5 s, back to the start after a success.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """``delay(n)`` = ``min(base * factor**n, max_delay)``, scaled by a random
    factor in ``[1 - jitter, 1]`` so that clients cut off together do not
    come back together."""

    base: float = 0.25
    factor: float = 2.0
    max_delay: float = 10.0
    jitter: float = 0.5
    #: Sends of one update before the client gives up and resyncs in full.
    max_attempts: int = 8

    def delay(self, attempt: int) -> float:
        raw = min(self.base * self.factor ** max(attempt, 0), self.max_delay)
        return raw * (1 - self.jitter * random.random())


#: The server's Redis reconnects: one process, no herd to spread out.
REDIS_RECONNECT = Backoff(base=0.1, factor=2.0, max_delay=5.0, jitter=0.0)
#: Attempts counted at most (``factor ** attempt`` must stay a finite float).
_MAX_COUNTED = 64


class Reconnect:
    """Failed attempts of one loop so far: ``await wait()`` after a failure,
    ``succeeded()`` after a success."""

    def __init__(self, schedule: Backoff = REDIS_RECONNECT):
        self.schedule = schedule
        self.attempt = 0

    @property
    def delay(self) -> float:
        """What the next ``wait()`` sleeps."""
        return self.schedule.delay(self.attempt)

    async def wait(self) -> None:
        delay = self.delay
        self.attempt = min(self.attempt + 1, _MAX_COUNTED)
        await asyncio.sleep(delay)

    def succeeded(self) -> None:
        self.attempt = 0


__all__ = ["Backoff", "REDIS_RECONNECT", "Reconnect"]
