"""The bytes of updates in flight are bounded per connection and per process."""

from __future__ import annotations

import asyncio

import pytest

from yrelay.app.inflight import ByteBudget, InflightUpdates


async def test_a_budget_waits_until_bytes_are_given_back():
    budget = ByteBudget(10)
    await budget.acquire(6)
    waiting = asyncio.create_task(budget.acquire(6))
    await asyncio.sleep(0.01)
    assert not waiting.done() and budget.held == 6
    budget.release(6)
    await asyncio.wait_for(waiting, 1)
    assert budget.held == 6


async def test_one_update_larger_than_the_budget_still_goes_through_alone():
    budget = ByteBudget(10)
    await asyncio.wait_for(budget.acquire(50), 1)
    second = asyncio.create_task(budget.acquire(1))
    await asyncio.sleep(0.01)
    assert not second.done()
    budget.release(50)
    await asyncio.wait_for(second, 1)


async def test_a_connection_is_held_by_its_own_cap_and_by_the_process():
    process = ByteBudget(100)
    first, second = InflightUpdates(10, 40, process), InflightUpdates(10, 40, process)
    await first.acquire(40)
    blocked_by_own_cap = asyncio.create_task(first.acquire(1))
    await second.acquire(40)
    await second.acquire(0)
    third = InflightUpdates(10, 40, process)
    await third.acquire(20)
    blocked_by_process = asyncio.create_task(third.acquire(20))
    await asyncio.sleep(0.01)
    assert not blocked_by_own_cap.done() and not blocked_by_process.done()
    assert process.held == 100
    second.release(40)
    await asyncio.wait_for(blocked_by_process, 1)
    first.release(40)
    await asyncio.wait_for(blocked_by_own_cap, 1)


async def test_a_cancelled_wait_takes_nothing():
    process = ByteBudget(10)
    inflight = InflightUpdates(1, 100, process)
    await inflight.acquire(10)
    waiting = asyncio.create_task(inflight.acquire(5))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    inflight.release(10)
    assert process.held == 0
