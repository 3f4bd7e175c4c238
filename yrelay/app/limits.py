"""Per-process admission and rate limits (docs/operations.md#limits).

Everything here is in-process arithmetic, never a Redis call: a limit must
hold when Redis is slow, and must cost nothing on the hot path.

- token buckets (:mod:`yrelay.transport.buckets`) for new connections per second and
  updates per session.
- :class:`Admission`: new connections per second of this process.
- :class:`AddressCounts`: open websockets per client address.
- :class:`SessionRates`: one update bucket per session, shared by that
  session's connections to this process.
- :class:`DeliveryBudget`: entries sent and not yet acked, across every
  document of one connection.

The limits of a subject across sockets and processes are kept in Redis
(:mod:`.quotas`); :class:`Limits` holds both.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from yrelay.protocol import ErrorCode, ProtocolError
from yrelay.transport.buckets import TokenBucket

if TYPE_CHECKING:
    from yrelay.app.quotas import SubjectQuotas
    from yrelay.config import Settings

#: Close codes of a refused connection (after its ``error`` frame).
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_POLICY_VIOLATION = 1008
#: How long a client refused for its address should wait before it retries.
ADDRESS_RETRY_MS = 5_000


class Admission:
    """New connections per second of one process. A refused client is given
    its own slot in the future (one per ``1/rate`` s after the previous
    refused one, plus jitter), so a reconnect storm comes back spread out at
    the rate the process admits, not all at once again."""

    MAX_WAIT = 30.0

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self.bucket = TokenBucket(rate, burst, clock)
        self._clock = clock
        self._next_slot = 0.0
        self.refused = 0

    def admit(self) -> int | None:
        """None: admitted. Else the milliseconds the client should wait."""
        if self.bucket.take():
            return None
        self.refused += 1
        now = self._clock()
        interval = 1.0 / self.bucket.rate
        self._next_slot = min(max(self._next_slot, now) + interval, now + self.MAX_WAIT)
        wait = self._next_slot - now + random.uniform(0, interval)
        return max(1, math.ceil(wait * 1000))


@dataclass
class AddressCounts:
    """Open websockets per client address (the TCP peer's IP)."""

    limit: int
    counts: dict[str, int] = field(default_factory=dict)

    def open(self, address: str) -> bool:
        """Count one more connection from ``address``; False (and not
        counted) when it already has ``limit``. A limit of 0 is unlimited."""
        current = self.counts.get(address, 0)
        if self.limit > 0 and current >= self.limit:
            return False
        self.counts[address] = current + 1
        return True

    def close(self, address: str) -> None:
        current = self.counts.get(address, 0) - 1
        if current > 0:
            self.counts[address] = current
        else:
            self.counts.pop(address, None)


class SessionRates:
    """One token bucket per session, alive while a connection uses it."""

    def __init__(self, rate: float, burst: float):
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[TokenBucket, int]] = {}

    def acquire(self, session: str) -> TokenBucket:
        bucket, users = self._buckets.get(session) or (TokenBucket(self.rate, self.burst), 0)
        self._buckets[session] = (bucket, users + 1)
        return bucket

    def release(self, session: str) -> None:
        held = self._buckets.get(session)
        if held is not None and held[1] > 1:
            self._buckets[session] = (held[0], held[1] - 1)
        else:
            self._buckets.pop(session, None)

    def __len__(self) -> int:
        return len(self._buckets)


class DeliveryBudget:
    """Entries sent on one connection and not yet acked, all documents
    together. A subscription that finds the budget spent stops sending and
    is woken when any of its siblings' acks free some."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiting: dict[int, Callable[[], None]] = {}

    @property
    def spent(self) -> bool:
        return self.limit > 0 and self.used >= self.limit

    def adjust(self, delta: int) -> None:
        self.used += delta
        if delta < 0 and self._waiting and not self.spent:
            waiting, self._waiting = self._waiting, {}
            for wake in waiting.values():
                wake()

    def wait(self, key: int, wake: Callable[[], None]) -> None:
        """Call ``wake`` once the budget has room again."""
        self._waiting[key] = wake

    def forget(self, key: int) -> None:
        self._waiting.pop(key, None)


@dataclass(frozen=True)
class Refusal:
    """Why a new websocket is not served: its error frame, then its close code."""

    error: ProtocolError
    close_code: int


class Limits:
    """The limits one server context holds: per process, and (``subjects``) per subject."""

    def __init__(self, settings: Settings, subjects: SubjectQuotas):
        self.subjects = subjects
        self.admission = Admission(settings.admission_rate, settings.admission_burst)
        self.addresses = AddressCounts(settings.max_connections_per_address)
        self.sessions = SessionRates(settings.updates_per_second, settings.update_burst)

    def open_connection(self, address: str) -> Refusal | None:
        """Count a new websocket from ``address``, or say why it is refused
        (nothing is counted then). Admitted: ``close_connection`` later."""
        if not self.addresses.open(address):
            return Refusal(
                ProtocolError(
                    ErrorCode.TOO_MANY_CONNECTIONS,
                    f"at most {self.addresses.limit} connections per address; close some or retry later",
                    retry_after_ms=ADDRESS_RETRY_MS,
                ),
                CLOSE_POLICY_VIOLATION,
            )
        wait = self.admission.admit()
        if wait is not None:
            self.addresses.close(address)
            return Refusal(
                ProtocolError(ErrorCode.OVERLOADED, "too many new connections; retry later", retry_after_ms=wait),
                CLOSE_TRY_AGAIN_LATER,
            )
        return None

    def close_connection(self, address: str) -> None:
        self.addresses.close(address)


__all__ = ["Limits", "Refusal", "AddressCounts", "Admission", "DeliveryBudget", "SessionRates"]
