"""yrelay.tasks.BackgroundTask: one start/stop for every service loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from yrelay.tasks import BackgroundTask


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


async def test_a_crash_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def loop() -> None:
        raise ValueError("broken loop")

    task = BackgroundTask("yrelay-crashing", loop)
    with caplog.at_level(logging.ERROR, logger="yrelay.tasks"):
        task.start()
        await asyncio.sleep(0.01)
    assert task.crashes == 1 and not task.running
    assert "background task yrelay-crashing crashed" in caplog.text and "broken loop" in caplog.text
    await task.stop()


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
