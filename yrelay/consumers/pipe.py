"""``yrelay consume``: a group member that pipes its batches to a command.

For quick scripts: each batch is one JSON line on the command's stdin (the
webhook's body, :func:`yrelay.consumers.webhook.payload`), and the command
acks it by writing ``ack <delivery id>`` on its stdout (other lines are
passed through to stderr). Only an acked batch is recorded for the group;
at most ``window`` batches are written and not yet acked. With
``ack_on_write`` a batch is acked as soon as it was written to the pipe
(fire and forget: what the command had not processed when it dies is lost
to the group).

The command is restarted when it exits (0.5 s doubling to 30 s, back to
0.5 s once it ran for a minute), and the new one first gets again every
batch the old one had not acked, in order: at least once, as everywhere in
a group. docs/consumers.md, "yrelay consume".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

from redis.asyncio import Redis

from yrelay.backoff import Backoff, Reconnect
from yrelay.consumers.batch import Batch
from yrelay.consumers.group import ConsumerGroup
from yrelay.consumers.progress import AckResult
from yrelay.consumers.webhook import delivery_id, payload
from yrelay.tasks import run_until

log = logging.getLogger(__name__)

RESTART_BACKOFF = Backoff(base=0.5, factor=2.0, max_delay=30.0, jitter=0.2)
#: A command that ran this long before exiting restarts at the backoff's first delay.
HEALTHY_RUN = 60.0
#: Longest line read from the command's stdout.
LINE_LIMIT = 1 << 20
#: Seconds a command gets to exit after SIGTERM before it is killed.
STOP_GRACE = 5.0


@dataclass
class PipeStats:
    written: int = 0  # lines written (a batch sent again to a restarted command counts again)
    acked: int = 0  # batches acked and recorded
    refused_acks: int = 0  # acks the group refused (the document moved to another member)
    restarts: int = 0  # times the command was started again
    unknown_acks: int = 0  # ``ack`` lines naming no batch in flight


class Pipe:
    """Feed what ``group`` (started by the caller) reads to ``command``."""

    def __init__(
        self,
        group: ConsumerGroup,
        command: list[str],
        *,
        ack_on_write: bool = False,
        window: int = 16,
        backoff: Backoff = RESTART_BACKOFF,
    ):
        if not command:
            raise ValueError("no command to run")
        self.group = group
        self.command = command
        self.ack_on_write = ack_on_write
        self.backoff = backoff
        self.stats = PipeStats()
        self._window = asyncio.Semaphore(window)
        #: delivery id -> batch, in the order read: written and not acked yet (or not written yet).
        self._unacked: OrderedDict[str, Batch] = OrderedDict()
        self._more = asyncio.Event()
        self.process: asyncio.subprocess.Process | None = None

    async def run(self) -> None:
        """Until cancelled: read batches, run the command, restart it when it exits."""
        feed = asyncio.create_task(self._feed())
        restarts = Reconnect(self.backoff)
        try:
            while True:
                started = time.monotonic()
                try:
                    code: int | str = await self._run_once()
                except OSError as exc:  # not found, not executable: say so and try again (it may be deployed yet)
                    code = f"an error ({exc})"
                if time.monotonic() - started > HEALTHY_RUN:
                    restarts.succeeded()
                log.warning(
                    "consume %s: %s exited with %s; restarting in %.1fs (%d batches not acked)",
                    self.group.name,
                    self.command[0],
                    code,
                    restarts.delay,
                    len(self._unacked),
                )
                await restarts.wait()
                self.stats.restarts += 1
        finally:
            feed.cancel()
            await asyncio.gather(feed, return_exceptions=True)
            await self._stop_process()

    async def _feed(self) -> None:
        async for batch in self.group.batches():
            await self._window.acquire()
            self._unacked[delivery_id(batch)] = batch
            self._more.set()

    async def _run_once(self) -> int:
        self.process = process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=LINE_LIMIT
        )
        writer = asyncio.create_task(self._write(process))
        try:
            await self._read(process)  # until the command closes its stdout (exits)
            return await process.wait()
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _write(self, process: asyncio.subprocess.Process) -> None:
        """Write every batch in flight not yet written to this process, in order."""
        assert process.stdin is not None
        written: set[str] = set()
        try:
            while True:
                self._more.clear()
                written &= self._unacked.keys()
                for delivery, batch in list(self._unacked.items()):
                    if delivery in written:
                        continue
                    if (
                        self.group.reader.holding(batch) is None
                    ):  # moved to another member: it delivers from the last ack
                        self._forget(delivery)
                        continue
                    process.stdin.write(payload(self.group.name, batch) + b"\n")
                    await process.stdin.drain()
                    written.add(delivery)
                    self.stats.written += 1
                    if self.ack_on_write:
                        await self._ack(delivery)
                await self._more.wait()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the command exited; _run_once restarts it

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            word, _, delivery = line.partition(" ")
            if word == "ack" and not self.ack_on_write:
                await self._ack(delivery.strip())
            else:
                sys.stderr.write(line + "\n")

    def _forget(self, delivery: str) -> Batch | None:
        batch = self._unacked.pop(delivery, None)
        if batch is not None:
            self._window.release()
        return batch

    async def _ack(self, delivery: str) -> None:
        batch = self._forget(delivery)
        if batch is None:
            self.stats.unknown_acks += 1
            log.warning("consume %s: ack of %r, which is not in flight", self.group.name, delivery)
            return
        if await batch.ack() is AckResult.ACKED:
            self.stats.acked += 1
        else:
            self.stats.refused_acks += 1

    async def _stop_process(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def serve(
    redis: Redis,
    group: str,
    command: list[str],
    *,
    prefix: str = "",
    lease: float = 3.0,
    ack_on_write: bool = False,
    window: int = 16,
    stop: asyncio.Event | None = None,
) -> PipeStats:
    """Join ``group`` and pipe to ``command`` until ``stop`` is set, then
    stop the command and leave the group (its documents move at once)."""
    async with ConsumerGroup(redis, group, prefix=prefix, lease=lease) as member:
        pipe = Pipe(member, command, ack_on_write=ack_on_write, window=window)
        await run_until(pipe.run(), stop)
    return pipe.stats
