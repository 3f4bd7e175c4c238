"""yrelay.tasks.BackgroundTask: one start/stop for every service loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from yrelay.backoff import Backoff
from yrelay.tasks import RESTARTS, BackgroundTask, spawn


async def test_start_and_stop_are_idempotent() -> None:
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1
        await asyncio.Event().wait()

    task = BackgroundTask("yrelay-test", loop)
    await task.stop()  # never started: nothing to do
    task.start()
    task.start()
    await asyncio.sleep(0)
    assert runs == 1 and task.running
    await task.stop()
    await task.stop()
    assert not task.running
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "yrelay-test"]


async def test_a_crashed_loop_is_logged_counted_and_restarted_after_a_backoff(caplog: pytest.LogCaptureFixture) -> None:
    runs = 0
    restarted = asyncio.Event()

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise ValueError("broken loop")
        restarted.set()
        await asyncio.Event().wait()

    before = RESTARTS["yrelay-crashing"]
    task = BackgroundTask("yrelay-crashing-1", loop, kind="yrelay-crashing")
    with caplog.at_level(logging.WARNING, logger="yrelay.tasks"):
        task.start()
        await asyncio.wait_for(restarted.wait(), 10)
    assert task.crashes == 2 and task.running and runs == 3
    assert RESTARTS["yrelay-crashing"] - before == 2
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("yrelay-crashing-1 crashed; restarting it in" in r.getMessage() for r in errors)
    assert errors[0].exc_info and "broken loop" in caplog.text  # a bug is logged with its traceback
    await task.stop()
    assert not task.running


async def test_a_lost_redis_is_a_warning_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:  # what uvloop's transport raises under redis-py in a failover
            raise RuntimeError(
                "unable to perform operation on <TCPTransport closed=True reading=False>; the handler is closed"
            )
        await asyncio.Event().wait()

    task = BackgroundTask("yrelay-lost", loop)
    with caplog.at_level(logging.WARNING, logger="yrelay.tasks"):
        task.start()
        while runs < 2:
            await asyncio.sleep(0.01)
    [record] = [r for r in caplog.records if "yrelay-lost" in r.getMessage()]
    assert record.levelno == logging.WARNING and not record.exc_info
    await task.stop()


async def test_a_stop_ends_a_loop_waiting_to_be_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("yrelay.tasks.BUG_RESTART", Backoff(base=3600, jitter=0))  # a restart an hour away

    async def loop() -> None:
        raise ValueError("always")

    task = BackgroundTask("yrelay-always", loop)
    task.start()
    while not task.crashes:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(task.stop(cancel=False), 60)  # not after the backoff
    assert not task.running


async def test_a_spawned_tasks_error_is_logged_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise KeyError("flush")

    with caplog.at_level(logging.WARNING, logger="yrelay.tasks"):
        task = spawn(fails(), name="yrelay-flush")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    [record] = [r for r in caplog.records if "yrelay-flush" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info


async def test_a_swallowed_cancel_is_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("yrelay.tasks.RECANCEL_AFTER", 0.05)
    swallowed = 0

    async def loop() -> None:  # what redis-py does to a cancel that lands while it connects
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    task = BackgroundTask("yrelay-stubborn", loop)
    task.start()
    await asyncio.sleep(0)
    await asyncio.wait_for(task.stop(), 5)
    assert swallowed == 1 and not task.running


async def test_a_loop_that_was_told_to_end_is_only_awaited() -> None:
    stopping = asyncio.Event()
    ended = False

    async def loop() -> None:
        nonlocal ended
        await stopping.wait()
        await asyncio.sleep(0.01)  # finishing its work, not cancelled
        ended = True

    task = BackgroundTask("yrelay-graceful", loop)
    task.start()
    stopping.set()
    await task.stop(cancel=False)
    assert ended
