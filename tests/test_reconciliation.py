"""Set reconciliation: digests, the id sets (memory and Redis), the binary
messages and the protocol, which must find exactly A\\B and B\\A."""

from __future__ import annotations

import asyncio
import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yrelay.reconciliation import (
    Digest,
    DigestSet,
    Limits,
    MalformedMessage,
    MemoryIdSet,
    Reconciler,
    ReconciliationError,
    RedisIdSet,
    digest_of,
    item_hash,
    respond,
)
from yrelay.reconciliation.messages import REPLY_MODES, REQUEST_MODES, Encoder, Mode, decode, fingerprint
from yrelay.reconciliation.protocol import BRANCHING, LEAF
from yrelay.reconciliation.storage import WHOLE, separator

ALPHABET = "ab.-:/@Z09"
FAST = settings(max_examples=100, deadline=None)
WITH_REDIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_keys = itertools.count()


def make_ids(seed: int, count: int) -> list[str]:
    """``count`` distinct ids, deterministic in ``seed``: short strings over a
    small alphabet, so that many ids are prefixes of others or share long
    prefixes (the hard cases for range bounds)."""
    rng, found = random.Random(seed), set()
    while len(found) < count:
        found.add("".join(rng.choices(ALPHABET, k=rng.randint(1, 4 + len(found).bit_length() // 2))))
    return sorted(found, key=lambda _: rng.random())


def two_sets(seed: int, common: int, only_a: int, only_b: int) -> tuple[list[str], list[str]]:
    ids = make_ids(seed, common + only_a + only_b)
    return ids[: common + only_a], ids[:common] + ids[common + only_a :]


def set_pairs(largest: int) -> st.SearchStrategy[tuple[list[str], list[str]]]:
    """Two sets drawn cheaply: a seed and three sizes (small and large ones
    alike), the ids generated from them."""
    differences = st.integers(0, 20) | st.integers(0, 3_000)
    return st.builds(
        two_sets, st.integers(0, 2**32), st.integers(0, 1_000) | st.integers(0, largest), differences, differences
    )


async def reconcile(client, server, **options) -> Reconciler:
    """Run the protocol to the end, server answering through ``respond``."""
    limits = options.pop("limits", Limits())
    reconciler = Reconciler(client, await server.digest(), limits=limits, **options)
    request = await reconciler.start()
    while request is not None:
        request = await reconciler.step(await respond(server, request, limits))
    return reconciler


def assert_exact(reconciler: Reconciler, a: list[str], b: list[str]) -> None:
    assert reconciler.only_local == sorted(set(a) - set(b))
    assert reconciler.only_remote == sorted(set(b) - set(a))


async def redis_set(redis_client, ids: list[str]) -> RedisIdSet:
    number = next(_keys)
    store = RedisIdSet(redis_client, f"t:{{{number}}}:ids", f"t:{{{number}}}:digest")
    await store.add(ids)
    return store


# ------------------------------------------------------------------ digests


@given(st.lists(st.text(max_size=20), unique=True, max_size=50), st.randoms())
def test_digest_is_order_free_and_remove_undoes_add(items, rng):
    digest = Digest()
    for item in items:
        digest = digest.add(item)
    assert digest == digest_of(items) == digest_of(rng.sample(items, len(items)))
    for item in items:
        digest = digest.remove(item)
    assert digest == Digest()


def test_duplicates_are_counted_once():
    assert digest_of(["a", "b", "a", "a"]) == digest_of(["a", "b"]) == digest_of(iter(["b", "a", "b"]))
    assert digest_of({"a", "b"}) == Digest(2, item_hash("a") ^ item_hash("b"))
    ids = DigestSet(["a", "a"])
    assert ids.digest == Digest().add("a") and len(ids) == 1
    assert not ids.add("a") and ids.digest == Digest().add("a")
    assert ids.add("b") and not ids.remove("c") and ids.remove("a")
    assert ids.digest == Digest().add("b") and "b" in ids and list(ids) == ["b"]
    with pytest.raises(ValueError):
        Digest().remove("a")


def test_digest_wire_form_round_trips_and_rejects_junk():
    digest = digest_of(["x", "y"])
    wire = digest.to_wire()
    assert wire["count"] == 2 and len(wire["hash"]) == 32 and Digest.from_wire(wire) == digest
    junk = [
        None,
        [],
        "x",
        {},
        {"count": 1},
        {"count": 1, "hash": "0" * 32, "more": 1},
        {"count": True, "hash": "0" * 32},
        {"count": -1, "hash": "0" * 32},
        {"count": 2**60, "hash": "0" * 32},
        {"count": 1.0, "hash": "0" * 32},
        {"count": 1, "hash": "0" * 31},
        {"count": 1, "hash": "A" * 32},
        {"count": 1, "hash": 0},
        {"count": 1, "hash": " " + "0" * 31},
    ]
    for obj in junk:
        with pytest.raises(ValueError):
            Digest.from_wire(obj)


# ------------------------------------------------------------------ id sets


@given(st.text(ALPHABET, max_size=8), st.text(ALPHABET, max_size=8))
def test_separator_falls_between_neighbours(a, b):
    if a == b:
        return
    before, after = sorted((a, b))
    bound = separator(before, after)
    assert before < bound <= after and after.startswith(bound)


@FAST
@given(
    st.lists(st.tuples(st.booleans(), st.text(ALPHABET, min_size=1, max_size=4)), max_size=300),
    st.lists(st.text(ALPHABET, max_size=3), min_size=2, max_size=6),
)
async def test_memory_set_ranges_follow_changes(operations, cuts):
    ids, reference = MemoryIdSet(), set()
    for step, (adding, item) in enumerate(operations):
        if adding:
            ids.add([item, item])
            reference.add(item)
        else:
            ids.remove([item])
            reference.discard(item)
        if step % 50 == 0:  # reads in between: the prefix array is rebuilt from the change on
            assert (await ids.fingerprints([WHOLE]))[0] == digest_of(reference)
    bounds = sorted(set(cuts))
    spans = [
        (lower, upper)
        for lower, upper in zip(["", *bounds], [*bounds, None], strict=True)
        if upper is None or lower < upper
    ]
    expected = [
        sorted(item for item in reference if lower <= item and (upper is None or item < upper))
        for lower, upper in spans
    ]
    assert await ids.items(spans) == expected
    assert await ids.counts(spans) == list(map(len, expected))
    assert await ids.fingerprints(spans) == list(map(digest_of, expected))
    assert await ids.digest() == digest_of(reference) and len(ids) == len(reference)
    for span, parts, inside in zip(spans, await ids.parts(spans, 4), expected, strict=True):
        assert len(parts) == max(1, min(4, len(inside)))
        assert (parts[0].lower, parts[-1].upper) == span
        assert [p.lower for p in parts[1:]] == [p.upper for p in parts[:-1]]
        assert sum(p.digest.count for p in parts) == len(inside)


async def test_redis_set_answers_like_the_memory_set(redis_client):
    ids = make_ids(7, 3_000)
    memory, stored = MemoryIdSet(ids), await redis_set(redis_client, ids)
    spans = [WHOLE, ("", "a"), ("a", "a."), ("Z", None), ("b", "b")]
    for method in ("counts", "fingerprints", "items"):
        assert await getattr(stored, method)(spans) == await getattr(memory, method)(spans)
    assert await stored.parts(spans, BRANCHING) == await memory.parts(spans, BRANCHING)
    assert await stored.items(spans, limit=5) == await memory.items(spans, limit=5)
    assert await stored.digest() == await memory.digest()


async def test_redis_updates_change_the_digest_once_per_real_change(redis_client):
    stored = await redis_set(redis_client, ["a", "b"])
    assert await stored.add(["b", "c", "c", "d"]) == 2
    assert await stored.remove(["a", "a", "zz"]) == 1
    assert await stored.digest() == digest_of(["b", "c", "d"])
    assert await stored.remove(["b", "c", "d"]) == 3 and await stored.digest() == Digest()
    assert await stored.add(make_ids(3, 2_500)) == 2_500  # several script calls
    assert await stored.digest() == digest_of(make_ids(3, 2_500))


async def test_recompute_reports_and_fixes_a_corrupted_digest(redis_client):
    stored = await redis_set(redis_client, make_ids(5, 500))
    right = await stored.digest()
    assert await stored.recompute() == (right, right)
    await redis_client.hset(stored.digest_key, mapping={"count": 3, "hash": "f" * 32})
    wrong = Digest(3, int("f" * 32, 16))
    assert await stored.recompute(fix=False) == (wrong, right)
    assert await stored.digest() == wrong
    assert await stored.recompute() == (wrong, right)
    assert await stored.digest() == right
    await redis_client.zadd(stored.members_key, {"smuggled": 0})  # a member added behind the script's back
    stored_now, actual = await stored.recompute()
    assert stored_now == right and actual == digest_of([*make_ids(5, 500), "smuggled"]) == await stored.digest()


# ------------------------------------------------------------------ messages


bounds = st.lists(st.text(ALPHABET + "é€", min_size=1, max_size=6), unique=True, max_size=12).map(sorted)


@given(bounds, st.data())
def test_messages_round_trip(cuts, data):
    encoder, expected = Encoder(), []
    for lower, upper in zip(["", *cuts], [*cuts, None], strict=True):
        mode = data.draw(st.sampled_from([Mode.SKIP, Mode.FINGERPRINT, Mode.IDS]))
        if mode == Mode.FINGERPRINT:
            count, value = data.draw(st.integers(0, 2**40)), data.draw(st.integers(0, 2**128 - 1))
            encoder.fingerprint(lower, upper, count, value)
            expected.append((lower, upper, mode, count, fingerprint(value), []))
        elif mode == Mode.IDS:
            inside = data.draw(st.lists(st.text(ALPHABET + "é", max_size=6), unique=True, max_size=5))
            inside = sorted(item for item in (lower + item for item in inside) if upper is None or item < upper)
            encoder.ids(lower, upper, inside)
            expected.append((lower, upper, mode, 0, 0, inside))
    message = decode(encoder.finish_at(None), REPLY_MODES, 1_000)
    assert message.end is None
    assert [(e.lower, e.upper, e.mode, e.count, e.fingerprint, e.ids) for e in message.entries] == expected


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def sample_reply() -> bytes:
    encoder = Encoder()
    encoder.fingerprint("", "b", 7, 2**127 + 5)
    encoder.ids("c", "d", ["c", "c/x", "cc"])
    return encoder.finish_at(None)


async def test_truncated_and_hostile_messages_raise_malformed():
    reply = sample_reply()
    assert decode(reply, REPLY_MODES, 10).end is None
    for size in range(len(reply)):
        try:
            message = decode(reply[:size], REPLY_MODES, 10)
        except MalformedMessage:
            continue
        assert message.end is not None  # a cut between entries never claims to be complete
    skip_to = lambda bound: bytes([Mode.SKIP | (len(bound) + 1) << 2, 0]) + bound  # noqa: E731
    hostile = [
        b"",
        b"\x02" + reply[1:],  # empty, unknown version
        b"\x01" + b"\xff" * 10 + b"\x01",  # overlong varint
        b"\x01" + skip_to(b"b") + skip_to(b"a"),  # bounds decrease
        b"\x01" + skip_to(b"b") + skip_to(b"b"),  # bounds repeat
        b"\x01\x00\x00",  # an entry after +inf
        b"\x01" + skip_to(b"\xc3\x28"),  # invalid UTF-8
        bytes([1, Mode.SKIP | 2 << 2, 5, ord("a")]),  # shares more than the previous bound has
        bytes([1, Mode.IDS, 0xFF, 0xFF, 0xFF, 0x7F]),  # IDS claiming 268M ids in four bytes
        b"\x01" + skip_to(b"m") + bytes([Mode.IDS, 1, 1, 0, ord("a")]),  # an id below its range
        b"\x01" + skip_to(b"m") + bytes([Mode.IDS, 2, 1, 0, ord("x"), 0, 1]),  # ids not increasing
        b"\x01" + varint(Mode.SKIP | 2000 << 2) + b"\x00" + b"a" * 1999,  # a bound longer than MAX_ID_BYTES
    ]
    for message in hostile:
        with pytest.raises(MalformedMessage):
            decode(message, REPLY_MODES, 10)
        with pytest.raises(MalformedMessage):
            await respond(MemoryIdSet(["a", "m"]), message)
    with pytest.raises(MalformedMessage):  # LIST is a request mode
        decode(bytes([1, 3]), REPLY_MODES, 10)
    with pytest.raises(MalformedMessage):  # IDS is a reply mode
        decode(reply, REQUEST_MODES, 10)
    with pytest.raises(MalformedMessage):
        decode(reply, REPLY_MODES, 2)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=64))
async def test_garbage_never_escapes_as_another_error(prefix, garbage):
    server = MemoryIdSet(make_ids(1, 200))
    for message in (b"\x01" + garbage, b"\x01" + prefix + garbage, prefix):
        try:
            decode(message, REPLY_MODES, 100)
        except MalformedMessage:
            pass
        try:
            reply = await asyncio.wait_for(respond(server, message), 5)
        except MalformedMessage:
            continue
        decode(reply, REPLY_MODES, 1 << 20)  # whatever it answers is well formed


# ------------------------------------------------------------------ the protocol


@FAST
@given(set_pairs(100_000))
async def test_memory_peers_find_exactly_the_differences(pair):
    a, b = pair
    reconciler = await reconcile(MemoryIdSet(a), MemoryIdSet(b))
    assert_exact(reconciler, a, b)
    if set(a) == set(b):
        assert reconciler.round_trips == 0 and reconciler.bytes_sent == 0
    else:
        assert reconciler.round_trips <= 4


@WITH_REDIS
@given(set_pairs(20_000))
async def test_memory_client_and_redis_server_find_exactly_the_differences(redis_client, pair):
    a, b = pair
    reconciler = await reconcile(MemoryIdSet(a), await redis_set(redis_client, b))
    assert_exact(reconciler, a, b)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.text(max_size=5), unique=True, max_size=60), st.lists(st.text(max_size=5), unique=True, max_size=60))
