"""Redis commands packed by hand and sent as one write, replies read in order.

For the per-event-loop-turn batches of the hot path (the acks of every
document). redis-py's pipeline spends more CPU per command than Redis takes
to run it: under 1,000 documents its ``execute_command`` and the timer it
arms per reply were ~15% of the server's samples (BENCHMARKS.md, issue 20).
Here a command's bytes are joined once, the batch has one timeout, and
each reply is read without a timer of its own.
"""

from __future__ import annotations

import asyncio
import math

from redis.asyncio import Redis
from redis.exceptions import ResponseError


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def arg(value: bytes | str | int) -> bytes:
    """A command argument as redis-py would send it."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return b"%d" % value


def command(*parts: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n%s" % (len(parts), b"".join(map(bulk, parts)))


async def execute(redis: Redis, commands: list[bytes]) -> list[object]:
    """Send ``commands`` in one write on one of ``redis``'s pooled
    connections; their replies in order, a command Redis refused as its
    :class:`ResponseError` (like ``pipeline.execute(raise_on_error=False)``).
    Any other failure drops the connection (its replies would be out of
    step) and raises."""
    if not commands:
        return []
    pool = redis.connection_pool
    connection = await pool.get_connection()
    try:
        async with asyncio.timeout(connection.socket_timeout):  # one timer for the batch, not one per reply
            await connection.send_packed_command(b"".join(commands))
            replies: list[object] = []
            for _ in commands:
                try:
                    replies.append(await connection.read_response(timeout=math.inf))
                except ResponseError as refused:
                    replies.append(refused)
        return replies
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        await pool.release(connection)


__all__ = ["arg", "bulk", "command", "execute"]
