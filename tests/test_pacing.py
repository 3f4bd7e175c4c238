"""The websocket pacing's arithmetic (yrelay/app/core/pacing.py), the answer
cache's bounds (answer_cache.py) and the frame walker (frame_walker.py);
what a flood does to a real server is tests/test_floods.py."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from test_floods import masked
from yrelay.app.answer_cache import MAX_KEY_BYTES, AnswerCache
from yrelay.app.core.pacing import Flooded, Pacer
from yrelay.config import Settings
from yrelay.transport.frame_walker import FrameWalker


async def held_until_flooded(bound: float) -> float:
    """Seconds a connection held back without a pause lasts before the hard bound."""
    pacer = Pacer(Settings(throttle_close_seconds=bound))
    started = time.monotonic()
    with pytest.raises(Flooded):
        while time.monotonic() - started < 20 * bound:
            await pacer.hold(bound / 20, "test")
    return time.monotonic() - started


@pytest.mark.parametrize("bound", [0.2, 0.6])
async def test_the_hard_bound_closes_whatever_its_setting(bound: float):
    """The held-back time is summed with a decay; the decay scales with the
    bound, so a bound above the old fixed 30 s time constant still closes
    (it never did: the sum levelled off below it)."""
    lasted = await held_until_flooded(bound)
    assert bound <= lasted < 3 * bound, lasted


async def test_a_pause_lets_the_held_time_decay():
    pacer = Pacer(Settings(throttle_close_seconds=0.3))
    await pacer.hold(0.2, "test")
    await asyncio.sleep(1.5)  # five time constants
    await pacer.hold(0.2, "test")  # would be 0.4 > 0.3 without the decay


async def test_answers_in_debt_make_the_next_request_wait():
    pacer = Pacer(Settings(answer_bytes_per_second=1000, answer_burst_bytes=1000, throttle_close_seconds=0))
    pacer.trust()
    await pacer.answer()
    pacer.charge(1300)  # 300 bytes in debt: 0.3 s at 1000 B/s
    started = time.monotonic()
    await pacer.answer()
    assert time.monotonic() - started >= 0.25


def test_the_answer_cache_counts_its_keys_and_keeps_no_long_state_vectors():
    cache: AnswerCache[str] = AnswerCache(max_bytes=10_000)
    cache.put("d", b"v" * (MAX_KEY_BYTES + 1), "1-0", "answer", 10)
    assert cache.get("d", b"v" * (MAX_KEY_BYTES + 1), "1-0") is None
    for index in range(10):  # 1 KiB keys: at most ~9 fit in 10,000 bytes
        cache.put("d", bytes([index]) * 1024, "1-0", "answer", 10)
    kept = sum(cache.get("d", bytes([index]) * 1024, "1-0") is not None for index in range(10))
    assert kept <= 9
    assert cache.get("d", bytes([9]) * 1024, "1-0") == "answer"  # the newest stays
    assert cache.get("d", bytes([9]) * 1024, "2-0") is None  # appended since: not served


def test_the_frame_walker_finds_every_frame_end_across_any_reads():
    rnd = random.Random(7)
    for _ in range(300):
        sizes = [rnd.choice([0, 1, 5, 125, 126, 200, 65535, 65536, 70000]) for _ in range(rnd.randint(1, 30))]
        stream = b"".join(masked(rnd.choice([0x1, 0x2, 0x9, 0xA]), b"x" * n) for n in sizes)
        cuts = sorted(rnd.sample(range(1, len(stream)), min(len(stream) - 1, rnd.randint(0, 20))))
        walker, ended = FrameWalker(), 0
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            read, position = stream[start:end], 0
            while position < len(read):
                position, count = walker.walk(read, position, rnd.randint(1, 5))
                ended += count
        assert ended == len(sizes)


async def test_subscribes_whose_catch_up_waits_for_acks_all_complete(redis_url):
    """A subscribe's answer (its catch-up up to ``synced``) counts against
    the answer rates; an earlier version also held further subscribes until
    4 answers were done, and a catch-up past ``max_unacked_entries`` waits
    for acks that sat unread behind those subscribes: the connection hung
    (found by a review). Five documents of 12 entries, 3 unacked at most."""
    from conftest import running_server
    from gcutil import text_updates
    from wsraw import RawPeer

    updates, _ = text_updates(12)
    async with running_server(redis_url, max_unacked_entries=3, page_size=2, resend_after=60, gc_interval=0) as url:
        writer = await RawPeer.connect(url)
        writer.quiet.add("deliver")
        docs = [f"catch-up/{index}" for index in range(5)]
        for doc in docs:
            await writer.send({"op": "subscribe", "doc": doc})
            await writer.expect("subscribed")
            for clock, update in enumerate(updates, 1):
                assert (await writer.update(doc, clock, update))["op"] == "appended"
        reader = await RawPeer.connect(url)
        for doc in docs:  # back to back, as a reconnecting client sends them
            await reader.send({"op": "subscribe", "doc": doc})
        synced: set[str] = set()
        while len(synced) < len(docs):
            frame = await reader.recv(timeout=10, wanted="synced")
            if frame["op"] == "deliver":
                await reader.send({"op": "ack", "doc": frame["doc"], "offset": frame["entries"][-1]["id"]})
            elif frame["op"] == "synced":
                synced.add(frame["doc"])
        await writer.close()
        await reader.close()
