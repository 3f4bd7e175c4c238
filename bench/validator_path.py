"""The websocket append path with updates validated in-loop vs in validator
processes (yrelay.yjs.validator), alternating, in one run: the load of
bench/event_log.py (writers typing small edits as fast as acks allow,
readers receiving them), the session rate limit raised out of the way.

    .venv/bin/python bench/validator_path.py [--writers 4 --readers 4 --updates 1500 --rounds 2]
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from event_log import load_arguments, one_round

from yrelay.storage.embedded import RedisProcess
from yrelay_tools.testing.processes import ServerProcess

MODES = {"in-loop (0 workers)": "0", "2 validator processes": "2"}


def main() -> None:
    args = load_arguments()
    with tempfile.TemporaryDirectory() as tmp, RedisProcess(Path(tmp) / "redis") as redis:
        results: dict[str, list[float]] = {mode: [] for mode in MODES}
        print("| round | validation | acked updates/s | all delivered after (s) |")
        print("| ---: | --- | ---: | ---: |")
        for round_no in range(args.rounds):
            for mode, workers in MODES.items():
                env = {
                    "YRELAY_VALIDATOR_WORKERS": workers,
                    "YRELAY_UPDATES_PER_SECOND": "1000000",
                    "YRELAY_UPDATE_BURST": "1000000",
                    "YRELAY_SUBJECT_UPDATES_PER_SECOND": "0",
                    "YRELAY_EVENT_LOG": "0",
                    "YRELAY_GC_INTERVAL": "0",
                }
                server = ServerProcess(redis.url, Path(tmp), env=env).start()
                try:
                    rate, delivered = asyncio.run(
                        one_round(
                            server.ws_url, f"bench-{workers}-{round_no}", args.writers, args.readers, args.updates
                        )
                    )
                finally:
                    server.stop()
                results[mode].append(rate)
                print(f"| {round_no} | {mode} | {rate:,.0f} | {delivered:.2f} |")
        medians = {mode: statistics.median(rates) for mode, rates in results.items()}
        print("\nmedian acked updates/s: " + ", ".join(f"{mode} {rate:,.0f}" for mode, rate in medians.items()))


if __name__ == "__main__":
    main()
