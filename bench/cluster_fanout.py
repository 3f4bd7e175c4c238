"""What the cluster fan-out costs, on a local 3-master Redis Cluster.

Compares the read path yrelay uses on a cluster (yrelay/storage/reader.py:
a wake-up per bucket, then one XREAD per woken document pipelined per node)
with polling every subscribed document (the per-document reads without the
wake-up), and with the one-XREAD-over-everything of a single Redis (not
possible on a cluster: CROSSSLOT).

Prints: the cost of one pipelined read of every subscribed document (what a
poll or a sweep costs), and, with appends at a steady rate to random
documents through the real Appender + Fanout, the latency from submit
to delivery and the Redis commands per append.

    PYTHONPATH=. python bench/cluster_fanout.py --docs 1000 --rate 500 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from yrelay.app.fanout import Fanout
from yrelay.app.subscribers import SubscriptionRegistry
from yrelay.storage.append import Appender, append_one
from yrelay.storage.change_feed import announce_buckets as announce
from yrelay.storage.client import YrelayCluster, xread_one
from yrelay.storage.keys import stream_key
from yrelay.storage.reads import DocumentStore
from yrelay.yjs.admission import Needs
from yrelay_tools.testing.redis_cluster import LocalCluster


class Probe:
    """A subscriber that records when each of its entries arrived."""

    def __init__(self, doc: str, arrivals: dict[str, float]):
        self.doc, self.session, self.arrivals = doc, "probe", arrivals

    def offer(self, batch) -> None:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        for entry in batch.entries:
            self.arrivals.setdefault(str(entry.id), now)

    def document_failed(self, reason: str) -> None:
        raise RuntimeError(reason)

    def evicted(self) -> None:
        pass


async def commands(redis: YrelayCluster) -> dict[str, int]:
    """Calls of each command on every master so far."""
    infos = await redis.info("commandstats", target_nodes=YrelayCluster.PRIMARIES)
    totals: dict[str, int] = {}
    for info in infos.values():
        for name, stats in info.items():
            totals[name] = totals.get(name, 0) + int(stats["calls"])
    return totals


async def sweep_ms(redis: YrelayCluster, docs: list[str], rounds: int = 20) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        async with redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                xread_one(pipe, stream_key(doc), "0-0", 100)
            await pipe.execute()
    return (time.perf_counter() - started) / rounds * 1000


async def run(args: argparse.Namespace) -> None:
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="yrelay-cluster-bench-"))).start()
    try:
        redis = YrelayCluster.from_url(cluster.url)
        store = DocumentStore(redis)
        await store.load_scripts()
        docs = [f"bench/doc-{i:05d}" for i in range(args.docs)]
        for doc in docs:
            await append_one(store, doc, "seed", 0, b"\x00\x00")
        sweep = await sweep_ms(redis, docs)
        print(
            f"one pipelined XREAD of each of {len(docs)} documents: {sweep:.1f} ms "
            f"(polling every 10 ms would need {sweep / 10:.0%} of a core and "
            f"{len(docs) * 100:,} commands/s with nothing to deliver)"
        )

        arrivals: dict[str, float] = {}
        registry: SubscriptionRegistry = SubscriptionRegistry()
        fanout = Fanout(redis, store, registry, block_ms=1000, count=100)
        for doc in docs:
            await fanout.register(Probe(doc, arrivals))
        fanout.start()
        appender = Appender(store, announce=lambda batch: announce(redis, batch))
        appender.start()
        await asyncio.sleep(1.5)  # the first sweep and the watchers settle
        before, submitted = await commands(redis), {}
        interval, deadline, clock = 1 / args.rate, time.perf_counter() + args.seconds, 1
        while time.perf_counter() < deadline:
            doc = random.choice(docs)
            started = time.perf_counter()
            result = await appender.submit(doc, "writer", clock, b"\x00\x00", Needs())
            submitted[result.entry_id] = started
            clock += 1
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))
        await asyncio.sleep(1.5)
        after = await commands(redis)
        latencies = sorted((arrivals[entry] - sent) * 1000 for entry, sent in submitted.items() if entry in arrivals)
        print(
            f"{len(submitted)} appends at {args.rate}/s to random ones of {len(docs)} subscribed documents: "
            f"{len(latencies)} delivered, submit-to-delivery p50 {statistics.median(latencies):.1f} ms, "
            f"p99 {latencies[int(len(latencies) * 0.99) - 1]:.1f} ms; "
            f"{(sum(after.values()) - sum(before.values())) / len(submitted):.1f} Redis commands per append "
            f"(append, marks, wake-up, reads, sweeps)"
        )
        print(
            "  per append: "
            + ", ".join(
                f"{name.removeprefix('cmdstat_')} {(after[name] - before.get(name, 0)) / len(submitted):.2f}"
                for name in sorted(after)
                if after[name] - before.get(name, 0) >= len(submitted) / 100
            )
        )
        await appender.stop()
        await fanout.stop()
        await redis.aclose()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
