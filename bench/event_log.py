"""Cost of the event log on the websocket path: the same load through a
server process with the log on and with it off, alternating, in one run.

    .venv/bin/python bench/event_log.py [--writers 4 --readers 4 --updates 1500 --rounds 2]

Each round starts a fresh ``yrelay serve`` (log on or off) against one
redis-server (appendfsync always), connects the readers, then the writers
type ``--updates`` small edits each as fast as acks allow (at most 64
unacked per writer), and measures acked updates per second and the time
until every reader holds every edit. Prints one row per round and the ratio
of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from yrelay.client import Backoff, YrelayClient
from yrelay.storage.embedded import RedisProcess
from yrelay.yjs import crdt
from yrelay_tools.testing.processes import ServerProcess

BACKOFF = Backoff(base=0.05, max_delay=1.0, max_attempts=50)


async def one_round(url: str, doc: str, writers: int, readers: int, updates: int) -> tuple[float, float]:
    clients = [YrelayClient(url, backoff=BACKOFF, subscription_check_interval=None) for _ in range(writers + readers)]
    for client in clients:
        await client.connect()
    docs = [await client.subscribe(doc) for client in clients]
    expected = writers * updates
    started = time.perf_counter()
    await asyncio.gather(*(type_edits(clients[i], docs[i], updates, f"w{i}-") for i in range(writers)))
    acked = time.perf_counter() - started
    while any(len(d.text) < total_length(writers, updates) for d in docs[writers:]):
        await asyncio.sleep(0.01)
    delivered = time.perf_counter() - started
    for client in clients:
        await client.close()
    return expected / acked, delivered


def total_length(writers: int, updates: int) -> int:
    return sum(len(f"w{i}-{k};") for i in range(writers) for k in range(updates))


async def type_edits(client: YrelayClient, doc, updates: int, tag: str) -> None:
    for k in range(updates):
        while client.pending >= 64:
            await asyncio.sleep(0.001)
        crdt.insert_text(doc.ydoc, 0, f"{tag}{k};")
    await client.wait_idle(timeout=120)


def load_arguments() -> argparse.Namespace:
    """The load options this benchmark shares with bench/metrics.py and bench/validator_path.py."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=2)
    return parser.parse_args()


def compare(variable: str, what: str, args: argparse.Namespace) -> None:
    """Rounds of the same load with ``variable`` on and off, alternating;
    prints a row per round and the ratio of the medians."""
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp) / "redis") as redis:
        results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        print(f"| round | {what} | acked updates/s | all delivered after (s) | event log lines |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for round_no in range(args.rounds):
            for mode in ("on", "off"):
                data = Path(tmp) / f"data-{mode}-{round_no}"
                env = {
                    "YRELAY_EVENT_LOG": "1",
                    "YRELAY_DATA_DIR": str(data),
                    "YRELAY_GC_INTERVAL": "0",
                    variable: "1" if mode == "on" else "0",
                }
                server = ServerProcess(redis.url, Path(tmp), env=env).start()
                try:
                    rate, delivered = asyncio.run(
                        one_round(server.ws_url, f"bench-{mode}-{round_no}", args.writers, args.readers, args.updates)
                    )
                finally:
                    server.stop()
                lines = sum(len(p.read_text().splitlines()) for p in (data / "events").glob("*.jsonl"))
                results[mode].append((rate, delivered))
                print(f"| {round_no} | {mode} | {rate:,.0f} | {delivered:.2f} | {lines:,} |")
        on = statistics.median(rate for rate, _ in results["on"])
        off = statistics.median(rate for rate, _ in results["off"])
        paired = statistics.median(a / b for (a, _), (b, _) in zip(results["on"], results["off"], strict=True))
        print(
            f"\nmedian acked updates/s: on {on:,.0f}, off {off:,.0f}, ratio on/off {on / off:.2f}; "
            f"median of the rounds' on/off ratios {paired:.2f}"
        )


def main() -> None:
    compare("YRELAY_EVENT_LOG", "event log", load_arguments())


if __name__ == "__main__":
    main()
