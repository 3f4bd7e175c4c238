"""Checking updates before they are stored, in validator processes.

The CRDT engines are Rust extensions: pycrdt has panicked on hostile
updates, and y-py 0.6.2 can take the whole process down (a 21-byte update
that passes yrelay's own layout decoder makes yrs panic with a message pyo3
cannot convert, and the runtime aborts: SIGABRT; see tests/test_validator.py).
Size is no protection, so every update is applied by pycrdt (and y-py, with
``validate_with_ypy``) in a worker process (:mod:`yrelay.yjs.validation`),
never here, unless its shape alone shows both engines read it.

- In-loop, only yrelay's pure-Python layout check, for updates up to
  ``PREFILTER_BYTES``: garbage is refused without a round trip; and an
  update of a shape both engines are known to read (decided by the same
  read: :attr:`yrelay.yjs.update_format.Layout.known_safe`; most typing) passes
  without one. No engine ever runs here.
- Everything queued while a worker is busy goes to it as one batch, so the
  pipe round trip is paid once per batch, not per update (group commit,
  like the appender). Figures: BENCHMARKS.md#validation.
- A worker that does not answer within ``validate_timeout``, or dies, is
  restarted; its batch is checked again one update at a time, and an update
  that alone runs past the deadline or kills the worker is rejected.

With ``validator_workers = 0`` everything runs in-loop (the old behaviour).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from yrelay.tasks import BackgroundTask
from yrelay.yjs import crdt
from yrelay.yjs.engine import READY, WITH_YPY_FLAG
from yrelay.yjs.update_format import Layout
from yrelay.yjs.validation import encode_request

log = logging.getLogger(__name__)

#: Bytes of updates sent to a worker in one batch (at least one update).
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Seconds a worker process may take to start (imports) before it counts as failed.
STARTUP_TIMEOUT = 60.0
#: Updates up to this size get the layout check in-loop first (a few us).
PREFILTER_BYTES = 4096

_Item = tuple[bytes, "asyncio.Future[Exception | None]"]
_T = TypeVar("_T")


class WorkerFailed(Exception):
    """The worker did not answer in time, or died."""


class ValidatorUnavailable(Exception):
    """The update could not be checked (not its fault): try again later."""


class WorkerProcess:
    """One ``python -m <module>`` process spoken to over its stdin/stdout
    (validation here; the CRDT engine's pool in :mod:`.engine_pool`)."""

    def __init__(self, module: str, args: tuple[str, ...] = ()) -> None:
        self.module = module
        self.args = args
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            # y-py prints every panic it catches: a hostile client must not fill
            # the log with them. Crashes and timeouts are logged by _one_by_one.
            stderr=asyncio.subprocess.DEVNULL,
        )
        # Python start-up and imports take 0.1 s, seconds on a loaded host:
        # they must not count against a request's deadline.
        assert self.process.stdout is not None
        try:
            if await asyncio.wait_for(self.process.stdout.readexactly(1), STARTUP_TIMEOUT) != READY:
                raise OSError("the worker did not start")
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            self.process.kill()
            raise

    async def check(self, updates: list[bytes], timeout: float) -> list[str]:
        async def reasons(stdout: asyncio.StreamReader) -> list[str]:
            found = []
            for _ in updates:
                (length,) = struct.unpack(">H", await stdout.readexactly(2))
                found.append((await stdout.readexactly(length)).decode(errors="replace") if length else "")
            return found

        return await self.exchange(encode_request(updates), reasons, timeout)

    async def exchange(
        self, request: bytes, read_reply: Callable[[asyncio.StreamReader], Awaitable[_T]], timeout: float
    ) -> _T:
        """Send ``request`` and read the reply within ``timeout`` seconds;
        a worker that misses the deadline or dies is restarted
        (:class:`WorkerFailed`). Starts the process on first use."""
        failures = (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ConnectionError)
        try:
            if self.process is None or self.process.returncode is not None:
                await self.restart()
        except failures as exc:
            raise WorkerFailed(f"could not start: {type(exc).__name__}") from None
        try:
            return await asyncio.wait_for(self._round_trip(request, read_reply), timeout)
        except failures as exc:
            with contextlib.suppress(*failures):
                await self.restart()
            raise WorkerFailed(type(exc).__name__) from None

    async def _round_trip(self, request: bytes, read_reply: Callable[[asyncio.StreamReader], Awaitable[_T]]) -> _T:
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        process.stdin.write(request)
        await process.stdin.drain()
        return await read_reply(process.stdout)

    async def restart(self) -> None:
        await self.stop()
        self.restarts += 1
        await self.start()

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.kill()
        await process.wait()


