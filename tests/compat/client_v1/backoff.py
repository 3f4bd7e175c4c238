"""Exponential backoff with jitter and a maximum, shared by retries and reconnects."""

from __future__ import annotations

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
