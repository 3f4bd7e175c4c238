"""The tasks of a long-lived service: loops that are restarted when they
crash, and one-off tasks whose errors are never lost.

Every service of a server process (appender, fan-out, presence, the ack
writer, the GC loop, revocations, subject leases, consumer heartbeats,
validator workers, subscription pumps) runs a loop for as long as it lives.
One rule supervises them all (:class:`BackgroundTask`): a loop that ends
with an exception is logged once (a warning when Redis or its connection
was lost, :func:`lost_redis`; an error with the
traceback otherwise), counted (:data:`RESTARTS`, the metric
``yrelay_background_restarts_total``) and started again after a backoff.
Before, each loop decided for itself which errors it survived, and one that
guessed wrong stopped for good with nothing but a log line: the token
revocation refresh died of a uvloop ``RuntimeError`` in a cluster failover,
and that process stopped enforcing revocations.

A one-off task nothing awaits (a flush, a prefetch, a close) is started
with :func:`spawn`: asyncio keeps only a weak reference to a task, and an
exception nobody retrieves surfaces as "Task exception was never retrieved"
when the task is collected, without saying what it was doing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import DataError, RedisClusterException, RedisError, ResponseError

from yrelay.backoff import REDIS_RECONNECT, Backoff

log = logging.getLogger(__name__)

# A command written to a connection torn down under it raises something
# other than a ConnectionError, which lost_redis() takes as a lost connection
# all the same. redis-py 8's cluster client, on one node's failure, closes
# every connection of the client, and another task's command then writes to
# a connection whose writer is gone: ``AttributeError: 'NoneType' object has
# no attribute 'writelines'`` (seen in tests/test_cluster.py's kill -9);
# under uvloop the transport itself refuses: ``RuntimeError: unable to
# perform operation on <TCPTransport closed=True ...>; the handler is
# closed`` (seen in ``yrelay chaos --cluster``, where it ended the token
# revocation loop for good).

#: Methods of a stream, transport or socket: one called on ``None`` is I/O on
#: a connection that is gone.
_IO_METHODS = frozenset(
    {
        "write",
        "writelines",
        "drain",
        "read",
        "readline",
        "readexactly",
        "readuntil",
        "close",
        "wait_closed",
        "is_closing",
        "at_eof",
        "get_extra_info",
        "send",
        "recv",
        "feed_data",
        "set_exception",
    }
)
#: What an event loop's transport says when asked to work after its close.
_CLOSED_TRANSPORT = re.compile(r"handler is closed|[Tt]ransport is closed|closed=True|after write_eof")
#: Redis's replies that are a bug of the caller, not a passing state of Redis
#: (a script that failed, arguments of the wrong type).
_CALLER_FAULT = re.compile(r"user_script|Error running script|Error compiling script|wrong number of arguments")
#: Redis's passing states, also when a script met them (``Error running
#: script ... -NOREPLICAS``: ``min-replicas-to-write`` refused the write).
_PASSING_STATE = re.compile(r"\b(NOREPLICAS|BUSY|LOADING|MASTERDOWN|READONLY|OOM|CLUSTERDOWN|TRYAGAIN|MISCONF)\b")
#: What a cluster client raises when no node it knows serves a slot (a
#: failover still electing, every seed down): retried like a lost node. Not
#: every RedisClusterException: CROSSSLOT and argument mistakes are bugs.
_CLUSTER_UNREACHABLE = re.compile(r"cannot be connected|not covered|could not agree on a valid slots cache")


def lost_redis(exc: BaseException) -> bool:
    """``exc`` says the connection to Redis was lost or Redis failed, and the
    call may be made again: a Redis error, an OS error (refused, reset, timed
    out), an end of stream, or I/O on a connection torn down under the call
    (an attribute of ``None`` that is a stream's I/O method, or a transport
    refusing to work after its close: :data:`_IO_METHODS`). Decided by
    what the error means, never by which frame raised it: the same race
    raises from redis-py, from asyncio or from uvloop's compiled transport.

    Not lost Redis, but a bug: arguments redis-py refuses (``DataError``), a
    script that failed, an attribute of ``None`` outside redis-py's own
    code. The background loops log a bug with its traceback
    (:class:`yrelay.tasks.BackgroundTask` then restarts the loop)."""
    if isinstance(exc, DataError):
        return False
    if isinstance(exc, ResponseError):
        return bool(_PASSING_STATE.search(str(exc))) or not _CALLER_FAULT.search(str(exc))
    if isinstance(exc, (RedisError, OSError, EOFError)):
        return True
    if isinstance(exc, RedisClusterException):
        return bool(_CLUSTER_UNREACHABLE.search(str(exc)))
    if isinstance(exc, AttributeError):
        return (
            getattr(exc, "obj", False) is None
            and getattr(exc, "name", None) in _IO_METHODS
            and _passed_through_redis_py(exc)
        )
    if isinstance(exc, RuntimeError):
        return bool(_CLOSED_TRANSPORT.search(str(exc)))
    return False


def _passed_through_redis_py(exc: BaseException) -> bool:
    """``exc`` was raised in, or on its way out of, redis-py's own code (our
    own ``None.close()`` is a bug, not a torn-down connection)."""
    tb = exc.__traceback__
    while tb is not None:
        if f"{os.sep}redis{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


Loop = Callable[[], Coroutine[Any, Any, None]]
#: Seconds a cancelled loop has to end before it is cancelled again.
RECANCEL_AFTER = 1.0
#: A loop that ran this long before it crashed is restarted after the
#: shortest backoff again: it was healthy, this is a new fault.
HEALTHY_RUN = 30.0
#: The restart schedule of a loop that crashed of a bug (not a lost Redis):
#: 1 s doubling to a minute, so that a bug that repeats logs a traceback a
#: minute, not one per reconnect delay.
BUG_RESTART = Backoff(base=1.0, factor=2.0, max_delay=60.0, jitter=0.0)
#: Restarts of each kind of loop in this process (read by :mod:`yrelay.app.metrics`).
RESTARTS: Counter[str] = Counter()
#: One-off tasks still running (:func:`spawn`): asyncio holds them weakly.
_SPAWNED: set[asyncio.Task[Any]] = set()


class BackgroundTask:
    """``start()`` runs ``loop()`` as a task named ``name``; ``stop()`` ends
    it. Both are idempotent, and ``stop()`` before ``start()`` does nothing.

    ``loop()`` returning ends the task; raising restarts it after
    :data:`~yrelay.backoff.REDIS_RECONNECT`'s backoff (0.1 s doubling to
    5 s, from the start again after :data:`HEALTHY_RUN` seconds of health).
    ``kind`` names the loop in :data:`RESTARTS` (a name without document
    ids: the metric's label)."""

    __slots__ = ("name", "kind", "_loop", "_task", "_stopping", "crashes")

    def __init__(self, name: str, loop: Loop, *, kind: str | None = None):
        self.name = name
        self.kind = kind or name
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        #: Made when first needed (a stop, or a restart's wait): an Event's
        #: deque is ~0.6 kB on every subscription of an idle connection (a
        #: subscription's pump is one of these).
        self._stopping: asyncio.Event | None = None
        #: Times the loop ended with an exception (logged each time) and was restarted.
        self.crashes = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _stop_event(self) -> asyncio.Event:
        if self._stopping is None:
            self._stopping = asyncio.Event()
        return self._stopping

    def start(self) -> None:
        if not self.running:
            if self._stopping is not None:
                self._stopping.clear()
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
        self._stop_event().set()  # a loop waiting to be restarted is not
        if task is None or task is asyncio.current_task():
            return
        while cancel and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=RECANCEL_AFTER)
        await asyncio.gather(task, return_exceptions=True)

    async def _guarded(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await self._loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_lost_cancel()  # a cancel swallowed on the way (redis-py): end, do not restart
                if time.monotonic() - started >= HEALTHY_RUN:
                    failures = 0
                lost = lost_redis(exc)
                # A bug waits longer between tracebacks (up to a minute), a lost Redis reconnects within 5 s.
                delay = (REDIS_RECONNECT if lost else BUG_RESTART).delay(min(failures, 32))
                failures += 1
                self.crashes += 1
                RESTARTS[self.kind] += 1
                if lost:
                    log.warning("background task %s lost Redis (%r); restarting it in %.1fs", self.name, exc, delay)
                else:
                    log.exception("background task %s crashed; restarting it in %.1fs", self.name, delay)
            if await wait_event(self._stop_event(), delay):
                return


def spawn(work: Coroutine[Any, Any, Any], *, name: str | None = None) -> asyncio.Task[Any]:
    """Run ``work`` as a task nothing has to await: referenced until it
    ends, and its exception (if any) logged with ``name``: a warning when
    Redis was lost, an error with the traceback otherwise; a cancel is not
    an error."""
    task = asyncio.create_task(work, name=name)
    _SPAWNED.add(task)
    task.add_done_callback(_spawned_done)
    return task


class TaskSet:
    """The one-off tasks of one owner (a connection, the appender), started
    with :func:`spawn` under ``name``: cancelled together when the owner
    closes (:meth:`cancel`, then :meth:`wait` if it must see them end)."""

    def __init__(self, name: str):
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = spawn(work, name=self.name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def wait(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _spawned_done(task: asyncio.Task[Any]) -> None:
    _SPAWNED.discard(task)
    if task.cancelled() or (exc := task.exception()) is None:
        return
    if lost_redis(exc):
        log.warning("task %s: Redis was lost (%r)", task.get_name(), exc)
    else:
        log.error("task %s failed", task.get_name(), exc_info=exc)


async def run_until(work: Coroutine[Any, Any, None], stop: asyncio.Event | None) -> None:
    """Run ``work`` until ``stop`` is set (never without one: until the
    caller is cancelled), then cancel it and wait for it to end."""
    task = asyncio.create_task(work)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


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


__all__ = ["RESTARTS", "BackgroundTask", "TaskSet", "raise_lost_cancel", "spawn", "wait_event"]
