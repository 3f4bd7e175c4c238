"""Ack latency and CPU per update of two yrelay trees side by side (issue 20:
the validator hop), in rounds that alternate between them so the load of a
shared machine falls on both alike.

Each tree runs as `yrelay serve` with its own Redis (appendfsync always, the
bench's per-client limits off), started once. A round offers ``--rate``
typing updates/s for ``--seconds`` over ``--connections`` connections, one
document each (the bench's writers: y-py typing and corrections), paced, not
waiting for answers; an update's latency runs from its send to its
``appended``. CPU per 1,000 updates is read from /proc: the server process,
its child processes (the validator and engine workers), and Redis.

    PYTHONPATH=. .venv/bin/python bench/validator_latency.py --trees .,/work/main [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path

import websockets

from yrelay_tools.bench.edits import writer_edits
from yrelay_tools.bench.metrics import cpu_seconds, percentile
from yrelay_tools.bench.targets.servers import YrelayTarget, _children


async def _writer(
    url: str, doc: str, updates: list[bytes], interval: float, until: float, latencies: list[float]
) -> int:
    sent: dict[int, float] = {}
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"op": "hello"}))
        await ws.send(json.dumps({"op": "subscribe", "doc": doc}))

        async def read() -> None:
            async for message in ws:
                frame = json.loads(message)
                if frame.get("op") == "appended" and frame.get("clock") in sent:
                    latencies.append(time.perf_counter() - sent.pop(frame["clock"]))

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.2)  # welcome and subscribed first
        clock = 0
        next_at = time.perf_counter()
        while time.perf_counter() < until and clock < len(updates):
            clock += 1
            sent[clock] = time.perf_counter()
            await ws.send(
                json.dumps(
                    {
                        "op": "update",
                        "doc": doc,
                        "clock": clock,
                        "update": base64.b64encode(updates[clock - 1]).decode(),
                    }
                )
            )
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.sleep(1.0)  # the last answers
        reader.cancel()
        return clock


def _cpu(target: YrelayTarget) -> dict[str, float]:
    assert target.server is not None and target.server.process and target.redis and target.redis.process
    server = target.server.process.pid
    workers = sum(cpu_seconds(pid) for pid in _children(server))
    return {"server": cpu_seconds(server), "workers": workers, "redis": cpu_seconds(target.redis.process.pid)}


async def one_round(
    target: YrelayTarget, tag: str, rate: float, seconds: float, connections: int
) -> tuple[list[float], int, dict[str, float]]:
    assert target.server is not None
    per_connection = int(rate * seconds / connections) + 10
    edits = [writer_edits(1000 + i, per_connection, seed=i + 1) for i in range(connections)]
    latencies: list[float] = []
    before = _cpu(target)
    until = time.perf_counter() + 0.2 + seconds
    counts = await asyncio.gather(
        *(
            _writer(target.server.ws_url, f"{tag}-{i}", edits[i], connections / rate, until, latencies)
            for i in range(connections)
        )
    )
    after = _cpu(target)
    return latencies, sum(counts), {name: after[name] - before[name] for name in after}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", default=".,/work/main", help="two yrelay checkouts, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        targets = [YrelayTarget(Path(tmp), tree=tree) for tree in args.trees.split(",")]
        for target in targets:
            target.start()
        try:
            rows: dict[str, list[tuple[float, float, dict[str, float], int]]] = {t.name: [] for t in targets}
            print("| round | tree | acked | p50 ms | p99 ms | CPU s per 1k updates: server + its workers + redis |")
            print("| ---: | --- | ---: | ---: | ---: | --- |")
            for round_no in range(args.rounds):
                for index, target in enumerate(targets):
                    latencies, sent, cpu = asyncio.run(
                        one_round(target, f"r{round_no}t{index}", args.rate, args.seconds, args.connections)
                    )
                    latencies.sort()
                    p50, p99 = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
                    per_1k = {name: value / max(1, len(latencies)) * 1000 for name, value in cpu.items()}
                    rows[target.name].append((p50, p99, per_1k, len(latencies)))
                    print(
                        f"| {round_no} | {target.name} | {len(latencies)}/{sent} | {p50:.1f} | {p99:.1f} | "
                        f"{per_1k['server']:.2f} + {per_1k['workers']:.2f} + {per_1k['redis']:.2f} |",
                        flush=True,
                    )
            print("\nmedians over the rounds:")
            for name, results in rows.items():
                med = {key: statistics.median(r[2][key] for r in results) for key in ("server", "workers", "redis")}
                print(
                    f"- {name}: p50 {statistics.median(r[0] for r in results):.1f} ms, "
                    f"p99 {statistics.median(r[1] for r in results):.1f} ms, CPU s per 1k updates: "
                    f"server {med['server']:.2f}, its workers {med['workers']:.2f}, redis {med['redis']:.2f}"
                )
        finally:
            for target in targets:
                target.stop()


if __name__ == "__main__":
    main()