async def test_any_unicode_ids(a, b):
    assert_exact(await reconcile(MemoryIdSet(a), MemoryIdSet(b)), a, b)


@pytest.mark.parametrize("only_client, only_server", [(1, 0), (0, 1), (500, 500), (0, 8_000), (30_000, 0)])
async def test_hundred_thousand_ids(only_client, only_server):
    a, b = two_sets(11, 100_000 - max(only_client, only_server), only_client, only_server)
    reconciler = await reconcile(MemoryIdSet(a), MemoryIdSet(b))
    assert_exact(reconciler, a, b)
    if only_client + only_server <= 1_000:
        assert reconciler.round_trips <= 3


async def test_hundred_thousand_ids_against_redis(redis_client):
    a, b = two_sets(12, 99_950, 20, 30)
    reconciler = await reconcile(MemoryIdSet(a), await redis_set(redis_client, b))
    assert_exact(reconciler, a, b)
    assert reconciler.round_trips <= 3


async def test_equal_sets_need_no_round_trip(redis_client):
    ids = make_ids(2, 10_000)
    reconciler = Reconciler(MemoryIdSet(ids), await (await redis_set(redis_client, ids)).digest())
    assert await reconciler.start() is None
    assert reconciler.only_local == reconciler.only_remote == [] and reconciler.round_trips == 0


