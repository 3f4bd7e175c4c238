"""Reaching Redis from Spark's Python workers, with errors a person can read.

Workers are plain synchronous processes, so they use redis-py's sync client.
A refused connection would otherwise surface as a long chain of socket and
redis-py frames wrapped in a Java stack; here it becomes one
:class:`RedisUnreachable` line that names the URL (password masked).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis

from yrelay.spark_analytics.redis_options import SourceOptionError, redacted

#: Seconds to wait for a TCP connection: an unreachable host fails fast.
CONNECT_TIMEOUT = 5.0
#: Seconds to wait for one reply: pages are small, a stuck server is an error.
REPLY_TIMEOUT = 60.0


#: The client :func:`connected` gives: one Redis, or a cluster through a seed node.
SyncRedis = redis.Redis | redis.RedisCluster


class RedisUnreachable(ConnectionError):
    """Redis at the data source's URL did not answer."""


@contextlib.contextmanager
def connected(url: str, cluster: bool = False) -> Iterator[SyncRedis]:
    """A checked (PINGed) sync client for ``url`` (a seed node of a Redis
    Cluster with ``cluster``), closed on exit.

    Connection failures inside the block are re-raised as
    :class:`RedisUnreachable` without their chain of causes.
    """
    try:
        kind = redis.RedisCluster if cluster else redis.Redis
        client = kind.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=REPLY_TIMEOUT)
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.RedisClusterException) as error:
        raise RedisUnreachable(f"cannot reach Redis at {redacted(url)}: {error}") from None
    except ValueError as error:
        raise SourceOptionError(f"option 'url' is not a Redis URL ({redacted(url)}): {error}") from None
    try:
        client.ping()
        yield client
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise RedisUnreachable(f"cannot reach Redis at {redacted(url)}: {error}") from None
    finally:
        client.close()
