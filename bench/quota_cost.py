"""What the per-subject update limit (yrelay/app/quotas.py) costs the update
path: microseconds per take and Redis calls per update, against the
per-process TokenBucket it sits beside and against one Redis round trip per
update (what a naive shared bucket would cost). Then a served run: a writer
sends updates as fast as it can, with the subject limit on and off, and the
figure is updates acked per second.

Needs a redis-server binary (an embedded one is started).

    .venv/bin/python bench/quota_cost.py [--takes 100000] [--updates 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
from pathlib import Path

import uvicorn
import websockets
from redis.asyncio import Redis

from yrelay.app import create_app
from yrelay.app.quotas import SubjectQuotas
from yrelay.config import Settings
from yrelay.storage.embedded import RedisProcess, free_port
from yrelay.storage.keys import subject_bucket_key
from yrelay.storage.scripts import Scripts
from yrelay.transport.buckets import TokenBucket
from yrelay.yjs import crdt


async def take_costs(url: str, takes: int) -> None:
    redis = Redis.from_url(url)
    huge = Settings(subject_updates_per_second=1e9, subject_update_burst=10**9)  # never refused: the cost alone
    quotas = SubjectQuotas(redis, Scripts(redis), huge)
    bucket = quotas.acquire("bench").updates
    local = TokenBucket(1e9, 1e9)

    started = time.perf_counter()
    for _ in range(takes):
        local.take()
    local_us = (time.perf_counter() - started) / takes * 1e6

    await bucket.take()  # the first chunk
    quotas.bucket_calls = 0
    started = time.perf_counter()
    for _ in range(takes):
        await bucket.take()
    shared_us = (time.perf_counter() - started) / takes * 1e6
    calls = quotas.bucket_calls

    paced = await paced_calls(redis)
    scripts = Scripts(redis)
    rounds = max(takes // 20, 1000)
    started = time.perf_counter()
    for _ in range(rounds):
        await scripts.quota_take(keys=[subject_bucket_key("naive", "updates")], args=[1e9, 10**9, 1])
    naive_us = (time.perf_counter() - started) / rounds * 1e6
    await redis.aclose()
    print(f"takes: {takes}  chunk: {bucket.chunk} tokens")
    print(f"  per-process TokenBucket.take      {local_us:7.2f} us")
    print(
        f"  shared bucket, local allowance    {shared_us:7.2f} us   ({calls} Redis calls, {calls / takes:.5f} per take)"
    )
    print(f"  one quota_take script per update  {naive_us:7.2f} us   (1 Redis call per take)")
    print(
        f"default limit (500/s, burst 2000), one writer pacing itself at <= 400/s for 2 s "
        f"(got {paced[0] / 2:.0f}/s): {paced[0]} takes, "
        f"{paced[1]} Redis calls ({paced[1] / paced[0]:.3f} per update), {paced[2]} refused"
    )


async def paced_calls(redis: Redis) -> tuple[int, int, int]:
    """Redis calls per update at a steady pace under the default limit."""
    quotas = SubjectQuotas(redis, Scripts(redis), Settings())
    bucket = quotas.acquire("paced").updates
    takes, refused = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < 2.0:
        refused += await bucket.take() is not None
        takes += 1
        await asyncio.sleep(1 / 400)
    return takes, quotas.bucket_calls, refused


def updates(count: int) -> list[str]:
    doc = crdt.new_doc(1)
    out: list[bytes] = []
    crdt.observe_updates(doc, out.append)
    for index in range(count):
        crdt.insert_text(doc, index, "x")
    return [base64.b64encode(update).decode() for update in out]


async def served_rate(url: str, count: int, subject_rate: float) -> float:
    """Updates acked per second for one writer, the subject limit at ``subject_rate`` (0: off)."""
    settings = Settings.from_env(
        insecure_no_auth=True,
        updates_per_second=0,
        subject_updates_per_second=subject_rate,
        subject_update_burst=10**9,
        admission_rate=0,
        gc_interval=0,
        event_log=False,
        data_dir=Path(tempfile.mkdtemp()),
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, url), host="127.0.0.1", port=port, log_level="warning", **settings.uvicorn_options()
        )
    )  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    doc = f"bench-{port}"
    frames = [
        json.dumps({"op": "update", "doc": doc, "clock": clock, "update": update})
        for clock, update in enumerate(updates(count), 1)
    ]
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
        await ws.send(json.dumps({"op": "hello"}))
        await ws.recv()
        await ws.send(json.dumps({"op": "subscribe", "doc": doc}))
        started = time.perf_counter()
        for frame in frames:
            await ws.send(frame)
        acked = 0
        while acked < count:
            answer = json.loads(await ws.recv())
            if answer["op"] == "appended":
                acked += 1
            elif answer["op"] == "error":
                raise RuntimeError(answer)
        elapsed = time.perf_counter() - started
    server.should_exit = True
    await task
    return count / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--takes", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with RedisProcess(Path(tempfile.mkdtemp())) as redis:
        await take_costs(redis.url, args.takes)
        print(f"served: one writer, {args.updates} updates, best of {args.rounds}")
        rates: dict[str, list[float]] = {"subject limit off": [], "subject limit on ": []}
        for _ in range(args.rounds):  # alternated: the machine's load drifts
            for label, rate in zip(rates, (0, 1e9), strict=True):
                rates[label].append(await served_rate(redis.url, args.updates, rate))
        for label, runs in rates.items():
            print(f"  {label}  best {max(runs):6.0f} updates/s   runs: {', '.join(f'{r:.0f}' for r in runs)}")


if __name__ == "__main__":
    asyncio.run(main())