async def test_one_difference_walks_down_one_range_per_message():
    a = make_ids(4, 40_000)
    reconciler = await reconcile(MemoryIdSet(a), MemoryIdSet(a[1:]))
    assert reconciler.only_local == [a[0]] and reconciler.round_trips <= 3
    assert reconciler.bytes_sent + reconciler.bytes_received < 4 * BRANCHING * 16 + LEAF * 16


async def test_an_empty_side_is_settled_without_fingerprints():
    ids = make_ids(6, 5_000)
    reconciler = await reconcile(MemoryIdSet(ids), MemoryIdSet())
    assert reconciler.only_local == sorted(ids) and reconciler.round_trips == 0
    reconciler = await reconcile(MemoryIdSet(), MemoryIdSet(ids))
    assert reconciler.only_remote == sorted(ids) and reconciler.round_trips == 1


# ------------------------------------------------------------------ limits and a hostile peer


@pytest.mark.parametrize("full_list_fraction", [0.0, math.inf])  # the full list; fingerprints only
async def test_small_limits_page_the_answers_and_still_finish(full_list_fraction):
    limits = Limits(max_request_bytes=1 << 16, max_request_ranges=64, max_reply_bytes=1 << 16)
    a, b = two_sets(8, 30_000, 3_000, 2_000)
    server = MemoryIdSet(b)
    reconciler = Reconciler(MemoryIdSet(a), await server.digest(), limits=limits, full_list_fraction=full_list_fraction)
    request = await reconciler.start()
    while request is not None:
        assert len(request) <= limits.max_request_bytes
        assert len(decode(request, REQUEST_MODES, 1 << 20).entries) <= limits.max_request_ranges
        reply = await respond(server, request, limits)
        assert len(reply) <= limits.max_reply_bytes
        request = await reconciler.step(reply)
    assert_exact(reconciler, a, b)
    assert reconciler.round_trips >= 3  # no single reply could hold the answer


