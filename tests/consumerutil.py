"""Helpers for consumer-group tests: a worker process's part, in-process."""

from __future__ import annotations

import asyncio
from collections import Counter

from redis.asyncio import Redis

from yrelay.consumers import AckResult, Batch, ConsumerGroup

#: Short leases keep the takeover tests quick.
LEASE = 1.2


class Worker:
    """One member that records every entry it processed and acks each batch
    (unless ``acking`` is off: then it processes and forgets to ack; with
    ``ack_delay``, each ack is sent that much later while it goes on
    processing, so batches of every document are in flight)."""

    def __init__(
        self,
        redis: Redis,
        member: str,
        processed: Counter,
        group: str = "idx",
        ack_delay: float = 0.0,
        **options: object,
    ):
        self.ack_delay = ack_delay
        self.group = ConsumerGroup(redis, group, member=member, lease=LEASE, **options)  # type: ignore[arg-type]
        self.processed = processed
        self.mine: list[tuple[str, str]] = []
        self.batches: list[Batch] = []
        self.acks: list[AckResult] = []
        self.acking = True
        self._task: asyncio.Task | None = None
        self._acking: set[asyncio.Task] = set()

    async def start(self) -> Worker:
        await self.group.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for batch in self.group.batches():
            self.batches.append(batch)
            for entry_id in batch.ids:
                self.processed[(batch.doc, entry_id)] += 1
                self.mine.append((batch.doc, entry_id))
            if self.acking and self.ack_delay:  # acked later, while the next batches are processed
                self._acking.add(task := asyncio.create_task(self._ack_later(batch)))
                task.add_done_callback(self._acking.discard)
            elif self.acking:
                self.acks.append(await batch.ack())

    async def _ack_later(self, batch: Batch) -> None:
        await asyncio.sleep(self.ack_delay)
        self.acks.append(await batch.ack())

    async def _cancel(self) -> None:
        for task in list(self._acking):
            task.cancel()
        while self._task is not None and not self._task.done():
            self._task.cancel()  # again: redis-py can swallow a cancel that lands while it connects
            await asyncio.wait({self._task}, timeout=1.0)

    async def kill(self) -> None:
        """What a crash looks like to the group: no more beats, no leave."""
        await self._cancel()
        await self.group.stop_without_leaving()

    async def stop(self) -> None:
        await self._cancel()
        await self.group.leave()
