"""A consumer-group member in its own process, for tests that kill -9 or
SIGSTOP it: writes ``P <doc> <id>`` for each entry it processed, then
``A <doc> <offset> <result>`` for each ack, line-buffered.

    python tests/consumer_process.py REDIS_URL GROUP MEMBER OUT LEASE [ACK_DELAY]

``ACK_DELAY`` (seconds) between processing a batch and acking it widens the
window a kill or a pause lands in.
"""

from __future__ import annotations

import asyncio
import sys

from redis.asyncio import Redis

from yrelay.consumers import ConsumerGroup


async def main(url: str, group_name: str, member: str, out: str, lease: float, ack_delay: float) -> None:
    redis = Redis.from_url(url)
    async with ConsumerGroup(redis, group_name, member=member, lease=lease) as group:
        with open(out, "a", buffering=1) as lines:  # noqa: ASYNC230 - a local file, a line at a time: the test's view of this process
            lines.write("READY\n")
            async for batch in group.batches():
                for entry_id in batch.ids:
                    lines.write(f"P {batch.doc} {entry_id}\n")
                await asyncio.sleep(ack_delay)
                result = await batch.ack()
                lines.write(f"A {batch.doc} {batch.offset} {result.value}\n")


if __name__ == "__main__":
    url, group_name, member, out, lease = sys.argv[1:6]
    asyncio.run(main(url, group_name, member, out, float(lease), float(sys.argv[6]) if len(sys.argv) > 6 else 0.0))
