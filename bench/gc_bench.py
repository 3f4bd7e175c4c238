"""GC benchmarks on fresh redis-servers (appendfsync always). Prints tables.

    # one GC pass over 10,000 documents of which 1,000 changed
    .venv/bin/python bench/gc_bench.py pass [--docs 10000 --changed 1000]

    # Redis memory under a steady edit load, GC on and GC off side by side
    .venv/bin/python bench/gc_bench.py memory [--minutes 10 --rate 200]

The pass is timed end to end as the server loop runs it (claim, evict, read,
fold in a thread, snapshot, trim, record, release). The memory run drives two
identical Redis instances with the same load through the real append script
and tracker writes (three readers per document acking what they receive, and
one reader that stalls forever on a tenth of the documents); only one of them
has the GC loop.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from redis.asyncio import Redis

from yrelay.gc import Collector, DueSet, GcPolicy, run_due_pass
from yrelay.storage.append import Appender, needs_or_nothing
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.keys import snapshot_key, stream_key, tracker_key
from yrelay.storage.listing import registry_counts
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt


def edits(count: int, client_id: int) -> list[bytes]:
    """``count`` small text edits (about 25 bytes each) from one y-py document."""
    doc = crdt.new_doc(client_id)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(count):
        crdt.insert_text(doc, len(crdt.text_of(doc)), f"e{index} ")
    return updates


async def gc_pass(docs: int, changed: int, entries: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp)) as server:
        redis = Redis.from_url(server.url)
        store = DocumentStore(redis)
        await store.load_scripts()
        appender = Appender(store)
        appender.start()
        updates = edits(entries * 2, 1)
        names = [f"doc-{index:05d}" for index in range(docs)]
        print(f"seeding {docs} documents x {entries} entries ...")
        await asyncio.gather(
            *(
                appender.submit(name, "w", c, updates[c], needs_or_nothing(updates[c]))
                for name in names
                for c in range(entries)
            )
        )
        collector, due = Collector(redis, GcPolicy()), DueSet(redis)
        for name in names:  # every reader acked everything
            await redis.zadd(tracker_key(name), {"reader": (await store.last_id(name)).score()})
        first = await run_due_pass(collector, due, batch_size=500, lease_ms=60_000, next_due_ms=10_000)
        print(f"first pass (all {docs} changed): {first.documents} docs, {first.folded} folded in {first.seconds:.3f}s")
        # Now only `changed` documents get new entries; the rest are settled.
        for name in names[:changed]:
            for c in range(entries, entries * 2):
                await appender.submit(name, "w", c, updates[c], needs_or_nothing(updates[c]))
            await redis.zadd(tracker_key(name), {"reader": (await store.last_id(name)).score()})
        pending = (await registry_counts(redis))[1]
        rounds = []
        for _ in range(3):
            started = time.perf_counter()
            summary = await run_due_pass(collector, due, batch_size=500, lease_ms=60_000, next_due_ms=10_000)
            rounds.append((time.perf_counter() - started, summary))
            for name in names[:changed]:  # touch them again for the next round
                await appender.submit(name, "w", 10_000 + len(rounds), updates[0], needs_or_nothing(updates[0]))
                await redis.zadd(tracker_key(name), {"reader": (await store.last_id(name)).score()})
        await appender.stop()
        print("\n| documents | changed | due set | pass seconds (3 runs) | folded per pass | docs/s |")
        print("|---|---|---|---|---|---|")
        times = ", ".join(f"{seconds:.3f}" for seconds, _ in rounds)
        best = min(seconds for seconds, _ in rounds)
        print(f"| {docs} | {changed} | {pending} | {times} | {rounds[0][1].folded} | {changed / best:,.0f} |")
        await redis.aclose()


class Load:
    """The same edit load against one Redis; GC loop optional."""

    def __init__(self, url: str, gc: bool, docs: int):
        self.redis = Redis.from_url(url)
        self.store = DocumentStore(self.redis)
        self.appender = Appender(self.store)
        self.gc = gc
        self.docs = [f"doc-{index:04d}" for index in range(docs)]
        self.clock = 0

    async def start(self) -> None:
        await self.store.load_scripts()
        self.appender.start()
        for index, doc in enumerate(self.docs):
            readers = {f"reader-{r}": 0 for r in range(3)}
            if index % 10 == 0:
                readers["stalled"] = 0
            await self.redis.zadd(tracker_key(doc), readers)

    async def edit(self, doc: str, update: bytes) -> None:
        clock, self.clock = self.clock, self.clock + 1  # before awaiting: edits run concurrently
        appended = await self.appender.submit(doc, "writer", clock, update, needs_or_nothing(update))
        score = StreamId.parse(str(appended.entry_id)).score()
        # Readers ack what they get; the stalled one never does.
        await self.redis.zadd(tracker_key(doc), {f"reader-{r}": score for r in range(3)}, xx=True, gt=True)

    async def memory(self) -> int:
        return int((await self.redis.info("memory"))["used_memory"])

    async def stream_entries(self) -> int:
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc in self.docs:
                pipe.xlen(stream_key(doc))
            return sum(await pipe.execute())

    async def snapshot_bytes(self) -> int:
        async with self.redis.pipeline(transaction=False) as pipe:
            for doc in self.docs:
                pipe.strlen(snapshot_key(doc))
            return sum(await pipe.execute())


async def memory_run(minutes: float, rate: float, docs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        servers = [RedisProcess(Path(tmp) / name).start() for name in ("gc-on", "gc-off")]
        try:
            loads = [Load(servers[0].url, True, docs), Load(servers[1].url, False, docs)]
            for load in loads:
                await load.start()
            policy = GcPolicy(relative_ms=30_000, absolute_ms=1_800_000)
            collector, due = Collector(loads[0].redis, policy), DueSet(loads[0].redis)
            writers = {doc: crdt.new_doc(index + 1) for index, doc in enumerate(loads[0].docs)}
            made: list[bytes] = []
            _observers = [crdt.observe_updates(writer, made.append) for writer in writers.values()]  # kept alive
            rng = random.Random(1)

            def next_edit(doc: str) -> bytes:
                """A fresh edit from the document's own writer (edits of one
                writer depend on each other, as in real typing)."""
                writer = writers[doc]
                length = len(crdt.text_of(writer))
                if length < 400:  # type until the page is full, then edit it: the size stays steady
                    crdt.insert_text(writer, rng.randint(0, length), f"e{rng.randrange(100)} ")
                else:
                    crdt.delete_text(writer, rng.randrange(length - 8), 8)
                return made.pop()

            deadline = time.monotonic() + minutes * 60
            next_sample, next_gc, sent = time.monotonic(), time.monotonic() + 10, 0
            print(
                "| minute | updates | used_memory GC on (MB) | used_memory GC off (MB) | stream entries on / off"
                " | snapshots on (KB) | gc pass s |"
            )
            print("|---|---|---|---|---|---|---|")
            gc_seconds = 0.0

            async def sample(label: str) -> str:
                on, off = [await load.memory() for load in loads]
                entries_on, entries_off = [await load.stream_entries() for load in loads]
                snapshots = await loads[0].snapshot_bytes()
                return (
                    f"| {label} | {sent} | {on / 1e6:.2f} | {off / 1e6:.2f} | {entries_on} / {entries_off}"
                    f" | {snapshots / 1e3:.1f} | {gc_seconds:.3f} |"
                )

            while time.monotonic() < deadline:
                tick = time.monotonic()
                batch = [(doc, next_edit(doc)) for doc in (rng.choice(loads[0].docs) for _ in range(int(rate / 10)))]
                for load in loads:
                    await asyncio.gather(*(load.edit(doc, update) for doc, update in batch))
                sent += len(batch)
                if time.monotonic() >= next_gc:
                    summary = await run_due_pass(collector, due, batch_size=500, lease_ms=60_000, next_due_ms=10_000)
                    gc_seconds = summary.seconds
                    print(
                        f"# gc pass: {summary.documents} docs, {summary.folded} folded, {summary.trimmed} trimmed,"
                        f" {summary.evicted} evicted, {summary.blocked} blocked, {summary.conflicts} conflicts,"
                        f" {summary.errors} errors",
                        flush=True,
                    )
                    next_gc += 10
                if time.monotonic() >= next_sample:
                    minute = (time.monotonic() - (deadline - minutes * 60)) / 60
                    print(await sample(f"{minute:.1f}"), flush=True)
                    next_sample += 60
                await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
            print(await sample("end"))
            for load in loads:
                await load.appender.stop()
                await load.redis.aclose()
        finally:
            for server in servers:
                server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("pass", help="one GC pass over many documents, few changed")
    one.add_argument("--docs", type=int, default=10_000)
    one.add_argument("--changed", type=int, default=1_000)
    one.add_argument("--entries", type=int, default=5, help="new entries per changed document")
    mem = sub.add_parser("memory", help="Redis memory under steady load, GC on vs off")
    mem.add_argument("--minutes", type=float, default=10)
    mem.add_argument("--rate", type=float, default=200, help="updates per second")
    mem.add_argument("--docs", type=int, default=100)
    args = parser.parse_args()
    if args.command == "pass":
        asyncio.run(gc_pass(args.docs, args.changed, args.entries))
    else:
        asyncio.run(memory_run(args.minutes, args.rate, args.docs))


if __name__ == "__main__":
    main()
