"""A search indexer in 20 lines: every document's text, kept current, shared
among as many copies of this script as you run (docs/consumers.md).

Run it beside ``make serve`` (it finds that server's Redis), or give a Redis::

    python docs/examples/search_indexer.py [redis://host:6379/0]
"""

import asyncio
import os
import sys

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisUnreachable

from yrelay.consumers import ConsumerGroup, DocumentStates
from yrelay.storage.embedded import serve_redis_url

INDEX: dict[str, set[str]] = {}  # word -> documents (use your search engine here)


async def main(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    states = DocumentStates(redis)
    async with ConsumerGroup(redis, "search-indexer") as group:
        print("search-indexer: indexing every document's words as it changes (Ctrl-C to stop)", flush=True)
        async for batch in group.batches():
            await states.apply(batch)
            for documents in INDEX.values():
                documents.discard(batch.doc)
            words = {word.lower() for word in states.text(batch.doc).split()}
            for word in words:
                INDEX.setdefault(word, set()).add(batch.doc)
            await batch.ack()
            print(f"indexed {batch.doc}: {len(words)} words; {len(INDEX)} words in the index", flush=True)


if __name__ == "__main__":
    url = (sys.argv[1] if len(sys.argv) > 1 else None) or os.environ.get("YRELAY_REDIS_URL") or serve_redis_url()
    if url is None:
        sys.exit("search-indexer: no Redis: start `make serve` in this checkout, or pass a Redis URL")
    try:
        asyncio.run(main(url))
    except RedisUnreachable as exc:
        sys.exit(f"search-indexer: Redis did not answer ({exc})")
    except KeyboardInterrupt:
        pass  # Ctrl-C: the group keeps what was acked; the next run resumes there
