"""Webhooks: a consumer-group member that POSTs each batch to a URL.

Each document's batches are delivered in stream order, one at a time, and
acked only after the receiver answered 2xx: at least once, never skipping.
A failing delivery is retried with backoff for as long as it takes (network
errors, 5xx, 408 and 429 honouring ``Retry-After``; other 4xx are logged and
counted and retried too, so that no entry is lost); that document waits,
the others go on: one task per document with a batch in flight, at most
``concurrency`` requests at once. docs/consumers.md, "Webhooks".
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

import redis.exceptions
from redis.asyncio import Redis

from ..backoff import Backoff, Reconnect
from .batch import Batch
from .group import ConsumerGroup
from .progress import AckResult
from .signature import DELIVERY_HEADER, HEADER, sign, verify_signature

if TYPE_CHECKING:  # httpx is the webhooks extra: imported when a Webhook is made, so a lean install imports this module
    import httpx

log = logging.getLogger(__name__)

#: 0.5 s doubling to 30 s, jittered: many members cut off from one receiver do not come back together.
WEBHOOK_BACKOFF = Backoff(base=0.5, factor=2.0, max_delay=30.0, jitter=0.5)
#: Longest ``Retry-After`` honoured, in seconds (a receiver asking for hours is probably wrong).
MAX_RETRY_AFTER = 600.0
#: Answers retried as "try again later" rather than counted as rejections.
_TRANSIENT = {408, 429}


@dataclass
class WebhookStats:
    delivered: int = 0       # batches answered 2xx and acked
    failed: int = 0          # attempts lost to the network, a timeout, 5xx, 408 or 429
    rejected: int = 0        # attempts answered with another 4xx (retried all the same)
    dropped: int = 0         # batches not sent: the document moved to another member first
    refused_acks: int = 0    # 2xx answered, the ack refused (STALE or EVICTED): redelivered elsewhere


def delivery_id(batch: Batch) -> str:
    """``<doc, percent-encoded>:<first entry id>:<last entry id>``: the same for
    every attempt of one batch, so a receiver drops a repeat it stored."""
    ids = batch.ids or [str(batch.offset)]
    return f"{quote(batch.doc, safe='')}:{ids[0]}:{ids[-1]}"


def payload(group: str, batch: Batch) -> bytes:
    """The JSON body (compact, UTF-8): what is signed and sent."""
    body = {
        "group": group,
        "delivery": delivery_id(batch),
        "doc": batch.doc,
        "ids": batch.ids,
        "updates": [base64.b64encode(update).decode() for update in batch.updates],
        "offset": str(batch.offset),
        "restart": batch.restart,
        "snapshot": base64.b64encode(batch.snapshot).decode() if batch.snapshot is not None else None,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (delta or HTTP date), capped; None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


class Webhook:
    """Deliver what ``group`` (started by the caller) reads to ``url``."""

    def __init__(self, group: ConsumerGroup, url: str, secret: str | bytes, *, client: httpx.AsyncClient | None = None,
                 concurrency: int = 16, backoff: Backoff = WEBHOOK_BACKOFF, timeout: float = 10.0,
                 max_queued: int = 10_000):
        """``max_queued``: batches read and not yet delivered, over all
        documents; past it the member stops reading until some are delivered
        (memory stays bounded however long a receiver is down)."""
        import httpx

        self._errors = httpx.HTTPError
        self.group = group
        self.url = url
        self.secret = secret
        self.client = client or httpx.AsyncClient(timeout=timeout)
        self._own_client = client is None
        self.backoff = backoff
        self.stats = WebhookStats()
        self._sending = asyncio.Semaphore(concurrency)
        self._room = asyncio.Semaphore(max_queued)
        self._queues: dict[str, deque[Batch]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Read and deliver until cancelled. Batches not acked when it stops
        are delivered again by the member that takes their documents over."""
        try:
            async for batch in self.group.batches():
                await self._room.acquire()
                self._queues.setdefault(batch.doc, deque()).append(batch)
                if batch.doc not in self._tasks:
                    self._tasks[batch.doc] = asyncio.create_task(self._drain(batch.doc))
        finally:
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            if self._own_client:
                await self.client.aclose()

    async def _drain(self, doc: str) -> None:
        """Deliver ``doc``'s batches in order; ends when its queue is empty."""
        queue = self._queues[doc]
        try:
            while queue:
                if await self._deliver(queue[0]):
                    queue.popleft()
                    self._room.release()
                else:  # no longer ours (or evicted): what was read after it is no longer valid either
                    for _ in range(len(queue)):
                        self._room.release()
                    queue.clear()
        finally:
            self._tasks.pop(doc, None)
            if not queue:
                self._queues.pop(doc, None)

    def _holds(self, batch: Batch) -> bool:
        held = self.group.reader.held.get(batch.doc)
        return held is not None and held.version == batch.version

    async def _deliver(self, batch: Batch) -> bool:
        """POST ``batch`` until a 2xx, then ack it. False when the document
        is no longer this member's (the taker delivers from the last ack)."""
        body = payload(self.group.name, batch)
        delivery = delivery_id(batch)
        attempts = Reconnect(self.backoff)
        while True:
            if not self._holds(batch):
                self.stats.dropped += 1
                return False
            wait = await self._attempt(delivery, body, attempts.attempt)
            if wait is None:
                break
            if wait > 0:
                attempts.attempt += 1
                await asyncio.sleep(wait)
            else:
                await attempts.wait()
        result = await self._ack(batch)
        if result is not AckResult.ACKED:
            self.stats.refused_acks += 1
            return False
        self.stats.delivered += 1
        return True

    async def _ack(self, batch: Batch) -> AckResult:
        """Ack, retrying while Redis fails: the receiver has the batch, and
        giving up would leave the document waiting with nothing to wake it."""
        reconnect = Reconnect()
        while True:
            try:
                return await batch.ack()
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("webhook %s: ack of %s failed (%s); again in %.1fs", self.group.name,
                            delivery_id(batch), exc, reconnect.delay)
                await reconnect.wait()

    async def _attempt(self, delivery: str, body: bytes, attempt: int) -> float | None:
        """One POST: None on 2xx, else how long to wait (0: the backoff's delay)."""
        headers = {"Content-Type": "application/json", HEADER: sign(self.secret, body), DELIVERY_HEADER: delivery}
        try:
            async with self._sending:
                response = await self.client.post(self.url, content=body, headers=headers)
        except self._errors as exc:
            self.stats.failed += 1
            log.warning("webhook %s: delivery %s failed (%s), attempt %d", self.group.name, delivery,
                        type(exc).__name__, attempt + 1)
            return 0
        if response.is_success:
            return None
        status = response.status_code
        if 400 <= status < 500 and status not in _TRANSIENT:
            self.stats.rejected += 1
            log.error("webhook %s: %s rejected delivery %s with %d (attempt %d); retrying: the entries must "
                      "not be lost", self.group.name, self.url, delivery, status, attempt + 1)
            return 0
        self.stats.failed += 1
        log.warning("webhook %s: delivery %s answered %d, attempt %d", self.group.name, delivery, status,
                    attempt + 1)
        return retry_after(response) or 0


async def serve(redis: Redis, group: str, url: str, secret: str | bytes, *, prefix: str = "", lease: float = 3.0,
                concurrency: int = 16, stop: asyncio.Event | None = None) -> WebhookStats:
    """Join ``group`` and deliver to ``url`` until ``stop`` is set (or the
    task is cancelled), then leave the group: its documents move to the
    other members at once, from their last ack."""
    async with ConsumerGroup(redis, group, prefix=prefix, lease=lease) as member:
        webhook = Webhook(member, url, secret, concurrency=concurrency)
        task = asyncio.create_task(webhook.run())
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return webhook.stats


__all__ = ["WEBHOOK_BACKOFF", "Webhook", "WebhookStats", "delivery_id", "payload", "serve", "verify_signature"]
