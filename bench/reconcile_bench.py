"""Set reconciliation at a million ids: bytes, round trips and CPU per
number of differences, against sending the full list and against the
information-theoretic lower bound; then where the full list becomes cheaper
(the fallback threshold); then the digest's own costs. Prints markdown tables.

    .venv/bin/python bench/reconcile_bench.py [--n 1000000] [--no-redis] [--no-threshold] [--no-branching]

Ids are 16-character random strings (like ``secrets.token_urlsafe(12)``).
Both peers run in this process; "client" and "server" times are the CPU
time spent inside ``Reconciler`` and inside ``respond``. With ``RedisIdSet``
as the server store, the server column is wall time (it includes Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import random
import tempfile
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from yrelay.reconciliation import Digest, DigestSet, MemoryIdSet, Reconciler, RedisIdSet, digest_of, protocol, respond
from yrelay.reconciliation.storage import IdSet
from yrelay.storage.embedded import RedisProcess

DIFFERENCES = (0, 1, 10, 100, 1_000, 10_000)
#: Differences as a fraction of n, for the threshold: where does the full list win?
FRACTIONS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2)


def make_ids(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [base64.urlsafe_b64encode(rng.randbytes(12)).decode() for _ in range(count)]


def lower_bound_bytes(n: int, d: int) -> float:
    """log2 C(n, d) bits, in bytes: what locating d differences among n needs."""
    return (math.lgamma(n + 1) - math.lgamma(d + 1) - math.lgamma(n - d + 1)) / math.log(2) / 8


@dataclass
class Run:
    up: int  # bytes client -> server
    down: int  # bytes server -> client
    round_trips: int
    client_s: float
    server_s: float

    @property
    def total(self) -> int:
        return self.up + self.down


async def reconcile(
    client: IdSet, server: IdSet, expect: tuple[int, int], *, wall: bool = False, **options: float
) -> Run:
    """One reconciliation, timed per side; checks the result's sizes."""
    clock = time.perf_counter if wall else time.process_time
    client_s = server_s = 0.0
    started = time.process_time()
    reconciler = Reconciler(client, await server.digest(), **options)
    request = await reconciler.start()
    client_s += time.process_time() - started
    while request is not None:
        started = clock()
        reply = await respond(server, request)
        server_s += clock() - started
        started = time.process_time()
        request = await reconciler.step(reply)
        client_s += time.process_time() - started
    assert (len(reconciler.only_local), len(reconciler.only_remote)) == expect
    return Run(reconciler.bytes_sent, reconciler.bytes_received, reconciler.round_trips, client_s, server_s)


def sides(ids: list[str], n: int, client_only: int, server_only: int) -> tuple[list[str], list[str]]:
    """Client and server lists sharing ``n - server_only`` ids; the server's
    is always ``ids[:n]``."""
    common = ids[server_only:n]
    return common + ids[n : n + client_only], common + ids[:server_only]


async def warm(*stores: MemoryIdSet) -> None:
    for store in stores:  # build the prefix arrays outside the timed part
        await store.fingerprints([("", None)])


def row(*cells: object) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def kb(size: float) -> str:
    return f"{size / 1024:,.1f}"


async def differences_table(ids: list[str], n: int, redis: Redis | None) -> None:
    title = "RedisIdSet (server wall s)" if redis else "MemoryIdSet"
    print(f"\n### n = {n:,}, server store: {title}\n")
    print(
        row(
            "d",
            "client->server KB",
            "server->client KB",
            "round trips",
            "client CPU s",
            "server s",
            "full list KB, RT, client+server s",
            "lower bound KB",
        )
    )
    print(row(*["---:"] * 8))
    if redis:  # the server holds ids[:n] for every d; the client's side varies
        server: IdSet = RedisIdSet(redis, "bench:{r}:ids", "bench:{r}:digest")
        await redis.delete(server.members_key, server.digest_key)  # type: ignore[attr-defined]
        await server.add(ids[:n])  # type: ignore[attr-defined]
    else:
        server = MemoryIdSet(ids[:n])
        await warm(server)  # type: ignore[arg-type]
    for d in DIFFERENCES:
        client_only, server_only = d - d // 2, d // 2
        client = MemoryIdSet(sides(ids, n, client_only, server_only)[0])
        await warm(client)
        run = await reconcile(client, server, (client_only, server_only), wall=redis is not None)
        full = await reconcile(
            client, server, (client_only, server_only), wall=redis is not None, full_list_fraction=0.0
        )
        print(
            row(
                f"{d:,}",
                kb(run.up),
                kb(run.down),
                run.round_trips,
                f"{run.client_s:.2f}",
                f"{run.server_s:.2f}",
                summary(full),
                kb(lower_bound_bytes(n, d)),
            )
        )
    if redis:
        started = time.perf_counter()
        await server.fingerprints([("", None)])
        print(f"\nReading and hashing all {n:,} ids of the RedisIdSet: {time.perf_counter() - started:.2f} s")


#: Links to price a run on: bytes per second and round-trip time in seconds.
LINKS = {"10 Mbit/s, 50 ms": (1.25e6, 0.05), "100 Mbit/s, 10 ms": (12.5e6, 0.01)}


def seconds_on(link: str, run: Run) -> float:
    """Completion time on ``link``: transfer + round trips + both sides' CPU
    (request and reply alternate, so nothing overlaps)."""
    rate, rtt = LINKS[link]
    return run.total / rate + run.round_trips * rtt + run.client_s + run.server_s


