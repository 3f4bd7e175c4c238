"""The validator's CPU per update with one engine (pycrdt, the default) and
with two (``YRELAY_VALIDATE_WITH_YPY``), over updates outside the known
shapes (the ones that reach a validator process; BENCHMARKS.md, issue 32).

    PYTHONPATH=. .venv/bin/python bench/validation_engines.py [--survivors FILE]

``--survivors``: also time a sample of an ``update_fuzz --survivors`` run's
``.with-ypy`` file. Every update is first run through y-py in a child
process and kept only if it reads it: y-py aborts its process on some.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from yrelay.yjs import crdt, validation
from yrelay.yjs.update_format import read_layout
from yrelay_tools.testing.update_fuzz import OK, Engine, real_updates


def read_by_both(candidates: list[bytes]) -> list[bytes]:
    kept = []
    for update in candidates:
        try:
            crdt.validate_update(update)
            crdt.check_ypy_client_ids(update)
        except crdt.InvalidUpdate:
            continue
        kept.append(update)
    ypy = Engine("ypy")
    try:
        ypy.send(kept)
        return [update for update, verdict in zip(kept, ypy.receive(kept), strict=True) if verdict == OK]
    finally:
        ypy.stop()


def ms_per_1000(check: Callable[[bytes], str], updates: list[bytes], rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for update in updates:
            check(update)
        best = min(best, (time.process_time() - started) / len(updates) * 1_000_000)
    return best


def report(name: str, updates: list[bytes]) -> None:
    outside = [u for u in updates if not read_layout(u, decide=True).known_safe]
    alone = ms_per_1000(validation.check, outside)
    both = ms_per_1000(lambda u: validation.check(u, True), outside)
    print(
        f"| {name}, {len(outside)}, median {sorted(map(len, outside))[len(outside) // 2]} B | "
        f"{alone:.1f} ms per 1,000 | {both:.1f} ms per 1,000 | {both / alone:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--survivors", help="an update_fuzz --survivors .with-ypy file")
    parser.add_argument("--sample", type=int, default=3000)
    args = parser.parse_args()
    print("| updates outside the known shapes | pycrdt alone | with y-py | ratio |")
    print("| --- | ---: | ---: | ---: |")
    report(
        "real edits (update_fuzz.real_updates, seeds 1-5)",
        read_by_both([u for seed in range(1, 6) for u in real_updates(seed)]),
    )
    if args.survivors:
        lines = open(args.survivors).read().split()
        random.Random(1).shuffle(lines)
        sample = [u for u in map(bytes.fromhex, lines) if not read_layout(u, decide=True).known_safe][: args.sample]
        report("fuzz survivors both engines read", read_by_both(sample))


if __name__ == "__main__":
    main()
