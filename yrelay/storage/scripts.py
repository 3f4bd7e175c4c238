"""Lua scripts, loaded once per Redis client and called by name.

Scripts live as ``.lua`` files in ``yrelay/storage/lua``; redis-py's ``Script`` object
sends EVALSHA and falls back to EVAL after a Redis restart flushed the cache.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Protocol, cast

from redis.asyncio import Redis


@cache
def source(name: str) -> str:
    """``yrelay/storage/lua/_prelude.lua`` (id parsing, Redis time) + ``<name>.lua``.

    Redis scripts cannot import each other; the shared helpers are prepended
    instead of being written again in every script."""
    lua = resources.files("yrelay.storage").joinpath("lua")
    return lua.joinpath("_prelude.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


NAMES = (
    "append",
    "gc_evict",
    "gc_snapshot",
    "gc_trim",
    "gc_claim",
    "gc_release",
    "digest_window",
    "digest_advance",
    "idset_update",
    "clocks_set",
    "quota_take",
    "quota_subscriptions",
    "consumer_claim",
    "consumer_ack",
    "consumer_heartbeat",
    "consumer_assign",
    "consumer_release",
    "consumer_read",
    "gc_groups",
)


class LuaScript(Protocol):
    """A registered script as yrelay calls it (redis-py's ``AsyncScript``),
    typed here once. redis-py names only its own clients for ``client``,
    but any object with ``evalsha`` works, and the hot path passes
    :class:`~yrelay.storage.packed.Batch`, which stands in for a pipeline;
    ``args`` are encoded by redis-py (a value it cannot encode is its
    ``DataError``)."""

    script: str | bytes
    sha: str

    def __call__(
        self, keys: Sequence[str | bytes] | None = None, args: Iterable[object] | None = None, client: object = None
    ) -> Awaitable[Any]: ...


def _register(redis: Redis, name: str) -> LuaScript:
    return cast(LuaScript, redis.register_script(source(name)))


class Scripts:
    """The registered scripts of one Redis client, one attribute per file."""

    def __init__(self, redis: Redis):
        self.append = _register(redis, "append")
        self.gc_evict = _register(redis, "gc_evict")
        self.gc_snapshot = _register(redis, "gc_snapshot")
        self.gc_trim = _register(redis, "gc_trim")
        self.gc_claim = _register(redis, "gc_claim")
        self.gc_release = _register(redis, "gc_release")
        self.digest_window = _register(redis, "digest_window")
        self.digest_advance = _register(redis, "digest_advance")
        self.idset_update = _register(redis, "idset_update")
        self.clocks_set = _register(redis, "clocks_set")
        self.quota_take = _register(redis, "quota_take")
        self.quota_subscriptions = _register(redis, "quota_subscriptions")
        self.consumer_claim = _register(redis, "consumer_claim")
        self.consumer_ack = _register(redis, "consumer_ack")
        self.consumer_heartbeat = _register(redis, "consumer_heartbeat")
        self.consumer_assign = _register(redis, "consumer_assign")
        self.consumer_release = _register(redis, "consumer_release")
        self.consumer_read = _register(redis, "consumer_read")
        self.gc_groups = _register(redis, "gc_groups")

    async def load(self, redis: Redis) -> None:
        """Load every script up front, so ``/readyz`` can report it and a
        syntax error fails at start-up instead of on the first update."""
        for name in NAMES:
            script = getattr(self, name)
            script.sha = await redis.script_load(script.script)
