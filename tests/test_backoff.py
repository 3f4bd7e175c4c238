"""yrelay.backoff: the schedules of client retries and server reconnects."""

from __future__ import annotations

import pytest

from yrelay.backoff import REDIS_RECONNECT, Backoff, Reconnect


def test_redis_reconnects_double_from_a_tenth_of_a_second_to_five() -> None:
    assert [REDIS_RECONNECT.delay(n) for n in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


async def test_reconnect_grows_after_failures_and_starts_over_after_a_success(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("yrelay.backoff.asyncio.sleep", sleep)
    reconnect = Reconnect()
    for _ in range(3):
        await reconnect.wait()
    reconnect.succeeded()
    await reconnect.wait()
    assert slept == [0.1, 0.2, 0.4, 0.1]


async def test_an_outage_of_any_length_stays_at_the_maximum(monkeypatch: pytest.MonkeyPatch) -> None:
    async def sleep(seconds: float) -> None:
        pass

    monkeypatch.setattr("yrelay.backoff.asyncio.sleep", sleep)
    reconnect = Reconnect()
    for _ in range(5000):  # 2.0 ** 5000 would overflow a float
        await reconnect.wait()
    assert reconnect.delay == 5.0


def test_client_backoff_keeps_its_jitter() -> None:
    delays = {Backoff(base=1.0, max_delay=1.0, jitter=0.5).delay(0) for _ in range(50)}
    assert all(0.5 <= delay <= 1.0 for delay in delays) and len(delays) > 1
