"""The server context's start and stop: nothing is left running or open."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from yrelay.app.context import ServerContext
from yrelay.config import Settings
from yrelay.yjs.validator import Validator


def yrelay_tasks() -> list[str]:
    return sorted(task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith("yrelay-"))


async def test_a_start_that_fails_half_way_stops_every_task_and_closes_every_connection(
    redis_url: str, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {client["id"] for client in await redis_client.client_list()}
    started: list[str] = []

    async def fails(self: Validator) -> None:  # the last part to start
        started.extend(yrelay_tasks())
        raise RuntimeError("no validator worker could start")

    monkeypatch.setattr(Validator, "start", fails)
    with pytest.raises(RuntimeError, match="no validator worker"):
        await ServerContext.open(Settings.from_env(gc_interval=1.0), redis_url)
    # What the failure had to undo, and did:
    assert {
        "yrelay-ack-writer",
        "yrelay-appender",
        "yrelay-fanout",
        "yrelay-gc",
        "yrelay-presence",
        "yrelay-revocations",
    } <= set(started)
    assert yrelay_tasks() == []
    # Every connection the context opened is gone (Redis sees a closed socket
    # on its next turn). Counted by id, not in total: another test's client
    # may close meanwhile, and this test's own client may open a second
    # connection (its last command is then CLIENT LIST: "client" before Redis 7).
    deadline = asyncio.get_running_loop().time() + 5.0
    while True:
        opened = [
            client
            for client in await redis_client.client_list()
            if client["id"] not in before and client.get("cmd") not in ("client|list", "client")
        ]
        if not opened:
            break
        assert asyncio.get_running_loop().time() < deadline, f"connections left open: {opened}"
        await asyncio.sleep(0.05)


async def test_close_stops_everything_and_may_be_called_twice(redis_url: str) -> None:
    ctx = await ServerContext.open(Settings.from_env(gc_interval=1.0), redis_url)
    assert "yrelay-fanout" in yrelay_tasks()
    await ctx.close()
    await ctx.close()
    assert yrelay_tasks() == []
