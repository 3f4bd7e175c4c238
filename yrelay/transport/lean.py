"""An event and a queue that cost an idle connection next to nothing.

``asyncio.Event`` makes a ``collections.deque`` for its waiters when it is
created, and ``asyncio.Queue`` four of them (its items, getters, putters and
an ``Event``): a deque is a 64-slot block, ~760 bytes, even empty. uvicorn's
websocket protocol holds a queue and an event per connection and yrelay an
event per subscription: ~5 kB of an idle connection, measured with
tracemalloc (BENCHMARKS.md, "Issue 20: idle memory"). These keep their
waiters in a list made when the first one waits, with the same semantics
for what uvicorn and yrelay use of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Waiters:
    """Futures of the tasks waiting, in arrival order; the list is made on the first wait."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] | None = None

    async def _wait(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)

    def _wake(self, everyone: bool) -> None:
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return


class Flag(_Waiters):
    """``asyncio.Event``'s ``set``, ``clear``, ``is_set`` and ``wait``."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        super().__init__()
        self._value = False

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if not self._value:
            self._value = True
            self._wake(everyone=True)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if not self._value:
            await self._wait()
        return True


class Inbox(_Waiters, Generic[T]):
    """An unbounded FIFO with ``asyncio.Queue``'s ``put_nowait``, ``get`` and
    ``empty``: what uvicorn's protocol uses of its receive queue."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        super().__init__()
        self._items: list[T] = []  # a handful at most: uvicorn stops reading after each message

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        self._wake(everyone=False)

    async def get(self) -> T:
        while not self._items:
            try:
                await self._wait()
            except asyncio.CancelledError:
                if self._items:  # woken, then cancelled: the item is another getter's now
                    self._wake(everyone=False)
                raise
        return self._items.pop(0)


class Kick:
    """A flag whose ``set`` also calls ``start``: for a loop that runs on a
    task of its own while the flag is set and ends when it finds it clear,
    so nothing waits while there is nothing to do. ``start`` must do nothing
    while that task runs (it sees the flag before it ends: a set and the
    task's last check cannot interleave, as neither awaits).

    A loop that expects more work soon (a subscription of a busy document)
    may :meth:`park` instead of ending: the next ``set`` wakes it without a
    new task (making one per batch per subscriber was a tenth of a busy
    server's CPU, BENCHMARKS.md "Issue 20: hot p99"), and :meth:`release_if_quiet`,
    called periodically, ends a park no ``set`` reached since its last call.
    """

    __slots__ = ("_value", "_start", "_parked", "_kicked")

    def __init__(self, start: Callable[[], None]) -> None:
        self._value = False
        self._start = start
        #: The parked loop's future: True wakes it to work, False ends it.
        self._parked: asyncio.Future[bool] | None = None
        #: A set since the last release_if_quiet.
        self._kicked = False

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        self._value = True
        self._kicked = True
        parked, self._parked = self._parked, None
        if parked is not None and not parked.done():
            parked.set_result(True)
        else:
            self._start()

    def clear(self) -> None:
        self._value = False

    @property
    def parked(self) -> bool:
        return self._parked is not None

    async def park(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait for the next ``set`` (True) or a quiet period (False: end the
        loop, unless the flag was set meanwhile: check it before ending)."""
        parked: asyncio.Future[bool] = loop.create_future()
        self._parked = parked
        try:
            return await parked
        finally:
            if self._parked is parked:  # cancelled: nobody resolved it
                self._parked = None

    def release_if_quiet(self) -> None:
        """End a park no ``set`` reached since the previous call."""
        parked = self._parked
        if parked is not None and not self._kicked:
            self._parked = None
            if not parked.done():
                parked.set_result(False)
        self._kicked = False


__all__ = ["Flag", "Inbox", "Kick"]
