"""The relay sets the process's young-generation GC threshold when it
starts (yrelay/pygc.py), and leaves it alone with ``gc_young_threshold=0``."""

from __future__ import annotations

import gc

import pytest
from conftest import running_server


@pytest.fixture
def python_gc():
    saved = gc.get_threshold()
    gc.set_threshold(700, saved[1], saved[2])
    yield
    gc.set_threshold(*saved)


async def test_a_running_relay_collects_the_young_generation_less_often(redis_url, python_gc):
    async with running_server(redis_url, gc_young_threshold=50_000):
        assert gc.get_threshold()[0] == 50_000


async def test_zero_leaves_the_process_settings_alone(redis_url, python_gc):
    async with running_server(redis_url, gc_young_threshold=0):
        assert gc.get_threshold()[0] == 700
