"""When the slow updates of a hot (or many) run happened: the tail, over time.

Runs one step of ``yrelay bench``'s hot scenario (1 document, 2 writers, 50
readers; or ``--scenario many``: 1,000 documents x 2 clients) against one
target and prints, besides p50/p99/max, the send time (seconds into the run)
and latency of every update at or above the p99. A tail spread over the run
is queueing; a cluster at one moment is a stall
(issue 20: the GC pass every ``gc_interval`` seconds, see BENCHMARKS.md
"Issue 20: hot p99"). The server's work directory (its log, its event log
with the ``snapshot`` and ``trim`` events) is kept and named at the end.

    cd /tmp && PYTHONPATH=/work/main /work/main/.venv/bin/python /work/main/bench/hot_timeline.py \\
        [--target yrelay] [--rate 500] [--duration 10] [--scenario many]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from yrelay_tools.bench import load
from yrelay_tools.bench.metrics import percentile
from yrelay_tools.bench.targets import make_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="yrelay", help="a target of yrelay bench (yrelay, yrelay@TREE, node...)")
    parser.add_argument("--rate", type=float, default=500.0, help="updates/s offered")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of sending")
    parser.add_argument("--scenario", choices=("hot", "many"), default="hot")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hot-timeline-"))
    target = make_target(args.target, work)
    target.start()
    try:
        shape = (load.hot_document if args.scenario == "hot" else load.many_documents)(args.rate, args.duration)
        generator = load.Generator(target, replace(shape, deflate=True), 10.0)
        generator.connect()
        results = generator.go()
        generator.close()
    finally:
        target.stop()
    sent: dict[int, float] = {}
    arrived: dict[int, float] = {}
    for result in results:
        sent.update(result.sent)
        for key, (last, _) in result.receipts.items():
            arrived[key] = max(arrived.get(key, 0.0), last)
    timeline = sorted(
        (sent[key] - generator.start, (arrived[key] - sent[key]) * 1000) for key in sent if key in arrived
    )
    latencies = sorted(ms for _, ms in timeline)
    p99 = percentile(latencies, 0.99)
    print(
        f"{len(timeline)} updates: p50 {percentile(latencies, 0.5):.2f} ms, p99 {p99:.2f} ms, "
        f"max {latencies[-1]:.2f} ms"
    )
    print("at or above the p99 (s into the run: ms):")
    print(" ".join(f"{at:.2f}:{ms:.1f}" for at, ms in timeline if ms >= p99))
    print(
        f"the run started at {time.time() - (time.perf_counter() - generator.start):.3f} (unix time; "
        f"the stall probe's clock)"
    )
    print(f"server's work directory: {work}")


if __name__ == "__main__":
    main()
