"""What one GC fold costs: ``engine.fold`` of N new entries onto a snapshot
of B earlier ones (two writers typing, as in ``yrelay bench hot``), in this
process, median of several runs. The fold runs in an engine worker beside
the server: on a small machine its CPU is what the server's clients wait
behind during a GC pass (BENCHMARKS.md, "Issue 20: the GC pass in hot's
tail"). Compare two checkouts by running it under each one's PYTHONPATH:

    cd /tmp && PYTHONPATH=<checkout> /work/main/.venv/bin/python /work/main/bench/fold_cost.py \\
        [--base 2000 --entries 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from yrelay.yjs import engine
from yrelay_tools.bench.edits import writer_edits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=2000, help="entries already folded into the snapshot")
    parser.add_argument("--entries", type=int, default=3000, help="new entries to fold")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    half = (args.base + args.entries + 1) // 2
    updates = [
        update for pair in zip(writer_edits(1001, half), writer_edits(1002, half), strict=True) for update in pair
    ]
    base = engine.fold(b"", updates[: args.base]).snapshot
    new = updates[args.base : args.base + args.entries]
    times = []
    for _ in range(args.runs):
        started = time.perf_counter()
        fold = engine.fold(base, new)
        times.append(time.perf_counter() - started)
    assert fold.held == len(new), "the fold did not hold every entry"
    print(
        f"fold of {len(new)} entries onto a {len(base):,}-byte snapshot ({args.base} entries): "
        f"median {1000 * statistics.median(times):.1f} ms, min {1000 * min(times):.1f} ms "
        f"({1e6 * statistics.median(times) / len(new):.1f} us per entry), {args.runs} runs"
    )


if __name__ == "__main__":
    main()
