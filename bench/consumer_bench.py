"""Consumer group benchmark on a fresh redis-server (appendfsync always).
Prints a table; not a test.

    .venv/bin/python bench/consumer_bench.py [--docs 1000 --entries 20 --lease 3.0]

1. Seeds ``--docs`` documents with ``--entries`` small entries each
   (through the real append script, so the documents are registered).
2. **Raw XREAD ceiling**: one client reads every stream from the start with
   ``XREAD COUNT 500`` over all of them (the same call a member makes, with
   none of the group's work), until every entry was read.
3. **Drain**, for a group of 1 and of 3 members, each member its own
   process: the members join and wait until the leader's assignment is
   balanced, then all start at one signal; each acks every batch as it gets
   it (no processing). Timed from the signal until the group's progress has
   reached the last entry of every document (polled every 100 ms: a
   1,000-command pipeline, kept rare so it does not slow the members).
4. **Takeover after kill -9**: 3 members idle on the drained documents;
   one (not the leader) is killed with SIGKILL; timed until every document
   it held was claimed by another member (its fence holds the new version).

``--follow RATE`` measures instead a member following live appends: one
member (its own process, ``--tree`` chooses whose ``yrelay`` it runs)
drains the seeded documents, then a writer appends ``RATE`` entries/s, each
to a random document, for ``--seconds``; printed: Redis' CPU and the
member's per 1,000 entries, and the lag from each append (its entry id's
time) to the batch that holds it, p50/p99.

Each drain uses a new group name on the same Redis, so nothing is cached
between runs; the ceiling runs on the same server in the same process run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from redis.asyncio import Redis

from yrelay.consumers import ConsumerGroup
from yrelay.consumers.membership import Membership
from yrelay.storage.append import append_one
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.keys import group_leader_key, group_leases_key, group_progress_key, stream_key
from yrelay.storage.reads import DocumentStore
from yrelay.storage.replies import text

GO_KEY = "bench:go"


async def seed(store: DocumentStore, docs: list[str], entries: int) -> dict[str, float]:
    """Append ``entries`` small entries to every document; their last scores."""
    update = b"x" * 24  # the consumers do not parse updates

    async def one(doc: str) -> None:
        for clock in range(entries):
            await append_one(store, doc, "seed", clock, update)

    for start in range(0, len(docs), 100):
        await asyncio.gather(*(one(doc) for doc in docs[start : start + 100]))
    return {doc: (await store.last_id(doc)).score() for doc in docs}


async def xread_ceiling(redis: Redis, docs: list[str], total: int) -> float:
    """Entries/s of plain XREAD over every stream, from the start."""
    cursors = {stream_key(doc): "0-0" for doc in docs}
    read, started = 0, time.perf_counter()
    while read < total:
        reply = await redis.xread(cursors, count=500)
        for key, entries in reply:
            read += len(entries)
            cursors[text(key)] = text(entries[-1][0])
    return read / (time.perf_counter() - started)


def spawn(url: str, group: str, member: str, lease: float, *extra: str, tree: str | None = None) -> subprocess.Popen:
    role = "follower" if extra else "member"
    return subprocess.Popen(
        [sys.executable, __file__, role, url, group, member, str(lease), *extra],
        env={**os.environ, "PYTHONPATH": tree or str(Path(__file__).resolve().parent.parent)},
    )


async def balanced(redis: Redis, group: str, members: int, docs: int) -> dict[str, int]:
    """Wait until ``members`` members hold ``docs`` documents, evenly."""
    membership = Membership(redis, group, "", 0)
    while True:
        counts = Counter(a.member for a in (await membership.assignment()).values())
        if len(counts) == members and sum(counts.values()) == docs and max(counts.values()) - min(counts.values()) <= 1:
            return dict(counts)
        await asyncio.sleep(0.05)


async def drained(redis: Redis, group: str, last: dict[str, float]) -> None:
    docs = list(last)
    while True:
        async with redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                pipe.zscore(group_progress_key(doc), group)
            scores = await pipe.execute()
        docs = [doc for doc, score in zip(docs, scores, strict=True) if score is None or score < last[doc]]
        if not docs:
            return
        await asyncio.sleep(0.1)


async def drain(
    redis: Redis, url: str, group: str, members: int, last: dict[str, float], lease: float, keep: bool = False
) -> tuple[float, list[subprocess.Popen]]:
    await redis.delete(GO_KEY)
    processes = [spawn(url, group, f"{group}-m{i}", lease) for i in range(members)]
    await balanced(redis, group, members, len(last))
    started = time.perf_counter()
    await redis.set(GO_KEY, 1)
    await drained(redis, group, last)
    seconds = time.perf_counter() - started
    if not keep:
        stop(processes)
    return seconds, processes


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


async def takeover(redis: Redis, group: str, processes: list[subprocess.Popen]) -> tuple[float, int]:
    """kill -9 a member that does not lead; seconds until its documents are claimed by others."""
    leader = text(await redis.get(group_leader_key(group)))
    membership = Membership(redis, group, "", 0)
    victim_index = next(i for i in range(len(processes)) if f"{group}-m{i}" != leader)
    victim = f"{group}-m{victim_index}"
    held = [doc for doc, a in (await membership.assignment()).items() if a.member == victim]
    processes[victim_index].kill()
    killed = time.perf_counter()
    while True:
        assigned = await membership.assignment()
        async with redis.pipeline(transaction=False) as pipe:
            for doc in held:
                pipe.hget(group_leases_key(doc), group)
            fences = await pipe.execute()
        if all(
            assigned[doc].member != victim and fence is not None and int(fence) == assigned[doc].version
            for doc, fence in zip(held, fences, strict=True)
        ):
            return time.perf_counter() - killed, len(held)
        await asyncio.sleep(0.01)


async def member(url: str, group: str, name: str, lease: float) -> None:
    """One member process: join, wait for the signal, ack every batch."""
    redis = Redis.from_url(url)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    async with ConsumerGroup(redis, group, member=name, lease=lease) as consumer:
        while not await redis.exists(GO_KEY):
            await asyncio.sleep(0.01)

        async def consume() -> None:
            async for batch in consumer.batches():
                await batch.ack()

        task = asyncio.create_task(consume())
        await stopping.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def follower(url: str, group: str, name: str, lease: float, out: str) -> None:
    """A member that records, for each entry, how long after its append
    (the entry id's time) its batch arrived; writes them and its CPU to ``out``."""
    redis = Redis.from_url(url)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    lags: list[float] = []
    async with ConsumerGroup(redis, group, member=name, lease=lease) as consumer:

        async def consume() -> None:
            async for batch in consumer.batches():
                now = time.time() * 1000
                lags.extend(now - int(entry_id.split("-")[0]) for entry_id in map(str, batch.ids))
                await batch.ack()

        task = asyncio.create_task(consume())
        while not await redis.exists(GO_KEY) and not stopping.is_set():
            await asyncio.sleep(0.01)
        lags.clear()
        cpu = time.process_time()
        await stopping.wait()
        cpu = time.process_time() - cpu
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    Path(out).write_text(json.dumps({"cpu": cpu, "lags": lags}))  # noqa: ASYNC240 - after the measurement


async def redis_cpu(redis: Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def follow(
    redis: Redis,
    store: DocumentStore,
    url: str,
    docs: list[str],
    last: dict[str, float],
    rate: int,
    seconds: float,
    lease: float,
    tree: str | None,
) -> None:
    """One member drains, then follows ``rate`` appends/s to random documents."""
    import random

    await redis.delete(GO_KEY)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "follower.json")
        process = spawn(url, "follow", "follow-m0", lease, out, tree=tree)
        await balanced(redis, "follow", 1, len(docs))
        await drained(redis, "follow", last)
        await redis.set(GO_KEY, 1)
        await asyncio.sleep(0.5)
        update, sent, clock = b"y" * 24, 0, 1_000
        cpu, started = await redis_cpu(redis), time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                await asyncio.gather(
                    *(append_one(store, random.choice(docs), "follow", clock + i, update) for i in range(due))
                )
                clock, sent = clock + due, sent + due
            await asyncio.sleep(0.005)
        await asyncio.sleep(1.0)
        cpu = await redis_cpu(redis) - cpu
        stop([process])
        result = json.loads(Path(out).read_text())  # noqa: ASYNC240 - after the measurement
    lags = sorted(result["lags"])
    pick = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("nan")  # noqa: E731
    print(
        f"follow {len(docs)} documents at {rate}/s for {seconds:.0f} s ({tree or 'this tree'}): "
        f"{sent} appended, {len(lags)} handed out; Redis CPU {cpu / sent * 1000:.3f} s per 1k entries "
        f"(appends included), member CPU {result['cpu'] / sent * 1000:.3f} s per 1k; "
        f"lag p50 {pick(0.5):.1f} ms, p99 {pick(0.99):.1f} ms"
    )


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


@asynccontextmanager
async def seeded(
    docs_count: int, entries: int
) -> AsyncIterator[tuple[RedisProcess, Redis, DocumentStore, list[str], dict[str, float]]]:
    """A fresh redis-server holding ``docs_count`` documents of ``entries`` entries (:func:`seed`)."""
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp)) as server:
        redis = Redis.from_url(server.url)
        store = DocumentStore(redis)
        await store.load_scripts()
        docs = [f"doc-{i:05d}" for i in range(docs_count)]
        last = await seed(store, docs, entries)
        yield server, redis, store, docs, last
        await redis.aclose()