async def threshold_table(ids: list[str], n: int) -> None:
    print(f"\n### Where the full list wins (n = {n:,}, MemoryIdSet, no fallback vs full list)\n")
    print(
        row(
            "differences",
            "shape",
            "ranges KB, RT, CPU client+server s",
            "full list KB, RT, CPU s",
            "bytes ratio",
            *(f"s on {link}: ranges / full" for link in LINKS),
        )
    )
    print(row("---:", "---", "---:", "---:", "---:", *["---:"] * len(LINKS)))
    for fraction in FRACTIONS:
        d = int(n * fraction)
        for shape, (client_only, server_only) in (("both sides", (d - d // 2, d // 2)), ("server lacks", (d, 0))):
            a, b = sides(ids, n, client_only, server_only)
            client, server = MemoryIdSet(a), MemoryIdSet(b)
            await warm(client, server)
            ranges = await reconcile(client, server, (client_only, server_only), full_list_fraction=math.inf)
            full = await reconcile(client, server, (client_only, server_only), full_list_fraction=0.0)
            print(
                row(
                    f"{d:,} ({fraction:.1%})",
                    shape,
                    summary(ranges),
                    summary(full),
                    f"{ranges.total / full.total:.2f}",
                    *(f"{seconds_on(link, ranges):.2f} / {seconds_on(link, full):.2f}" for link in LINKS),
                )
            )


def summary(run: Run) -> str:
    return f"{kb(run.total)}, {run.round_trips}, {run.client_s:.2f}+{run.server_s:.2f}"


async def branching_table(ids: list[str], n: int) -> None:
    """What if: other branching factors and leaf sizes (module constants)."""
    print(f"\n### Branching factor and leaf size (n = {n:,}, MemoryIdSet): total KB / round trips\n")
    print(row("branching", "leaf", *(f"d = {d:,}" for d in DIFFERENCES[1:5])))
    print(row("---:", "---:", *["---:"] * 4))
    server = MemoryIdSet(ids[:n])
    clients = {d: MemoryIdSet(sides(ids, n, d - d // 2, d // 2)[0]) for d in DIFFERENCES[1:5]}
    await warm(server, *clients.values())
    chosen = protocol.BRANCHING, protocol.LEAF
    try:
        for protocol.BRANCHING, protocol.LEAF in ((8, 8), (16, 8), (16, 16), (16, 32), (32, 16), (32, 32), (64, 16)):
            runs = [await reconcile(client, server, (d - d // 2, d // 2)) for d, client in clients.items()]
            print(row(protocol.BRANCHING, protocol.LEAF, *(f"{kb(run.total)} / {run.round_trips}" for run in runs)))
    finally:
        protocol.BRANCHING, protocol.LEAF = chosen


def per_call_us(action, items: list[str]) -> float:
    started = time.perf_counter()
    for item in items:
        action(item)
    return (time.perf_counter() - started) / len(items) * 1e6


async def digest_costs(ids: list[str], n: int, redis: Redis | None) -> None:
    print("\n### Digest costs\n")
    print(row("operation", "cost"))
    print(row("---", "---:"))
    started = time.perf_counter()
    digest_of(ids[:n])
    print(row(f"digest_of({n:,} ids), duplicate check included", f"{time.perf_counter() - started:.3f} s"))
    extra = ids[n : n + 10_000]
    digest_set = DigestSet()
    print(row("DigestSet.add, per id", f"{per_call_us(digest_set.add, extra):.2f} us"))
    print(row("DigestSet.remove, per id", f"{per_call_us(digest_set.remove, extra):.2f} us"))
    print(row("Digest.add (immutable), per id", f"{per_call_us(Digest().add, extra):.2f} us"))
    memory = MemoryIdSet(ids[:n])
    await warm(memory)
    some = extra[:1_000]
    print(row(f"MemoryIdSet.add of one id into {n:,}", f"{per_call_us(lambda i: memory.add([i]), some):.1f} us"))
    started = time.perf_counter()
    await warm(memory)
    print(row("MemoryIdSet prefix rebuild after those adds", f"{time.perf_counter() - started:.3f} s"))
    if redis:
        store = RedisIdSet(redis, "bench:{d}:ids", "bench:{d}:digest")
        await redis.delete(store.members_key, store.digest_key)
        started = time.perf_counter()
        for item in some:
            await store.add([item])
        print(
            row(
                "RedisIdSet.add, one id per call (script round trip)",
                f"{(time.perf_counter() - started) / len(some) * 1e6:.0f} us",
            )
        )
        started = time.perf_counter()
        added = await store.add(ids[:100_000])
        print(
            row(
                "RedisIdSet.add, 1,000 ids per script call, per id",
                f"{(time.perf_counter() - started) / added * 1e6:.1f} us",
            )
        )
        started = time.perf_counter()
        await store.digest()
        print(row("RedisIdSet.digest (HMGET)", f"{(time.perf_counter() - started) * 1e3:.2f} ms"))
        started = time.perf_counter()
        await store.recompute()
        print(row(f"RedisIdSet.recompute over {added + len(some):,} ids", f"{time.perf_counter() - started:.2f} s"))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--no-redis", action="store_true")
    parser.add_argument("--no-threshold", action="store_true")
    parser.add_argument("--no-branching", action="store_true")
    args = parser.parse_args()
    ids = make_ids(args.n + max(args.n // 5, 10_000) + 1, seed=1)
    await differences_table(ids, args.n, None)
    if not args.no_branching:
        await branching_table(ids, args.n)
    if not args.no_threshold:
        await threshold_table(ids, args.n)
    with tempfile.TemporaryDirectory() as data, RedisProcess(data, fsync="no") as process:
        redis = None if args.no_redis else Redis.from_url(process.url)
        if redis:
            await differences_table(ids, args.n, redis)
        await digest_costs(ids, args.n, redis)
        if redis:
            await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
