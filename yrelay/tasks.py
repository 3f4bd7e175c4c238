"""One background task of a long-lived service: started by name, a crash
logged and counted, stopped by cancel + await.

Every service of a server process (appender, fan-out, presence, the ack
writer, the GC loop, revocations, validator workers, subscription pumps)
runs a loop for as long as it lives. Written out by hand, each had its own
copy of "create the task, keep a reference, cancel it, wait for it", and a
loop that died of an unexpected exception did so silently (asyncio only
says "Task exception was never retrieved" when the task is collected).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Loop = Callable[[], Coroutine[Any, Any, None]]
#: Seconds a cancelled loop has to end before it is cancelled again.
RECANCEL_AFTER = 1.0


class BackgroundTask:
    """``start()`` runs ``loop()`` as a task named ``name``; ``stop()`` ends
    it. Both are idempotent, and ``stop()`` before ``start()`` does nothing."""

    def __init__(self, name: str, loop: Loop):
        self.name = name
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        #: Times the loop ended with an exception (logged each time).
        self.crashes = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if not self.running:
            self._task = asyncio.create_task(self._guarded(), name=self.name)

    async def stop(self, *, cancel: bool = True) -> None:
        """Cancel the loop and wait until it has ended. ``cancel=False``:
        the service told its loop to return by itself, only wait (a cancel
        that lands inside a Redis call can be swallowed by redis-py). Called
        from the loop itself, it only forgets the task (it is ending).

        A cancel is repeated every :data:`RECANCEL_AFTER` seconds until the
        loop ends: redis-py swallows one that lands while it connects (seen
        with a stop right after a start), and the loop would run on."""
        task, self._task = self._task, None
        if task is None or task is asyncio.current_task():
            return
        while cancel and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=RECANCEL_AFTER)
        await asyncio.gather(task, return_exceptions=True)

    async def _guarded(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.crashes += 1
            log.exception("background task %s crashed", self.name)


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds have passed;
    whether it was set.

    Not ``asyncio.wait_for``: on Python 3.11 it can swallow a cancel that
    lands as the event is set (python/cpython#86296, fixed in 3.12), and a
    loop stopped by that cancel then runs on for ever (seen: a consumer
    group member whose task a cancel did not end). ``asyncio.timeout``
    keeps the cancel.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


def raise_lost_cancel() -> None:
    """Raise the cancel of the current task if something swallowed it.

    redis-py sends a command under ``asyncio.wait_for``, which on Python 3.11
    drops a cancel that lands as the write completes (python/cpython#86296);
    the task still counts it (``Task.cancelling()``), but a loop that goes on
    would never end (seen: a test's ``async for batch in member.batches()``
    cancelled during the reader's XREAD). Call it at the top of each turn of
    a loop a caller may cancel."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


__all__ = ["BackgroundTask", "raise_lost_cancel", "wait_event"]
