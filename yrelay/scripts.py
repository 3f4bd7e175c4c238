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
    """The text of ``yrelay/lua/<name>.lua``."""
    return resources.files("yrelay").joinpath("lua", f"{name}.lua").read_text()


class Scripts:
    """The registered scripts of one Redis client."""

    def __init__(self, redis: Redis):
        self.append = redis.register_script(source("append"))

    async def load(self, redis: Redis) -> None:
        """Load every script up front, so ``/readyz`` can report it and a
        syntax error fails at start-up instead of on the first update."""
        for script in (self.append,):
            script.sha = await redis.script_load(script.script)

