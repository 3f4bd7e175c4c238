"""Updates between their arrival and their answer, bounded in count and bytes.

With updates up to ``max_update_bytes`` (16 MiB), a count alone bounds
nothing: 256 updates in flight on one connection could hold 4 GiB. So a
connection takes a slot *and* its update's bytes before it reads on: past
its own byte cap, or the process's, its read loop waits (TCP backpressure
on that client only) until earlier updates are answered. One update larger
than a cap still goes through when nothing else is in flight, so the caps
never refuse an update ``max_update_bytes`` allows.
"""

from __future__ import annotations

import asyncio


class ByteBudget:
    """Bytes held at once; :meth:`acquire` waits while they would exceed ``limit``."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def acquire(self, size: int) -> None:
        while self.held and self.held + size > self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each checks again whether it fits now
            if not waiter.done():
                waiter.set_result(None)


class InflightUpdates:
    """One connection's updates in flight: a count, its bytes, and the process's bytes."""

    def __init__(self, max_count: int, max_bytes: int, process: ByteBudget):
        self._slots = asyncio.Semaphore(max_count)
        self._bytes = ByteBudget(max_bytes)
        self._process = process

    async def acquire(self, size: int) -> None:
        await self._slots.acquire()
        try:
            await self._bytes.acquire(size)
            try:
                await self._process.acquire(size)
            except BaseException:
                self._bytes.release(size)
                raise
        except BaseException:
            self._slots.release()
            raise

    def release(self, size: int) -> None:
        self._slots.release()
        self._bytes.release(size)
        self._process.release(size)
