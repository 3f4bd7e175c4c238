"""One task for every connection's periodic checks (a timer wheel).

Each connection used to keep a task of its own asleep between checks (the
``hello`` deadline, resends of quiet documents, the token's expiry and
revocation): a task, its coroutine frame, a future and a timer handle per
idle connection, about a tenth of what an idle connection cost (BENCHMARKS.md,
"Issue 20: idle memory"). Here one task per process turns a wheel of
:data:`SLOTS` slots, one slot every ``interval / SLOTS`` seconds, so every
callback still runs once per ``interval`` and the work of many connections
is spread over the interval instead of all landing in one turn.

A callback is synchronous and short; anything slow it starts as a task of
its own. It runs in a copy of the context it was registered from (log
lines name the connection's session and document as before), and an
exception is logged without stopping the others or its own next tick.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Slots of the wheel: each connection's callback lands in one of them.
SLOTS = 10

Tick = Callable[[], None]


class Ticker:
    """Calls every registered callback once per ``interval`` seconds."""

    def __init__(self, interval: float):
        self.interval = interval
        self._slots: list[dict[int, tuple[Tick, contextvars.Context]]] = [{} for _ in range(SLOTS)]
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return sum(len(slot) for slot in self._slots)

    def add(self, tick: Tick) -> Callable[[], None]:
        """Call ``tick`` once per interval from now on; returns its removal."""
        key = next(self._ids)
        slot = self._slots[key % SLOTS]
        slot[key] = (tick, contextvars.copy_context())
        if self._task is None or self._task.done():
            # a context of its own: the first caller's session must not name every later line
            self._task = asyncio.create_task(self._turn(), name="yrelay-ticker", context=contextvars.Context())

        def remove() -> None:
            slot.pop(key, None)

        return remove

    async def _turn(self) -> None:
        """Runs while anything is registered; the next ``add`` starts it again."""
        for index in itertools.cycle(range(SLOTS)):
            await asyncio.sleep(self.interval / SLOTS)
            for tick, context in list(self._slots[index].values()):
                try:
                    context.run(tick)
                except Exception:
                    log.exception("a periodic connection check failed; it runs again next tick")
            if not len(self):
                self._task = None
                return

    def close(self) -> None:
        """Stop the wheel (the server is stopping)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None


__all__ = ["SLOTS", "Ticker"]
