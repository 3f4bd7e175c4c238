"""Webhooks: a consumer-group member that POSTs each batch to a URL.

Each document's batches are delivered in stream order, one at a time, and
acked only after the receiver answered 2xx: at least once, never skipping.
A failing delivery is retried with backoff (network errors, timeouts, 5xx,
408 and 429 honouring ``Retry-After``); that document waits, the others go
on: one task per document with a batch in flight, at most ``concurrency``
requests at once. The receiver is not trusted: each request, its answer's
body included, has one total deadline (``timeout``: a receiver trickling
its answer cannot stretch it) and the body is read up to
``max_response_bytes`` and thrown away (a declared or streamed body over it
ends the attempt), so a hostile receiver costs no memory and holds a
concurrency slot no longer than the deadline. After ``max_attempts``
failed attempts of one batch (an unreachable receiver does not count: that
is no document's fault), or at once when the receiver rejects it with
another 4xx, the document is parked as a dead letter
(:mod:`yrelay.consumers.dead_letters`) until an operator retries it.
docs/consumers.md, "Webhooks" and "Dead letters".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote

from redis.asyncio import Redis

from yrelay.backoff import Backoff, Reconnect
from yrelay.consumers.batch import Batch
from yrelay.consumers.dead_letters import DeadLetter, DeadLetters, now
from yrelay.consumers.group import ConsumerGroup
from yrelay.consumers.progress import AckResult
from yrelay.consumers.signature import DELIVERY_HEADER, HEADER, sign, verify_signature
from yrelay.consumers.state import DocumentStates
from yrelay.consumers.webhook_stats import StatsFlusher, WebhookStats
from yrelay.tasks import BackgroundTask, lost_redis, run_until, spawn

if TYPE_CHECKING:  # httpx is the webhooks extra: imported when a Webhook is made, so a lean install imports this module
    import httpx

log = logging.getLogger(__name__)
T = TypeVar("T")

#: 0.5 s doubling to 30 s, jittered: many members cut off from one receiver do not come back together.
WEBHOOK_BACKOFF = Backoff(base=0.5, factor=2.0, max_delay=30.0, jitter=0.5)
#: Longest ``Retry-After`` honoured, in seconds (a receiver asking for hours is probably wrong).
MAX_RETRY_AFTER = 600.0
#: Answers retried as "try again later" rather than counted as rejections.
_TRANSIENT = {408, 429}
#: Failed attempts of one batch before its document is parked (about a
#: minute of retries with the default backoff: 0.5 + 1 + 2 + ... + 30 s).
MAX_ATTEMPTS = 8
#: Seconds between two flushes of the counters and two looks for retried dead letters.
WATCH_INTERVAL = 1.0
#: Seconds one request may take in all, from sending it to the last byte of
#: its answer (connecting included).
TIMEOUT = 10.0
#: Most bytes of an answer's body read (and thrown away: only the status and
#: ``Retry-After`` are used); a body declared or streamed past it fails the attempt.
MAX_RESPONSE_BYTES = 64 * 1024


class Outcome(Enum):
    DELIVERED = "delivered"
    #: The document is no longer this member's (or was evicted): the taker delivers from the last ack.
    DROPPED = "dropped"
    PARKED = "parked"


@dataclass(frozen=True)
class Failure:
    """One attempt that did not end in a 2xx."""

    error: str
    status: int | None
    #: Seconds to wait before the next attempt (0: the backoff's delay).
    wait: float = 0.0
    #: Counts towards ``max_attempts`` (not when the receiver could not be reached).
    counts: bool = True
    #: A 4xx other than 408/429: parks the document at once.
    permanent: bool = False


def delivery_id(batch: Batch) -> str:
    """``<doc, percent-encoded>:<first entry id>:<last entry id>``: the same for
    every attempt of one batch, so a receiver drops a repeat it stored."""
    ids = batch.ids if batch.ids and not batch.deleted else [*batch.ids[:1], str(batch.offset)]
    return f"{quote(batch.doc, safe='')}:{ids[0]}:{ids[-1]}"


def payload(group: str, batch: Batch, extra: Mapping[str, object] | None = None) -> bytes:
    """The JSON body (compact, UTF-8): what is signed and sent. ``extra``:
    fields added on request (``text``)."""
    body: dict[str, object] = {
        "group": group,
        "delivery": delivery_id(batch),
        "doc": batch.doc,
        "ids": batch.ids,
        "updates": [base64.b64encode(update).decode() for update in batch.updates],
        "offset": str(batch.offset),
        "restart": batch.restart,
        "snapshot": base64.b64encode(batch.snapshot).decode() if batch.snapshot is not None else None,
        "deleted": batch.deleted,
        **(extra or {}),
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

    def __init__(
        self,
        group: ConsumerGroup,
        url: str,
        secret: str | bytes,
        *,
        client: httpx.AsyncClient | None = None,
        concurrency: int = 16,
        backoff: Backoff = WEBHOOK_BACKOFF,
        timeout: float = TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_queued: int = 10_000,
        max_attempts: int | None = MAX_ATTEMPTS,
        text: str | None = None,
    ):
        """``timeout``: the total deadline of one request, answer included
        (past it the attempt fails and frees its slot). ``max_response_bytes``:
        the most of an answer's body read; more fails the attempt.
        ``max_queued``: batches read and not yet delivered, over all
        documents; past it the member stops reading until some are delivered
        (memory stays bounded however long a receiver is down).
        ``max_attempts``: None never parks a document (every failure, a 4xx
        included, is retried for as long as it takes).
        ``text``: the name of a shared text (``text`` in the demo editor):
        each body then carries ``"text"``, that text with the batch applied
        (``null`` on a deletion). It costs a copy of every held document in
        this process, kept with :class:`DocumentStates`."""
        import httpx

        self._errors = httpx.HTTPError
        self._unreachable = (httpx.ConnectError, httpx.ConnectTimeout)
        self.max_attempts = max_attempts
        self.group = group
        self.url = url
        self.secret = secret
        self.client = client or httpx.AsyncClient(timeout=timeout)
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._own_client = client is None
        self.backoff = backoff
        self.stats = WebhookStats()
        self.dead = DeadLetters(group.redis, group.name)
        self._flusher = StatsFlusher(group.redis, group.name, self.stats)
        #: Held documents parked (not read, not sent) until their dead letter is retried.
        self._parked: set[str] = set()
        #: doc -> the assignment version under which we saw it was not parked.
        self._checked: dict[str, int] = {}
        self._sending = asyncio.Semaphore(concurrency)
        self._room = asyncio.Semaphore(max_queued)
        self._queues: dict[str, deque[Batch]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.states = DocumentStates(group.redis, text) if text is not None else None

    async def run(self) -> None:
        """Read and deliver until cancelled. Batches not acked when it stops
        are delivered again by the member that takes their documents over."""
        watch = BackgroundTask(f"yrelay-webhook-{self.group.name}", self._watch, kind="yrelay-webhook-watch")
        watch.start()
        try:
            async for batch in self.group.batches():
                if batch.doc in self._parked:
                    self.stats.dropped += 1
                    continue
                await self._room.acquire()
                self._queues.setdefault(batch.doc, deque()).append(batch)
                if batch.doc not in self._tasks:
                    self._tasks[batch.doc] = spawn(self._drain(batch.doc), name=f"yrelay-webhook-{self.group.name}")
        finally:
            for task in list(self._tasks.values()):
                task.cancel()
            await watch.stop()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            try:
                await self._flusher.flush()
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.warning("webhook %s: last counters lost (%s)", self.group.name, exc)
            if self._own_client:
                await self.client.aclose()

    async def _drain(self, doc: str) -> None:
        """Deliver ``doc``'s batches in order; ends when its queue is empty."""
        queue = self._queues[doc]
        try:
            while queue:
                if await self._deliver(queue[0]) is Outcome.DELIVERED:
                    queue.popleft()
                    self._room.release()
                else:  # parked, or no longer ours: what was read after it is not sent either
                    for _ in range(len(queue)):
                        self._room.release()
                    queue.clear()
        finally:
            self._tasks.pop(doc, None)
            if not queue:
                self._queues.pop(doc, None)

    async def _deliver(self, batch: Batch) -> Outcome:
        """POST ``batch`` until a 2xx, then ack it; park its document when
        it keeps failing."""
        if await self._parked_before(batch):
            return Outcome.PARKED
        body = payload(self.group.name, batch, await self._extra(batch))
        delivery = delivery_id(batch)
        attempts = Reconnect(self.backoff)
        sent = counted = 0
        while True:
            if self.group.reader.holding(batch) is None:
                self.stats.dropped += 1
                return Outcome.DROPPED
            self.stats.retries += int(sent > 0)
            sent += 1
            failure = await self._attempt(delivery, body)
            if failure is None:
                break
            self._failed(delivery, attempts.attempt, failure)
            counted += failure.counts
            if self.max_attempts is not None and (failure.permanent or counted >= self.max_attempts):
                await self._park(batch, delivery, failure, sent)
                return Outcome.PARKED
            if failure.wait > 0:
                attempts.attempt += 1
                await asyncio.sleep(failure.wait)
            else:
                await attempts.wait()
        # Ack, retrying while Redis fails: the receiver has the batch, and
        # giving up would leave the document waiting with nothing to wake it.
        result = await self._redis_retried(batch.ack, "ack", batch)
        if result is not AckResult.ACKED:
            self.stats.refused_acks += 1
            return Outcome.DROPPED
        self.stats.delivered += 1
        return Outcome.DELIVERED

    async def _extra(self, batch: Batch) -> dict[str, object] | None:
        """The fields asked for on top of the batch: the document's text,
        computed once per batch (every attempt sends the same body)."""
        if self.states is None:
            return None
        await self._redis_retried(partial(self.states.apply, batch), "loading the document", batch)
        return {"text": None if batch.deleted else self.states.text(batch.doc)}

    # --------------------------------------------------------- dead letters

    async def _parked_before(self, batch: Batch) -> bool:
        """Whether ``batch``'s document was parked (by any member, before it
        came to us): looked up once per document and assignment version."""
        if self._checked.get(batch.doc) == batch.version:
            return False
        if await self._redis_retried(lambda: self.dead.parked(batch.doc), "dead-letter lookup", batch):
            self._hold_parked(batch.doc)
            return True
        self._checked[batch.doc] = batch.version
        return False

    async def _park(self, batch: Batch, delivery: str, failure: Failure, attempts: int) -> None:
        letter = DeadLetter(batch.doc, delivery, failure.error, attempts, now(), self.group.member, failure.status)
        await self._redis_retried(lambda: self.dead.park(letter), "parking", batch)
        self.stats.dead_letters += 1
        self._hold_parked(batch.doc)
        log.error(
            "webhook %s: parked %s after %d attempts (last: %s); nothing from delivery %s on is sent "
            "until it is retried (POST /ops/groups/%s/dead-letters/<doc>/retry)",
            self.group.name,
            batch.doc,
            attempts,
            failure.error,
            delivery,
            self.group.name,
        )

    def _hold_parked(self, doc: str) -> None:
        self._parked.add(doc)
        self.group.reader.pause(doc)

    async def _watch(self) -> None:
        """Every second: add the counters to Redis; resume the documents
        whose dead letter was retried (removed) meanwhile."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            try:
                await self._flusher.flush()
                held = self.group.reader.held
                self._parked &= held.keys()
                self._checked = {doc: v for doc, v in self._checked.items() if doc in held}
                if self.states is not None:
                    self.states.keep_only(held.keys())
                asked = sorted(self._parked)  # not one parked while we ask: it would look retried
                retried = set(asked) - await self.dead.still_parked(asked)
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.warning("webhook %s: counters or dead letters not read (%s)", self.group.name, exc)
                continue
            for doc in retried:
                log.info("webhook %s: %s was retried; delivering from its last ack", self.group.name, doc)
                self._parked.discard(doc)
                self._checked.pop(doc, None)
                self.group.reader.resume(doc)

    async def _redis_retried(self, call: Callable[[], Awaitable[T]], what: str, batch: Batch) -> T:
        """``call()`` until Redis answers (0.1 s doubling to 5 s)."""
        reconnect = Reconnect()
        while True:
            try:
                return await call()
            except Exception as exc:
                if not lost_redis(exc):
                    raise
                log.warning(
                    "webhook %s: %s of %s failed (%s); again in %.1fs",
                    self.group.name,
                    what,
                    delivery_id(batch),
                    exc,
                    reconnect.delay,
                )
                await reconnect.wait()

    async def _attempt(self, delivery: str, body: bytes) -> Failure | None:
        """One POST: None on 2xx, else what went wrong."""
        headers = {"Content-Type": "application/json", HEADER: sign(self.secret, body), DELIVERY_HEADER: delivery}
        connected = False

        async def trace(event: str, _info: object) -> None:  # httpcore's: the request goes out on a connection
            nonlocal connected
            connected = connected or event.endswith("send_request_headers.started")

        try:
            async with self._sending:  # the deadline frees the slot: one receiver cannot hold them all
                started = time.monotonic()
                async with asyncio.timeout(self.timeout):
                    response, too_large = await self._post(body, headers, trace)
                self.stats.observe(time.monotonic() - started)
        except TimeoutError:
            # The whole request took too long. Before it went out on a connection,
            # that is a connect timeout: the receiver could not be reached.
            return Failure("TotalTimeout" if connected else "ConnectTimeout", None, counts=connected)
        except self._errors as exc:
            return Failure(type(exc).__name__, None, counts=not isinstance(exc, self._unreachable))
        status = response.status_code
        if too_large:
            return Failure("ResponseTooLarge", status)
        if response.is_success:
            return None
        if 400 <= status < 500 and status not in _TRANSIENT:
            return Failure(f"HTTP {status}", status, permanent=True)
        return Failure(f"HTTP {status}", status, retry_after(response) or 0)

    async def _post(
        self, body: bytes, headers: dict[str, str], trace: Callable[[str, object], Awaitable[None]]
    ) -> tuple[httpx.Response, bool]:
        """POST and read the answer's body up to ``max_response_bytes``,
        keeping none of it. The response, and whether its body was declared
        or streamed past the limit (the connection is then closed, not read to its end)."""
        async with self.client.stream(
            "POST", self.url, content=body, headers=headers, extensions={"trace": trace}
        ) as response:
            with contextlib.suppress(ValueError):  # h11 refuses a malformed or conflicting length first: a guard only
                if int(response.headers.get("content-length", 0)) > self.max_response_bytes:
                    return response, True
            read = 0
            async for chunk in response.aiter_raw():  # raw: a compressed body is not inflated either
                read += len(chunk)
                if read > self.max_response_bytes:
                    return response, True
        return response, False

    def _failed(self, delivery: str, attempt: int, failure: Failure) -> None:
        """Count and log a failed attempt (``attempt``: 0 for the first)."""
        if failure.permanent:
            self.stats.rejected += 1
            log.error(
                "webhook %s: %s rejected delivery %s with %d (attempt %d)",
                self.group.name,
                self.url,
                delivery,
                failure.status,
                attempt + 1,
            )
        else:
            self.stats.failed += 1
            log.warning(
                "webhook %s: delivery %s failed (%s), attempt %d", self.group.name, delivery, failure.error, attempt + 1
            )


async def serve(
    redis: Redis,
    group: str,
    url: str,
    secret: str | bytes,
    *,
    prefix: str = "",
    lease: float = 3.0,
    concurrency: int = 16,
    max_attempts: int | None = MAX_ATTEMPTS,
    text: str | None = None,
    stop: asyncio.Event | None = None,
) -> WebhookStats:
    """Join ``group`` and deliver to ``url`` until ``stop`` is set (or the
    task is cancelled), then leave the group: its documents move to the
    other members at once, from their last ack."""
    async with ConsumerGroup(redis, group, prefix=prefix, lease=lease) as member:
        webhook = Webhook(member, url, secret, concurrency=concurrency, max_attempts=max_attempts, text=text)
        await run_until(webhook.run(), stop)
    return webhook.stats


__all__ = [
    "MAX_ATTEMPTS",
    "MAX_RESPONSE_BYTES",
    "TIMEOUT",
    "WEBHOOK_BACKOFF",
    "Webhook",
    "WebhookStats",
    "delivery_id",
    "payload",
    "serve",
    "verify_signature",
]
