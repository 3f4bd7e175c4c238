"""What the background loops retry as "Redis was lost": Redis and OS errors,
and I/O on a connection torn down under a command, whoever raised it:
redis-py's cluster client writing to a connection whose writer is gone
(seen in CI: the token revocation loop crashed, tests/test_cluster.py's
kill -9), uvloop refusing a closed transport (issue 39) -- decided by what
the error says, never by which frame raised it. Any other error is a bug."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.exceptions
from redis.asyncio import Connection, Redis

from yrelay.auth.revocation import Revocations
from yrelay.tasks import lost_redis


async def redis_py_race() -> None:
    """The race itself: a command written to a connection whose writer
    another task's failure handling closed (redis-py 8's cluster client)."""
    connection = Connection()
    connection._writer = None
    await connection._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])


async def test_io_on_a_torn_down_connection_is_a_lost_redis_and_other_errors_are_not():
    with pytest.raises(AttributeError) as race:
        await redis_py_race()
    assert lost_redis(race.value)
    closed = RuntimeError(
        "unable to perform operation on <TCPTransport closed=True reading=False 0x5>; the handler is closed"
    )  # uvloop's words, from compiled code: no Python frame
    assert lost_redis(closed)
    with pytest.raises(AttributeError) as bug:
        None.fold  # type: ignore[attr-defined]  # noqa: B018 - a bug of ours
    assert not lost_redis(bug.value)
    assert lost_redis(redis.exceptions.ConnectionError("gone")) and lost_redis(ConnectionResetError())
    assert not lost_redis(RuntimeError("ours")) and not lost_redis(KeyError("c"))
    with pytest.raises(AttributeError) as ours:  # an I/O method on None, but in our own code: a bug
        None.close()  # type: ignore[attr-defined]
    assert not lost_redis(ours.value)
    # Redis refusing our arguments or our script is a bug too; a passing state of Redis is not
    assert not lost_redis(redis.exceptions.DataError("Invalid input of type: 'dict'"))
    assert not lost_redis(redis.exceptions.ResponseError("ERR user_script:12: attempt to compare nil"))
    assert lost_redis(redis.exceptions.ResponseError("BUSY Redis is busy running a script"))
    assert lost_redis(redis.exceptions.ReadOnlyError("You can't write against a read only replica."))
    assert lost_redis(
        redis.exceptions.ResponseError(
            "Error running script (call to f_d3): @user_script:78: "
            "@user_script: 78: -NOREPLICAS Not enough good replicas to write."
        )
    )
    # a cluster with no node for a slot (an election under way) is lost; a CROSSSLOT mistake is not
    assert lost_redis(redis.exceptions.SlotNotCoveredError('Slot "5" not covered by the cluster.'))
    assert not lost_redis(redis.exceptions.RedisClusterException("Keys in request don't hash to the same slot"))


async def test_the_revocation_loop_warns_and_goes_on_after_the_race(redis_url, monkeypatch, caplog):
    client = Redis.from_url(redis_url)
    revocations = Revocations(client, refresh_interval=0.05)
    calls = 0

    async def refresh() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await redis_py_race()
        await Revocations.refresh(revocations)

    monkeypatch.setattr(revocations, "refresh", refresh)
    caplog.set_level(logging.WARNING)
    revocations.start()
    try:
        async with asyncio.timeout(5):  # a crashed loop refreshes no more
            while calls < 3:
                await asyncio.sleep(0.05)
        await revocations.revoke("token-1")
    finally:
        await revocations.stop()
        await client.aclose()
    assert revocations._loop.crashes == 0
    assert [r.levelno for r in caplog.records if "revoked tokens" in r.getMessage()] == [logging.WARNING]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
