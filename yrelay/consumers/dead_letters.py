"""Dead letters: documents a webhook stopped sending, per group, in Redis.

A document whose delivery keeps failing (or that the receiver rejects
outright) is *parked* instead of blocking its member's retries for ever:
the group records why in one hash (``keys.group_dead_letters_key``) and
sends nothing more of it. Its position stays where it was (nothing past the
failed batch was acked), so GC keeps its entries like any group's, and a
retry (``POST /ops/groups/{group}/dead-letters/{doc}/retry``, or
:meth:`DeadLetters.retry`) removes the record: the member holding the
document notices within a second and delivers again from the last ack.

Kept in Redis, not in the webhook process: the document may move to
another member (or the process restart) and must stay parked there.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from redis.asyncio import Redis

from yrelay.storage.keys import group_dead_letters_key, validate_doc_id, validate_group_name
from yrelay.storage.replies import text


@dataclass(frozen=True)
class DeadLetter:
    """Why and where a document was parked."""

    doc: str
    #: The delivery id of the batch that failed (``X-Yrelay-Delivery``).
    delivery: str
    #: The last error: ``HTTP 400``, ``ConnectTimeout``...
    error: str
    #: Attempts of that batch, the last one included.
    attempts: int
    #: When it was parked (Unix seconds).
    at: float
    #: The member that parked it.
    member: str
    #: The HTTP status of the last answer (None: no answer).
    status: int | None = None


class DeadLetters:
    """The parked documents of one group."""

    def __init__(self, redis: Redis, group: str):
        self.redis = redis
        self.group = validate_group_name(group)
        self.key = group_dead_letters_key(self.group)

    async def park(self, letter: DeadLetter) -> None:
        await self.redis.hset(self.key, letter.doc, json.dumps(asdict(letter)))

    async def parked(self, doc: str) -> bool:
        return bool(await self.redis.hexists(self.key, doc))

    async def still_parked(self, docs: list[str]) -> set[str]:
        """Those of ``docs`` still parked (one round trip)."""
        if not docs:
            return set()
        found = await self.redis.hmget(self.key, docs)
        return {doc for doc, raw in zip(docs, found, strict=True) if raw is not None}

    async def all(self) -> list[DeadLetter]:
        raw = await self.redis.hgetall(self.key)
        return sorted((DeadLetter(**json.loads(text(value))) for value in raw.values()), key=lambda d: d.doc)

    async def retry(self, doc: str) -> bool:
        """Send ``doc`` again from its last ack; False when it was not parked."""
        return bool(await self.redis.hdel(self.key, validate_doc_id(doc)))

    async def retry_all(self) -> int:
        """Unpark every document of the group; how many there were."""
        docs = await self.redis.hkeys(self.key)
        return await self.redis.hdel(self.key, *docs) if docs else 0


def now() -> float:
    return round(time.time(), 3)
