"""Cost of validating one update before it is appended: y-py's decode into a
scratch document vs yrelay's own layout decoder (update_format), which
validation now runs too; then the same checks in validator processes
(yrelay.yjs.validator), awaited one at a time and from many connections at
once (batched per round trip); and (issue 20) the server's path as it is
now: the write path's layout read given, an update of a known-safe shape
(decided by that read: Layout.known_safe) passes without a worker. Prints microseconds per update.

    .venv/bin/python bench/validation.py [--updates 20000] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import y_py

from yrelay.yjs import crdt, update_format
from yrelay.yjs.validator import Validator


def sample_updates(count: int) -> list[bytes]:
    """Typing: small inserts into one text, as a browser sends them."""
    doc = crdt.new_doc(1)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(count):
        crdt.insert_text(doc, len(crdt.text_of(doc)) // 2, f"w{index} ")
    return updates


def per_update_us(check, updates: list[bytes]) -> tuple[float, float]:
    """Microseconds per update: wall clock and CPU of this process (the two
    differ on a loaded machine, where wall includes time preempted)."""
    started, cpu = time.perf_counter(), time.process_time()
    for update in updates:
        check(update)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return wall / len(updates) * 1e6, cpu / len(updates) * 1e6


def large_updates(count: int, size: int) -> list[bytes]:
    """Pastes: one insert of ``size`` characters each."""
    doc = crdt.new_doc(2)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(count):
        crdt.insert_text(doc, 0, (f"{index:08d}" * (size // 8 + 1))[:size])
    return updates


async def pool_us(
    updates: list[bytes], workers: int, concurrency: int, with_layout: bool = False
) -> tuple[float, float]:
    """Microseconds per update through validator processes, ``concurrency``
    connections submitting at once (each awaits its own update): wall
    clock, and CPU of the server process (what the event loop pays).
    ``with_layout``: each update comes with its layout read (read before
    the clock starts: the write path reads it anyway, for causal admission),
    as the server submits them, so known-safe shapes skip the workers."""
    validator = Validator(workers, timeout=5.0)
    layouts = [update_format.read_layout(u, decide=True) if with_layout else None for u in updates]
    await validator.start()
    try:
        queue = iter(zip(updates, layouts, strict=True))

        async def connection() -> None:
            for update, layout in queue:
                error = await validator.submit(update, layout_checked=layout is not None, layout=layout)
                if error is not None:
                    raise error

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(connection() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        return wall / len(updates) * 1e6, cpu / len(updates) * 1e6
    finally:
        await validator.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    updates = sample_updates(args.updates)
    big = large_updates(max(args.updates // 20, 50), 64 * 1024)
    ypy = per_update_us(lambda u: y_py.apply_update(y_py.YDoc(), u), updates)
    ours = per_update_us(update_format.decode, updates)
    full = per_update_us(crdt.validate_update, updates)
    both = per_update_us(lambda u: crdt.validate_update(u, with_ypy=True), updates)
    print(f"typing updates ({sum(map(len, updates)) / len(updates):.0f} bytes on average), {len(updates)}:")
    print("| check | us per update (wall) | us of server CPU per update |")
    print("| --- | ---: | ---: |")
    print(f"| y-py decode into a scratch doc | {ypy[0]:.1f} | {ypy[1]:.1f} |")
    print(f"| update_format.decode | {ours[0]:.1f} | {ours[1]:.1f} |")
    print(f"| crdt.validate_update (pycrdt), in-loop | {full[0]:.1f} | {full[1]:.1f} |")
    print(
        f"| crdt.validate_update (pycrdt and y-py: YRELAY_VALIDATE_WITH_YPY), in-loop | {both[0]:.1f} | {both[1]:.1f} |"
    )
    layouts = [update_format.read_layout(u, decide=True) for u in updates]
    read = per_update_us(lambda u: update_format.read_layout(u, decide=True), updates)
    print(
        f"| update_format.read_layout (the write path's causal read, deciding the known shapes) "
        f"| {read[0]:.1f} | {read[1]:.1f} |"
    )
    for concurrency in (1, 16, 256):
        us, cpu = asyncio.run(pool_us(updates, args.workers, concurrency))
        print(f"| {args.workers} validator processes, {concurrency} connections at once | {us:.1f} | {cpu:.1f} |")
    for concurrency in (1, 256):
        us, cpu = asyncio.run(pool_us(updates, args.workers, concurrency, with_layout=True))
        print(
            f"| the server's path (known shapes in-loop, {args.workers} processes for the rest), "
            f"{concurrency} connections | {us:.1f} | {cpu:.1f} |"
        )
    known = sum(layout.known_safe for layout in layouts)
    print(f"known-safe shapes: {known} of {len(updates)}")
    print(f"\n64 KiB pastes, {len(big)}:")
    print("| check | us per update (wall) | us of server CPU per update |")
    print("| --- | ---: | ---: |")
    inloop = per_update_us(crdt.validate_update, big)
    print(f"| crdt.validate_update, in-loop | {inloop[0]:.1f} | {inloop[1]:.1f} |")
    for concurrency in (1, 16):
        us, cpu = asyncio.run(pool_us(big, args.workers, concurrency))
        print(f"| {args.workers} validator processes, {concurrency} connections at once | {us:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
