"""Lua scripts, loaded once per Redis client and called by name.

Scripts live as ``.lua`` files in ``yrelay/lua``; redis-py's ``Script`` object
sends EVALSHA and falls back to EVAL after a Redis restart flushed the cache.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis.asyncio import Redis


@cache
def source(name: str) -> str:
    """``yrelay/lua/_prelude.lua`` (id parsing, Redis time) + ``<name>.lua``.

    Redis scripts cannot import each other; the shared helpers are prepended
    instead of being written again in every script."""
    lua = resources.files("yrelay").joinpath("lua")
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


class Scripts:
    """The registered scripts of one Redis client, one attribute per file."""

    def __init__(self, redis: Redis):
        self.append = redis.register_script(source("append"))
        self.gc_evict = redis.register_script(source("gc_evict"))
        self.gc_snapshot = redis.register_script(source("gc_snapshot"))
        self.gc_trim = redis.register_script(source("gc_trim"))
        self.gc_claim = redis.register_script(source("gc_claim"))
        self.gc_release = redis.register_script(source("gc_release"))
        self.digest_window = redis.register_script(source("digest_window"))
        self.digest_advance = redis.register_script(source("digest_advance"))
        self.idset_update = redis.register_script(source("idset_update"))
        self.clocks_set = redis.register_script(source("clocks_set"))
        self.quota_take = redis.register_script(source("quota_take"))
        self.quota_subscriptions = redis.register_script(source("quota_subscriptions"))
        self.consumer_claim = redis.register_script(source("consumer_claim"))
        self.consumer_ack = redis.register_script(source("consumer_ack"))
        self.consumer_heartbeat = redis.register_script(source("consumer_heartbeat"))
        self.consumer_assign = redis.register_script(source("consumer_assign"))
        self.consumer_release = redis.register_script(source("consumer_release"))
        self.consumer_read = redis.register_script(source("consumer_read"))
        self.gc_groups = redis.register_script(source("gc_groups"))

    async def load(self, redis: Redis) -> None:
        """Load every script up front, so ``/readyz`` can report it and a
        syntax error fails at start-up instead of on the first update."""
        for name in NAMES:
            script = getattr(self, name)
            script.sha = await redis.script_load(script.script)
