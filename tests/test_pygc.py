"""The relay sets the process's young-generation GC threshold when it
starts (yrelay/observability/pygc.py; 50,000 by default), and leaves it alone with
``gc_young_threshold=0``; tuned, a quarter of the connections closing
starts a full collection."""

from __future__ import annotations

import gc

import pytest

from conftest import running_server


@pytest.fixture
def python_gc():
    from yrelay.observability import pygc

    saved, enabled = gc.get_threshold(), pygc.CHURN.enabled
    gc.set_threshold(700, saved[1], saved[2])
    yield
    gc.set_threshold(*saved)
    pygc.CHURN.enabled = enabled


async def test_a_running_relay_collects_the_young_generation_less_often(redis_url, python_gc):
    async with running_server(redis_url):  # the default
        assert gc.get_threshold()[0] == 50_000
    async with running_server(redis_url, gc_young_threshold=20_000):
        assert gc.get_threshold()[0] == 20_000


async def test_zero_leaves_the_process_settings_alone(redis_url, python_gc):
    async with running_server(redis_url, gc_young_threshold=0):
        assert gc.get_threshold()[0] == 700


def test_a_quarter_of_the_connections_closing_starts_a_full_collection(monkeypatch):
    from yrelay.observability import pygc

    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(1))
    untuned, tuned = pygc.Churn(), pygc.Churn()
    tuned.enabled = True
    for churn in (untuned, tuned):
        for _ in range(1000):
            churn.opened()
    for _ in range(300):
        untuned.closed_one()
    assert collections == []  # not tuned: Python's own rule
    for _ in range(199):
        tuned.closed_one()
    assert collections == []  # 199 closed, 801 open: less than a quarter
    tuned.closed_one()
    assert collections == [1]  # 200 closed, 800 open
