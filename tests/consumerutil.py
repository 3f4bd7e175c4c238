"""Helpers for consumer-group tests: a worker process's part, in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from redis.asyncio import Redis

from yrelay.consumers import AckResult, Batch, ConsumerGroup

#: Short leases keep the takeover tests quick.
LEASE = 1.2


class Worker:
    """One member that records every entry it processed and acks each batch
    (unless ``acking`` is off: then it processes and forgets to ack)."""

    def __init__(self, redis: Redis, member: str, processed: Counter, group: str = "idx", **options: object):
        self.group = ConsumerGroup(redis, group, member=member, lease=LEASE, **options)  # type: ignore[arg-type]
        self.processed = processed
        self.mine: list[tuple[str, str]] = []
        self.batches: list[Batch] = []
        self.acks: list[AckResult] = []
        self.acking = True
        self._task: asyncio.Task | None = None

    async def start(self) -> "Worker":
        await self.group.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for batch in self.group.batches():
            self.batches.append(batch)
            for entry_id in batch.ids:
                self.processed[(batch.doc, entry_id)] += 1
                self.mine.append((batch.doc, entry_id))
            if self.acking:
                self.acks.append(await batch.ack())

    async def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def kill(self) -> None:
        """What a crash looks like to the group: no more beats, no leave."""
        await self._cancel()
        await self.group.stop_without_leaving()

    async def stop(self) -> None:
        await self._cancel()
        await self.group.leave()
