"""A search indexer in 20 lines: every document's text, kept current, shared
among as many copies of this script as you run (docs/consumers.md)."""

import asyncio
import sys

from redis.asyncio import Redis

from yrelay.consumers import ConsumerGroup, DocumentStates

INDEX: dict[str, set[str]] = {}  # word -> documents (use your search engine here)


async def main(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    states = DocumentStates(redis)
    async with ConsumerGroup(redis, "search-indexer") as group:
        async for batch in group.batches():
            await states.apply(batch)
            for documents in INDEX.values():
                documents.discard(batch.doc)
            for word in states.text(batch.doc).split():
                INDEX.setdefault(word.lower(), set()).add(batch.doc)
            await batch.ack()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "redis://localhost:6379/0"))