async def main(
    docs_count: int, entries: int, lease: float, rate: int = 0, seconds: float = 20.0, trees: list[str] | None = None
) -> None:
    print(f"load average before: {load()} (2 cores; other engineers' test runs share the machine)")
    if rate:
        for tree in trees or [None]:  # type: ignore[list-item]
            async with seeded(docs_count, entries) as (server, redis, store, docs, last):
                await follow(redis, store, server.url, docs, last, rate, seconds, lease, tree)
        print(f"load average after: {load()}")
        return
    async with seeded(docs_count, entries) as (server, redis, store, docs, last):
        total = docs_count * entries
        print(f"seeded {docs_count} documents x {entries} entries = {total:,} entries")
        ceiling = await xread_ceiling(redis, docs, total)
        rows = [("raw XREAD, 1 client (ceiling)", ceiling, None)]
        for members in (1, 3):
            seconds, _ = await drain(redis, server.url, f"bench{members}", members, last, lease)
            rows.append(
                (f"group of {members}, {members} process{'es' if members > 1 else ''}", total / seconds, seconds)
            )
        print("\n| reader | entries/s | seconds | vs ceiling |\n| --- | ---: | ---: | ---: |")
        for name, rate, seconds in rows:
            shown = "-" if seconds is None else f"{seconds:.2f}"
            print(f"| {name} | {rate:,.0f} | {shown} | {rate / ceiling:.2f} |")
        _, processes = await drain(redis, server.url, "benchkill", 3, last, lease, keep=True)
        try:
            seconds, held = await takeover(redis, "benchkill", processes)
        finally:
            stop(processes)
        print(f"\ntakeover after kill -9: {seconds:.2f} s for {held} documents (lease {lease} s)")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "member":
        asyncio.run(member(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])))
    elif len(sys.argv) > 1 and sys.argv[1] == "follower":
        asyncio.run(follower(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--docs", type=int, default=1000)
        parser.add_argument("--entries", type=int, default=20)
        parser.add_argument("--lease", type=float, default=3.0)
        parser.add_argument(
            "--follow",
            type=int,
            default=0,
            metavar="RATE",
            help="measure a member following RATE appends/s instead (see the module doc)",
        )
        parser.add_argument("--seconds", type=float, default=20.0)
        parser.add_argument(
            "--tree",
            action="append",
            help="run the member with this checkout's yrelay (repeat: one run each, in order)",
        )
        args = parser.parse_args()
        asyncio.run(main(args.docs, args.entries, args.lease, args.follow, args.seconds, args.tree))
