"""Appends per second: one script call per update vs the Appender's group
commit vs raw pipelined XADD (the storage ceiling), on one fresh
redis-server with appendfsync always. Prints one table; compare ratios.

    .venv/bin/python bench/append_batching.py [--updates 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from redis.asyncio import Redis

from yrelay.storage.append import Appender, needs_or_nothing
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.reads import DocumentStore

UPDATE = bytes(40)  # a small Yjs-update-sized payload (not an update: it needs nothing)


async def unbatched(store: DocumentStore, n: int) -> float:
    appender = Appender(store)
    appender.start()
    start = time.perf_counter()
    for clock in range(n):  # each awaited: a batch of one
        await appender.submit("doc-seq", "s", clock, UPDATE, needs_or_nothing(UPDATE))
    rate = n / (time.perf_counter() - start)
    await appender.stop()
    return rate


async def grouped(store: DocumentStore, n: int, docs: int) -> float:
    appender = Appender(store)
    appender.start()
    start = time.perf_counter()
    futures = [
        appender.submit(f"doc-{clock % docs}", "s", clock, UPDATE, needs_or_nothing(UPDATE)) for clock in range(n)
    ]
    await asyncio.gather(*futures)
    rate = n / (time.perf_counter() - start)
    await appender.stop()
    return rate


async def raw_xadd(redis: Redis, n: int, batch: int = 1000) -> float:
    start = time.perf_counter()
    for offset in range(0, n, batch):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(offset, min(offset + batch, n)):
                pipe.xadd(f"raw:{{doc-{i % 100}}}", {"u": UPDATE})
            await pipe.execute()
    return n / (time.perf_counter() - start)


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as data, RedisProcess(data) as server:
        redis = Redis.from_url(server.url)
        store = DocumentStore(redis)
        await store.load_scripts()
        rows = [
            ("one script call per update, awaited", await unbatched(store, n // 4)),
            ("Appender group commit, 1 document", await grouped(store, n, 1)),
            ("Appender group commit, 100 documents", await grouped(store, n, 100)),
            ("pipelined XADD, 100 streams (ceiling)", await raw_xadd(redis, n)),
        ]
        await redis.aclose()
    ceiling = rows[-1][1]
    print(f"{'path':42} {'appends/s':>10} {'vs ceiling':>10}")
    for name, rate in rows:
        print(f"{name:42} {rate:10.0f} {rate / ceiling:10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=20000)
    asyncio.run(main(parser.parse_args().updates))
