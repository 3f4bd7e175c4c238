"""Redis commands packed by hand and sent as one write, replies read in order.

For the per-event-loop-turn batches of the hot path (the appends and the
acks of every document), on a standalone Redis (a cluster client keeps
redis-py's pipeline, which routes each command to its node). redis-py's
pipeline spends more CPU per command than Redis takes to run it: under
1,000 documents its ``execute_command`` and the timer it arms per reply
were ~15% of the server's samples (BENCHMARKS.md, issue 20).
Here a command's bytes are joined once, the batch has one timeout, and
each reply is read without a timer of its own.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import NoScriptError, ResponseError

from yrelay.storage.scripts import LuaScript


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def arg(value: bytes | str | int | float) -> bytes:
    """A command argument as redis-py would send it."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, float):
        return repr(value).encode()
    return b"%d" % value


#: redis-py's pool hands out a connection (its method is untyped; the
#: signature of its ConnectionInterface, typed here once).
_get_connection: Callable[[ConnectionPool], Awaitable[AbstractConnection]] = ConnectionPool.get_connection


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
    connection = await _get_connection(pool)
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


def packable(redis: object) -> bool:
    """A standalone client; a cluster client routes each command to its
    node, which only redis-py's pipeline does."""
    return isinstance(redis, Redis)


class Batch:
    """The part of a redis-py pipeline the hot path uses, packed here:
    commands queue as bytes, :meth:`execute` sends them in one write."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self.commands: list[bytes] = []

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.commands = []

    def __len__(self) -> int:
        return len(self.commands)

    def execute_command(self, *args: bytes | str | int | float) -> Batch:
        self.commands.append(command(*map(arg, args)))
        return self

    def zadd(
        self,
        name: str,
        mapping: dict[str, int | float],
        nx: bool = False,
        xx: bool = False,
        gt: bool = False,
        ch: bool = False,
    ) -> Batch:
        flags = [flag for flag, on in ((b"NX", nx), (b"XX", xx), (b"GT", gt), (b"CH", ch)) if on]
        return self.execute_command(
            b"ZADD", name, *flags, *(part for member, score in mapping.items() for part in (score, member))
        )

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: bytes | str | int) -> Batch:
        """Queued (a redis-py ``AsyncScript`` called with ``client=`` this batch
        lands here); a NOSCRIPT reply is the caller's to handle."""
        return self.execute_command(b"EVALSHA", sha, numkeys, *keys_and_args)

    async def execute(self, raise_on_error: bool = True, scripts: Iterable[LuaScript] = ()) -> list[object]:
        """The replies in order. With ``scripts`` (those the batch may call):
        EVALSHAs refused NOSCRIPT (Redis restarted without its script cache)
        run again once they are loaded, as redis-py's pipeline would have
        made sure before sending (a ``SCRIPT EXISTS`` round trip per batch)."""
        replies = await execute(self.redis, self.commands)
        if scripts:
            await rerun_refused_scripts(self, replies, scripts)
        failed = next((reply for reply in replies if isinstance(reply, ResponseError)), None)
        if raise_on_error and failed is not None:
            raise failed
        return replies


async def rerun_refused_scripts(
    batch: Batch, replies: list[object], scripts: Iterable[LuaScript], then: Sequence[bytes] = ()
) -> list[object]:
    """The commands of ``batch`` that Redis refused NOSCRIPT (restarted
    without its script cache) run again once ``scripts`` are loaded (the
    same sha: the commands stand), followed by ``then`` (what must come
    after them, e.g. a WAIT); their replies replace the refusals in
    ``replies``. Returns the replies of ``then`` ([] when nothing was refused)."""
    missing = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if not missing:
        return []
    for script in scripts:
        await batch.redis.script_load(script.script)
    again = await execute(batch.redis, [*(batch.commands[index] for index in missing), *then])
    for index, reply in zip(missing, again, strict=False):  # `again` goes on with the replies to `then`
        replies[index] = reply
    return again[len(missing) :]


#: Where the hot path queues commands: a packed :class:`Batch`, or redis-py's
#: pipeline (a cluster's too: the clients are typed as ``Redis``).
CommandQueue = Batch | Pipeline


def pipeline(redis: Redis) -> CommandQueue:
    """A packed :class:`Batch` on a standalone client, else redis-py's pipeline."""
    return Batch(redis) if packable(redis) else redis.pipeline(transaction=False)


__all__ = [
    "Batch",
    "CommandQueue",
    "arg",
    "bulk",
    "command",
    "execute",
    "packable",
    "pipeline",
    "rerun_refused_scripts",
]
