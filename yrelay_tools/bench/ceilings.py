"""The storage path's ceiling: pipelined XADD from Python, one asyncio
client, against a redis-server configured as yrelay's (appendfsync always)."""

from __future__ import annotations

import asyncio
import tempfile
import time

from redis.asyncio import Redis

from yrelay.storage.embedded import RedisProcess
from yrelay_tools.bench.edits import writer_edits


async def _xadd(url: str, updates: int, streams: int, batch: int) -> float:
    payloads = writer_edits(7, 1000)
    redis = Redis.from_url(url)
    try:
        start = time.perf_counter()
        for offset in range(0, updates, batch):
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(offset, min(offset + batch, updates)):
                    pipe.xadd(f"ceiling:{{doc-{i % streams}}}", {"u": payloads[i % len(payloads)]})
                await pipe.execute()
        return updates / (time.perf_counter() - start)
    finally:
        await redis.aclose()


def xadd_ceiling(updates: int = 50_000, streams: int = 1000, batch: int = 1000) -> float:
    """XADDs per second into ``streams`` streams, ``batch`` per pipeline, on a
    fresh redis-server with appendonly yes and appendfsync always."""
    with tempfile.TemporaryDirectory() as data, RedisProcess(data, fsync="always") as server:
        return asyncio.run(_xadd(server.url, updates, streams, batch))
