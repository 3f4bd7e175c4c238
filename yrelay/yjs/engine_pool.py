"""Sync answers and GC folds in engine worker processes, under a deadline.

A sync answer or a fold integrates a whole document: work proportional to
the stream, in a Rust extension that holds the GIL. In the server's own
process a hostile input could stall the event loop or (with y-py) abort it.
Here each request goes to an idle ``python -m yrelay.yjs.engine`` worker
(:mod:`yrelay.yjs.engine`); one that misses ``engine_timeout`` or dies is killed
and restarted, and the request fails with :class:`EngineFailed`. The server
pays only the pipe copy of the document's bytes.

A caller that is cancelled (its connection closed) does not cancel the
request in flight: the worker finishes it (bounded by the deadline) before
it takes the next one, so no reply is ever left half read in a pipe.

With ``workers = 0`` the engine runs in a thread of the server process
(tools and tests; docs/security.md says what that gives up).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Sequence

from yrelay.yjs import crdt, engine
from yrelay.yjs.validator import WorkerFailed, WorkerProcess

log = logging.getLogger(__name__)

_HEAD = struct.Struct(">BI")
_U32 = struct.Struct(">I")
#: State vectors up to this size are decoded in full in the event loop (~1 ms
#: at most); larger ones (a document edited by hundreds of clients) only by
#: the worker, before pycrdt sees them: decoding a 1 MB vector takes ~0.3 s.
PRECHECK_BYTES = 4096


def precheck_state_vector(state_vector: bytes) -> None:
    """The event loop's part of checking a state vector: raises
    :class:`crdt.InvalidUpdate` before any Redis read or worker is spent on a
    bad one (see :data:`PRECHECK_BYTES`)."""
    if len(state_vector) <= PRECHECK_BYTES:
        crdt.check_state_vector(state_vector)


class EngineFailed(Exception):
    """The engine worker missed its deadline or died; nothing was computed."""


class EnginePool:
    """``await fold(...)`` / ``await sync_answer(...)`` off the event loop."""

    def __init__(self, workers: int, timeout: float, module: str = "yrelay.yjs.engine", with_ypy: bool = False):
        """``module``: what each worker runs (tests name a misbehaving one);
        ``with_ypy``: folds are proven against a y-py reload too (the
        ``validate_with_ypy`` setting). Workers start when :meth:`warm_up`
        is called, else on first use."""
        self.timeout = timeout
        self.with_ypy = with_ypy
        self._workers = [WorkerProcess(module, (engine.WITH_YPY_FLAG,) if with_ypy else ()) for _ in range(workers)]
        #: Last in, first out: a lone caller keeps getting the warm worker.
        self._idle: asyncio.LifoQueue[WorkerProcess] = asyncio.LifoQueue()
        for worker in self._workers:
            self._idle.put_nowait(worker)
        self._jobs: set[asyncio.Task[tuple[int, list[bytes]]]] = set()
        #: Requests that hung or crashed a worker.
        self.failures = 0
        self._warming: asyncio.Task[None] | None = None

    @property
    def restarts(self) -> int:
        return sum(worker.restarts for worker in self._workers)

    def warm_up(self) -> None:
        """Start the workers now, in the background (:meth:`warmed` waits
        for them). Started on first use instead, the first GC pass of a busy
        server spawned them: a fork of a process holding every connection,
        then two Python start-ups competing for the CPU with its clients
        (~190 ms of delay for every update in flight, the p99 of a
        many-documents bench run: BENCHMARKS.md "Issue 20: many"); and the
        first sync waited for the start-up."""
        if self._workers and self._warming is None:
            self._warming = asyncio.create_task(self._warm_up(), name="yrelay-engine-warm-up")

    async def warmed(self) -> None:
        if self._warming is not None:
            await asyncio.shield(self._warming)

    async def _warm_up(self) -> None:
        """Every idle worker started at once (a request arriving meanwhile
        waits for one of them: they are out of the idle queue)."""
        workers = [self._idle.get_nowait() for _ in range(self._idle.qsize())]
        try:
            results = await asyncio.gather(
                *(worker.start() for worker in workers if worker.process is None), return_exceptions=True
            )
            for failure in (result for result in results if isinstance(result, Exception)):
                log.warning("an engine worker did not start (%r): the first request starts it", failure)
        finally:
            for worker in workers:
                self._idle.put_nowait(worker)

    async def stop(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
        for worker in self._workers:
            await worker.stop()

    async def fold(self, base: bytes, updates: Sequence[bytes]) -> engine.Fold:
        """:func:`yrelay.yjs.engine.fold` in a worker."""
        snapshot, held = await self._call(engine.FOLD, [base, *updates])
        return engine.Fold(snapshot, int(held))

    async def sync_answer(self, state_vector: bytes, base: bytes, updates: Sequence[bytes]) -> engine.SyncAnswer:
        """:func:`yrelay.yjs.engine.sync_answer` in a worker; raises
        :class:`crdt.InvalidUpdate` for a bad state vector."""
        diff, vector, held = await self._call(engine.SYNC, [state_vector, base, *updates])
        return engine.SyncAnswer(diff, vector, int(held))

    async def _call(self, tag: int, items: list[bytes]) -> list[bytes]:
        if not self._workers:  # the reply frame computed in a thread, read as a worker's is
            frame = asyncio.StreamReader()
            frame.feed_data(await asyncio.to_thread(engine.answer, tag, items, self.with_ypy))
            frame.feed_eof()
            status, reply = await _read_frame(frame)
        else:
            job = asyncio.create_task(self._on_idle_worker(engine.encode_frame(tag, items)))
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)
            status, reply = await asyncio.shield(job)
        if status != engine.OK:
            raise crdt.InvalidUpdate(reply[0].decode(errors="replace") if reply else "refused")
        return reply

    async def _on_idle_worker(self, request: bytes) -> tuple[int, list[bytes]]:
        worker = await self._idle.get()
        try:
            return await worker.exchange(request, _read_frame, self.timeout)
        except WorkerFailed as exc:
            self.failures += 1
            raise EngineFailed(f"the CRDT engine did not answer within {self.timeout:g}s ({exc})") from None
        finally:
            self._idle.put_nowait(worker)


async def _read_frame(stdout: asyncio.StreamReader) -> tuple[int, list[bytes]]:
    status, count = _HEAD.unpack(await stdout.readexactly(_HEAD.size))
    items = []
    for _ in range(count):
        (length,) = _U32.unpack(await stdout.readexactly(_U32.size))
        items.append(await stdout.readexactly(length))
    return status, items


__all__ = ["EngineFailed", "EnginePool", "precheck_state_vector"]