async def test_server_rejects_requests_past_its_limits():
    limits = Limits(max_request_bytes=1 << 16, max_request_ranges=64, max_reply_bytes=1 << 16)
    server = MemoryIdSet(make_ids(9, 1_000))
    encoder = Encoder()
    for number in range(65):
        encoder.list_request(f"{number:03}", f"{number:03}~")
    with pytest.raises(MalformedMessage):
        await respond(server, encoder.finish(), limits)
    with pytest.raises(MalformedMessage):
        await respond(server, b"\x01" + bytes(1 << 16), limits)
    with pytest.raises(ValueError):
        Limits(max_reply_bytes=100)


async def test_client_rejects_a_reply_about_ranges_it_did_not_ask():
    a = make_ids(10, 5_000)
    reconciler = Reconciler(MemoryIdSet(a), digest_of(a[1:]))
    request = await reconciler.start()
    first = decode(request, REQUEST_MODES, 1 << 20).entries[0]
    encoder = Encoder()
    encoder.ids(first.lower, first.upper + "zz", [])  # reaches into the next range
    with pytest.raises(MalformedMessage):
        await reconciler.step(encoder.finish_at(None))


async def test_client_rejects_replies_without_progress_and_endless_servers():
    a = make_ids(13, 5_000)
    reconciler = Reconciler(MemoryIdSet(a), digest_of(a[1:]))
    await reconciler.start()
    with pytest.raises(MalformedMessage):
        await reconciler.step(Encoder().finish())
    stubborn = Reconciler(MemoryIdSet(a), digest_of(a[1:]), max_round_trips=5)
    await stubborn.start()
    with pytest.raises(ReconciliationError):
        for _ in range(10):  # a server that never answers anything: it reaches nothing each time
            await stubborn.step(Encoder().finish_at(" "))


async def test_a_set_changing_during_the_run_is_detected():
    a = make_ids(14, 5_000)
    server = MemoryIdSet(a[1:])
    reconciler = Reconciler(MemoryIdSet(a), await server.digest())
    request = await reconciler.start()
    server.add(["a-new-id"])
    with pytest.raises(ReconciliationError):
        while request is not None:
            request = await reconciler.step(await respond(server, request))
    with pytest.raises(RuntimeError):  # failed for good: no unchecked results
        _ = reconciler.only_local  # the property raises


async def test_state_is_checked():
    reconciler = Reconciler(MemoryIdSet(["a"]), Digest())
    with pytest.raises(RuntimeError):
        await reconciler.step(b"\x01")
    with pytest.raises(RuntimeError):
        _ = reconciler.only_local  # the property raises
    assert await reconciler.start() is None
    with pytest.raises(RuntimeError):
        await reconciler.start()
