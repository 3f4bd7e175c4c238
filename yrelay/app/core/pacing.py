"""How fast one websocket is read: fairness, rates as backpressure, a hard bound.

One socket read can deliver thousands of tiny frames, and a handler that
works through them without yielding lets one client starve every other
connection of the process (issue 30: a ping flood from a socket that never
said ``hello`` took other users' deliveries from 2 ms to 6 s). Every frame
of every websocket endpoint (``/ws``, ``/yws``) therefore passes
:meth:`Pacer.admit` before it is handled:

- **a turn budget**: after ``FRAMES_PER_TURN`` frames or ``BYTES_PER_TURN``
  bytes the connection yields to the event loop, so the others run between
  its frames whatever one read delivered;
- **rates that wait instead of refusing**: every frame takes a token of the
  connection's frame bucket (:meth:`admit`), control frames (ping,
  subscribe, unsubscribe, sync, digests, awareness queries) one of its
  control bucket (:meth:`control`), and requests whose answer is larger
  than the request (:meth:`answer`) wait while the connection's answer-byte
  bucket is in debt (:meth:`charge` books an answer's bytes once it is
  sent). Over a rate the connection simply stops reading: its unread
  frames stay in the socket and TCP slows the sender down
  (the websocket protocol, :mod:`yrelay.transport.ws_protocol`, parses no more than a few
  frames ahead). Nothing is refused, so nothing cascades: the updates behind
  a slowed one are not turned into ``missing_dependency``;
- **a hard bound** for frames and control frames, which a well-behaved
  client never sends faster than their rates for long (updates and answers
  may legitimately wait a while: an offline client's flush, a large
  workspace's first load; waiting costs the server nothing, so those are
  never closed for): time held back by frames and control frames is
  summed, forgetting with a time constant of ``PRESSURE_DECAY`` times
  ``throttle_close_seconds``; past
  ``throttle_close_seconds`` (held back without a pause: after ~12 s for
  the default 10) :class:`Flooded` is raised, and the endpoint closes the
  connection with **4429** after saying when to come back. (The server's
  keepalive does not take a held-back connection for dead while frames it
  sent wait unread: :mod:`yrelay.transport.ws_protocol`.)

Before authentication a connection has tiny buckets of its own: a client
has exactly one frame to send then (``hello``), and the ``hello`` deadline
ends the rest. The per-session and per-subject update limits wait through
the same :meth:`hold` (:mod:`.allowance`), unbounded. A ban by address is
not a defence: users behind one NAT share one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from yrelay.transport.buckets import DebtBucket, TokenBucket

if TYPE_CHECKING:
    from yrelay.app.metrics import Metrics
    from yrelay.config import Settings

#: Frames a connection handles in a row before it yields to the event loop ...
FRAMES_PER_TURN = 16
#: ... or bytes of frames.
BYTES_PER_TURN = 256 * 1024
#: The decaying sum of time held back forgets with a time constant of this
#: many times ``throttle_close_seconds`` (10 s: 30 s). Held back without a
#: pause, the sum reaches the bound after ~1.2 times the bound (it levels off
#: at the time constant, so that must be larger than the bound).
PRESSURE_DECAY = 3.0
#: Before authentication: frames per second and at once (one ``hello`` is
#: all a client sends before its ``welcome``).
PREAUTH_RATE = 1.0
PREAUTH_BURST = 4
#: Close code of a connection held back by its rates past the hard bound.
CLOSE_TOO_MANY_MESSAGES = 4429


class Flooded(Exception):
    """The connection was held back by its rates for too long: close it (4429)."""

    def __init__(self, retry_after_ms: int):
        super().__init__(
            f"too many messages: held back by the server's rates for too long; "
            f"reconnect no sooner than {retry_after_ms} ms"
        )
        self.retry_after_ms = retry_after_ms


class Pacer(TokenBucket):
    """One websocket's share of the event loop and its rates. It is itself
    the connection's frame bucket (one object less per idle connection)."""

    __slots__ = (
        "_settings",
        "_metrics",
        "_control",
        "_answers",
        "_turn_frames",
        "_turn_bytes",
        "_pressure",
        "_pressure_at",
        "trusted",
    )

    def __init__(self, settings: Settings, metrics: Metrics | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__(PREAUTH_RATE, PREAUTH_BURST, clock)
        self._settings = settings
        self._metrics = metrics
        #: Control frames, and answer bytes (which may go negative: an
        #: answer's size is known once sent); each made when first needed
        #: (an idle connection's memory counts).
        self._control: TokenBucket | None = None
        self._answers: DebtBucket | None = None
        self._turn_frames = 0
        self._turn_bytes = 0
        self._pressure = 0.0
        self._pressure_at = 0.0
        self.trusted = False

    def trust(self) -> None:
        """The connection authenticated: its full rates apply from now on."""
        s = self._settings
        self.trusted = True
        self.rate, self.burst = s.frames_per_second, max(s.frame_burst, 1.0)
        self._balance = self.burst

    async def admit(self, size: int) -> None:
        """Wait until the connection may handle one more frame of ``size``
        bytes: yield at the end of a turn, wait for a frame token. Raises
        :class:`Flooded` past the hard bound."""
        self._turn_frames += 1
        self._turn_bytes += size
        if self._turn_frames >= FRAMES_PER_TURN or self._turn_bytes >= BYTES_PER_TURN:
            self._turn_frames = self._turn_bytes = 0
            await asyncio.sleep(0)  # the rest of the loop runs before our next frame
        await self._take(self, "frames")

    async def control(self) -> None:
        """A control frame (after :meth:`admit`): wait for a control token."""
        if not self.trusted:
            return
        if self._control is None:
            s = self._settings
            self._control = TokenBucket(s.control_per_second, s.control_burst, self._clock)
        await self._take(self._control, "control")

    async def answer(self) -> None:
        """A request whose answer may be larger than itself (after
        :meth:`admit`): a control token, and the answers paid for."""
        await self.control()
        while (wait := self._answer_bucket().wait()) > 0:
            await self.hold(wait, "answers", bounded=False)

    def charge(self, sent: int) -> None:
        """An answer of ``sent`` bytes went out: the next requests that ask
        for answers wait until the bucket has paid for it."""
        self._answer_bucket().spend(sent)

    def _answer_bucket(self) -> DebtBucket:
        if self._answers is None:
            s = self._settings
            self._answers = DebtBucket(s.answer_bytes_per_second, s.answer_burst_bytes, self._clock)
        return self._answers

    async def hold(self, seconds: float, limit: str, bounded: bool = True) -> None:
        """Wait ``seconds`` for ``limit`` (reading nothing meanwhile), or,
        for a ``bounded`` limit, raise :class:`Flooded` when the connection
        has been held back by such limits for too long."""
        if not bounded:
            if self._metrics is not None:
                self._metrics.throttled(limit, seconds)
            await asyncio.sleep(seconds)
            return
        now, bound = self._clock(), self._settings.throttle_close_seconds
        tau = PRESSURE_DECAY * bound if bound > 0 else PRESSURE_DECAY
        if self._pressure:
            self._pressure *= math.exp(-(now - self._pressure_at) / tau)
        self._pressure += seconds
        self._pressure_at = now
        if bound > 0 and self._pressure > bound:
            if self._metrics is not None:
                self._metrics.flooded(limit)
            raise Flooded(max(1000, math.ceil(seconds * 1000)))
        if self._metrics is not None:
            self._metrics.throttled(limit, seconds)
        await asyncio.sleep(seconds)

    async def _take(self, bucket: TokenBucket, limit: str) -> None:
        while not bucket.take():
            await self.hold(bucket.retry_after_ms() / 1000, limit)


__all__ = ["CLOSE_TOO_MANY_MESSAGES", "Flooded", "Pacer"]