class Validator:
    """``await validate(update)`` raises :class:`crdt.InvalidUpdate` or returns."""

    def __init__(self, workers: int, timeout: float, module: str = "yrelay.yjs.validation", with_ypy: bool = False):
        """``module``: what each worker runs (tests name a misbehaving one);
        ``with_ypy``: y-py's check too (the ``validate_with_ypy`` setting)."""
        self.timeout = timeout
        self.with_ypy = with_ypy
        self._workers = [WorkerProcess(module, (WITH_YPY_FLAG,) if with_ypy else ()) for _ in range(workers)]
        self._queue: deque[_Item] = deque()
        self._ready = asyncio.Event()
        self._loops = [
            BackgroundTask("yrelay-validator", functools.partial(self._serve, worker)) for worker in self._workers
        ]
        #: Updates rejected because they hung or crashed a worker.
        self.timeouts = 0
        #: Updates passed without a worker: a shape both engines read.
        self.known_safe = 0

    @property
    def restarts(self) -> int:
        return sum(worker.restarts for worker in self._workers)

    async def start(self) -> None:
        for worker, loop in zip(self._workers, self._loops, strict=True):
            await worker.start()
            loop.start()

    async def stop(self) -> None:
        await asyncio.gather(*(loop.stop() for loop in self._loops))
        for worker in self._workers:
            await worker.stop()
        for _, future in self._queue:
            future.cancel()

    def submit(
        self, update: bytes, layout_checked: bool = False, layout: Layout | None = None
    ) -> asyncio.Future[Exception | None]:
        """Queue ``update``; the future resolves to None (valid) or the error
        to report (:class:`crdt.InvalidUpdate`, :class:`ValidatorUnavailable`).
        Raises :class:`crdt.InvalidUpdate` at once when the in-loop check does;
        ``layout_checked``: the caller already read the whole layout (the
        connection's causal read), so that check is not done twice;
        ``layout``: that read, given, lets an update of a shape both engines
        are known to read (``layout.known_safe``) pass without a worker."""
        future: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        if not self._workers:
            crdt.validate_update(update, self.with_ypy)
            future.set_result(None)
            return future
        if layout is not None and layout.known_safe:
            self.known_safe += 1
            future.set_result(None)
            return future
        if len(update) <= PREFILTER_BYTES and not layout_checked:
            crdt.check_layout(update)
        self._queue.append((update, future))
        self._ready.set()
        return future

    async def validate(self, update: bytes) -> None:
        error = await self.submit(update)
        if error is not None:
            raise error

    def _take_batch(self) -> list[_Item]:
        batch: list[_Item] = []
        size = 0
        while self._queue and (not batch or size + len(self._queue[0][0]) <= MAX_BATCH_BYTES):
            item = self._queue.popleft()
            if item[1].done():  # the connection went away meanwhile
                continue
            batch.append(item)
            size += len(item[0])
        if not self._queue:
            self._ready.clear()
        return batch

    async def _serve(self, worker: WorkerProcess) -> None:
        while True:
            await self._ready.wait()
            batch = self._take_batch()
            if not batch:
                continue
            try:
                try:
                    reasons = await worker.check([update for update, _ in batch], self.timeout)
                    errors: list[Exception | None] = [crdt.InvalidUpdate(r) if r else None for r in reasons]
                except WorkerFailed:
                    errors = await self._one_by_one(worker, batch)
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:  # never leave a connection waiting
                log.exception("validator failed")
                errors = [ValidatorUnavailable(type(exc).__name__) for _ in batch]
            for (_, future), error in zip(batch, errors, strict=True):
                if not future.done():
                    future.set_result(error)

    async def _one_by_one(self, worker: WorkerProcess, batch: list[_Item]) -> list[Exception | None]:
        """A batch hung or crashed its worker: find the update(s) that did."""
        errors: list[Exception | None] = []
        for update, _ in batch:
            try:
                [reason] = await worker.check([update], self.timeout)
                errors.append(crdt.InvalidUpdate(reason) if reason else None)
            except WorkerFailed as exc:
                self.timeouts += 1
                log.warning("an update of %d bytes hung or crashed the validator (%s); rejected", len(update), exc)
                errors.append(crdt.InvalidUpdate(f"the update could not be decoded within {self.timeout:g}s"))
        return errors


__all__ = ["Validator", "ValidatorUnavailable"]
