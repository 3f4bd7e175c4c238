"""The Redis client of a process: one Redis, or a Redis Cluster.

With ``redis_cluster`` on (``--redis-cluster``, ``YRELAY_REDIS_CLUSTER=1``)
the URL is one seed node; redis-py's cluster client discovers the others,
routes each command to the node of its key's slot, follows ``MOVED`` and
``ASK`` (resharding) and refreshes the slot map after a failover.

Two things redis-py's cluster pipeline does not do that yrelay needs, added
by :class:`ClusterPipeline` here:

- Lua scripts inside a pipeline (the appender's batches, GC): redis-py blocks
  ``evalsha`` on a cluster pipeline; it is queued as a plain ``EVALSHA``
  command, routed by its keys like any other (every script touches one slot:
  docs/architecture.md#redis-cluster).
- A node that does not know a script (a replica promoted by a failover on a
  Redis whose script cache is not replicated, 7.0+): the commands that got
  ``NOSCRIPT`` are sent again once the scripts are loaded on every master. A
  ``NOSCRIPT`` command did not run, so sending it again is exact.
"""

from __future__ import annotations

import os
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import ClusterPipeline as _ClusterPipeline
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, ClusterDownError, NoScriptError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: Replies of a cluster in a failover or a resharding that redis-py did not
#: get past: the command may succeed when sent again, it is no fault of the key.
CLUSTER_TRANSIENT = (ClusterDownError, AskError, TryAgainError)
#: A command's error that says nothing of its key: the node was unreachable
#: (in a cluster pipeline one node's connection can fail alone).
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, *CLUSTER_TRANSIENT)

#: What redis-py 8.1's cluster client raises when a node fails under
#: concurrent commands: on a connection error it closes every connection of
#: the client, and a command of another task then writes to a connection
#: whose writer is gone (seen in tests/test_cluster.py's kill -9); under
#: uvloop the same race raises RuntimeError ("the handler is closed": seen in
#: ``yrelay chaos --cluster``, where it ended a bucket's watcher for good).
#: Taken as a lost connection (the fan-out, the subject quotas).
REDIS_PY_RACE = (AttributeError, RuntimeError)


def lost_redis(exc: BaseException) -> bool:
    """``exc`` says Redis was lost or failed, and the call may be retried:
    a Redis or OS error, or :data:`REDIS_PY_RACE` raised inside redis-py
    itself (never one of yrelay's own AttributeErrors: a bug still crashes
    the loop it is in, loudly). For the background loops that retry."""
    if isinstance(exc, (RedisError, OSError)):
        return True
    return isinstance(exc, REDIS_PY_RACE) and _raised_in_redis_py(exc)


def _raised_in_redis_py(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}redis{os.sep}" in tb.tb_frame.f_code.co_filename


def is_cluster(redis: object) -> bool:
    return isinstance(redis, (RedisCluster, _ClusterPipeline))


def open_redis(url: str, cluster: bool, *, pool_size: int = 64, **options: Any) -> Redis:
    """The shared client of a process: at most ``pool_size`` connections (per
    node in a cluster); a caller past that waits (one Redis) or is refused
    (the cluster client has no blocking pool: its default is unbounded)."""
    if cluster:
        return YrelayCluster.from_url(url, **options)  # type: ignore[return-value]
    return Redis.from_pool(BlockingConnectionPool.from_url(url, max_connections=pool_size, timeout=10, **options))


class YrelayCluster(RedisCluster):
    """redis-py's cluster client, with the pipeline below and a record of the
    scripts registered on it (to load them again on a node that lost them)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.known_scripts: dict[str, bytes | str] = {}

    def register_script(self, script: Any) -> AsyncScript:
        registered = super().register_script(script)
        self.known_scripts[registered.sha] = registered.script
        return registered

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported in cluster mode")
        return ClusterPipeline(self, transaction)

    def node_of(self, key: str) -> ClusterNode:
        """The master serving ``key``'s slot (as this client last saw the map)."""
        return self.get_node_from_key(key)

    async def load_known_scripts(self) -> None:
        """Load every script registered here on every master (``SCRIPT
        LOAD`` goes to all of them)."""
        for script in self.known_scripts.values():
            await self.script_load(script)


def xread_one(client: Any, key: str, cursor: str, count: int, block_ms: int | None = None) -> Any:
    """``XREAD [BLOCK] COUNT .. STREAMS key cursor`` on ``client`` (a cluster
    client or pipeline), sent to ``key``'s node by name: left to itself,
    redis-py asks the server where XREAD's ("movable") keys are, two
    ``COMMAND`` round trips per read (measured: bench/cluster_fanout.py). A
    ``MOVED`` reply is still followed."""
    block = ("BLOCK", block_ms) if block_ms is not None else ()
    cluster = client if isinstance(client, RedisCluster) else client.cluster_client
    return client.execute_command("XREAD", *block, "COUNT", count, "STREAMS", key, cursor,
                                  target_nodes=cluster.get_node_from_key(key))


class ClusterPipeline(_ClusterPipeline):
    """A cluster pipeline that takes Lua scripts (see the module doc)."""

    cluster_client: YrelayCluster

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> None:  # type: ignore[override]
        """Queue the script (what ``AsyncScript(..., client=pipe)`` awaits;
        awaiting the pipeline itself would empty its queue)."""
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        queued = [(cmd.args, dict(cmd.kwargs)) for cmd in self._execution_strategy._command_queue]
        results = await super().execute(raise_on_error=False, allow_redirections=allow_redirections)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing and isinstance(self.cluster_client, YrelayCluster):
            await self.cluster_client.load_known_scripts()
            again = _ClusterPipeline(self.cluster_client)
            for i in missing:
                args, kwargs = queued[i]
                again.execute_command(*args, **kwargs)
            for i, result in zip(missing, await again.execute(raise_on_error=False)):
                results[i] = result
        if raise_on_error:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results
