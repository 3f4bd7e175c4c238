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

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import AbstractStrategy, PipelineCommand, RedisCluster
from redis.asyncio.cluster import ClusterPipeline as _ClusterPipeline
from redis.commands.core import AsyncScript
from redis.event import EventDispatcherInterface
from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import ScriptTextT

from yrelay.exceptions import StartupError
from yrelay.tasks import lost_redis

#: Replies of a cluster in a failover or a resharding that redis-py did not
#: get past: the command may succeed when sent again, it is no fault of the key.
CLUSTER_TRANSIENT = (ClusterDownError, AskError, TryAgainError)
#: A command's error that says nothing of its key: the node was unreachable
#: (in a cluster pipeline one node's connection can fail alone).
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, *CLUSTER_TRANSIENT)


def shown_url(url: str) -> str:
    """``url`` without its password (``user:password@`` or ``?password=``), to show in a message."""
    try:
        parts = urlsplit(url)
        if parts.password:
            parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1))
        query = [
            (name, "***" if name.lower() == "password" else value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        ]
        return urlunsplit(parts._replace(query=urlencode(query, safe="*")))
    except ValueError:
        return "the Redis URL given"


async def ensure_reachable(redis: Any, url: str) -> None:
    """One PING; :class:`~yrelay.exceptions.StartupError` with a plain
    message when Redis does not answer (what a server checks before it
    starts anything: the alternative was 70 lines of traceback)."""
    try:
        await redis.ping()
    except Exception as exc:
        if not (lost_redis(exc) or isinstance(exc, RedisClusterException)):  # e.g. not a cluster node
            raise
        raise StartupError(
            f"Redis at {shown_url(url)} did not answer ({exc}): start it (or check the URL, its "
            "password and TLS), or leave out --redis-url / YRELAY_REDIS_URL to run an embedded "
            "one"
        ) from exc


def is_cluster(redis: object) -> bool:
    return isinstance(redis, (RedisCluster, _ClusterPipeline))


def open_redis(url: str, cluster: bool, *, pool_size: int = 64, **options: Any) -> Redis:
    """The shared client of a process: at most ``pool_size`` connections (per
    node in a cluster); a caller past that waits (one Redis) or is refused
    (the cluster client has no blocking pool: its default is unbounded)."""
    if cluster:
        # Typed as the one-Redis client its callers share commands with (the
        # cluster client is no subclass of it): lost_redis, xread_one and
        # ClusterPipeline cover where the two differ.
        return YrelayCluster.from_url(url, **options)  # type: ignore[return-value]
    return Redis.from_pool(BlockingConnectionPool.from_url(url, max_connections=pool_size, timeout=10, **options))


class YrelayCluster(RedisCluster):
    """redis-py's cluster client, with the pipeline below and a record of the
    scripts registered on it (to load them again on a node that lost them)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.known_scripts: dict[str, ScriptTextT] = {}

    # redis-py types the cluster client's register_script (a mixin of its sync
    # commands) as returning Script; the asyncio cluster's returns AsyncScript.
    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]
        registered = super().register_script(script)
        self.known_scripts[registered.sha] = registered.script
        return registered

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported in cluster mode")
        return ClusterPipeline(self, transaction)

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
    return client.execute_command(
        "XREAD", *block, "COUNT", count, "STREAMS", key, cursor, target_nodes=cluster.get_node_from_key(key)
    )


class _PlainPipeline(_ClusterPipeline):
    """redis-py's cluster pipeline as it is. redis-py's command mixins declare
    ``_event_dispatcher`` in a Protocol, which a type checker then takes for
    an abstract attribute of the pipeline (it is set in ``__init__``)."""

    _event_dispatcher: EventDispatcherInterface


def queued_commands(pipe: _ClusterPipeline) -> list[PipelineCommand]:
    """The commands queued on a cluster pipeline, in order: redis-py keeps
    them in its execution strategy's ``_command_queue`` (redis-py 6.2 and
    later; tests/test_redis_internals.py checks the installed release)."""
    strategy = pipe._execution_strategy
    if not isinstance(strategy, AbstractStrategy):
        raise TypeError(f"redis-py's cluster pipeline has no command queue yrelay knows ({type(strategy).__name__})")
    return strategy._command_queue


class ClusterPipeline(_PlainPipeline):
    """A cluster pipeline that takes Lua scripts (see the module doc)."""

    cluster_client: YrelayCluster

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> None:
        """Queue the script (what ``AsyncScript(..., client=pipe)`` awaits;
        awaiting the pipeline itself would empty its queue)."""
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        queued = [(cmd.args, dict(cmd.kwargs)) for cmd in queued_commands(self)]
        results = await super().execute(raise_on_error=False, allow_redirections=allow_redirections)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing and isinstance(self.cluster_client, YrelayCluster):
            await self.cluster_client.load_known_scripts()
            again = _PlainPipeline(self.cluster_client)
            for i in missing:
                args, kwargs = queued[i]
                again.execute_command(*args, **kwargs)
            for i, result in zip(missing, await again.execute(raise_on_error=False), strict=True):
                results[i] = result
        if raise_on_error:
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results
