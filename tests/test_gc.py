"""GC against a real redis-server: fold before trim, trim to the lowest
tracked offset, eviction rules, crash points, dry runs, overlapping collectors."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcutil import append_all, append_at, dump_document, server_text, text_updates, track, tracked
from yrelay.gc import Collector, GcPolicy, Step
from yrelay.storage.append import append_one
from yrelay.storage.keys import dedup_key, meta_key, stream_key
from yrelay.storage.offsets import ZERO, StreamId
from yrelay.storage.reads import HistoryTrimmed
from yrelay.tracker.lag import document_status
from yrelay.yjs import crdt

POLICY = GcPolicy(relative_ms=10_000, absolute_ms=50_500)


class SimulatedCrash(Exception):
    """Raised at a checkpoint: the collector stops exactly there, as a killed process would."""


def crash_at(point: Step):
    async def checkpoint(step: Step) -> None:
        if step is point:
            raise SimulatedCrash(step.value)

    return checkpoint


async def stream_ids(redis, doc: str) -> list[StreamId]:
    return [StreamId.parse(entry_id.decode()) for entry_id, _ in await redis.xrange(stream_key(doc))]


async def test_trims_to_the_lowest_tracked_offset_after_folding(redis_client, store):
    updates, text = text_updates(10)
    ids = await append_all(store, "doc", updates)
    await track(redis_client, "doc", {"fast": ids[9], "slow": ids[3]})

    [report] = await Collector(redis_client, POLICY).collect(["doc"])

    assert (report.folded, report.trimmed, report.stream_length) == (4, 4, 6)
    assert await stream_ids(redis_client, "doc") == ids[4:]
    snapshot = await store.load_snapshot("doc")
    assert snapshot.offset == ids[3]
    assert crdt.text_of(_doc_of(snapshot.update)) == "w0 w1 w2 w3 "
    assert await server_text(store, "doc") == text
    assert await redis_client.hlen(dedup_key("doc")) == 6  # dedup fields leave with their entries
    with pytest.raises(HistoryTrimmed):  # a reader behind the trim is told, never skipped
        await store.read_page("doc", ids[2], 10)
    assert [entry.id for entry in await store.read_page("doc", ids[3], 10)] == ids[4:]


async def test_everyone_acked_leaves_an_empty_stream_and_the_whole_snapshot(redis_client, store):
    updates, text = text_updates(5)
    ids = await append_all(store, "doc", updates)
    await track(redis_client, "doc", {"a": ids[-1], "b": ids[-1]})

    [report] = await Collector(redis_client, POLICY).collect(["doc"])

    assert report.settled and report.stream_length == 0 and report.folded == 5
    assert await redis_client.xlen(stream_key("doc")) == 0
    snapshot = await store.load_snapshot("doc")
    assert snapshot.offset == ids[-1] and crdt.text_of(_doc_of(snapshot.update)) == text
    assert await redis_client.hlen(dedup_key("doc")) == 0


async def test_later_passes_fold_onto_the_previous_snapshot(redis_client, store):
    updates, text = text_updates(12)
    ids = await append_all(store, "doc", updates[:6])
    await track(redis_client, "doc", {"a": ids[-1]})
    collector = Collector(redis_client, POLICY)
    await collector.collect(["doc"])
    ids += await append_all(store, "doc", updates[6:])
    await track(redis_client, "doc", {"a": ids[-1]})
    [report] = await collector.collect(["doc"])
    assert report.folded == 6 and report.stream_length == 0
    assert crdt.text_of(_doc_of((await store.load_snapshot("doc")).update)) == text


async def test_an_entry_whose_dependencies_are_missing_is_never_folded_away(redis_client, store):
    updates, _ = text_updates(6)
    # Entry 2 is lost (as in a failover); 3..5 depend on it and cannot land
    # (stored as a server from before causal admission stored them).
    ids = await append_all(store, "doc", updates[:2] + updates[3:], unchecked=True)
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert report.blocked_at == str(ids[2]) and report.folded == 2
    assert await stream_ids(redis_client, "doc") == ids[2:]
    assert not report.settled
    status = await document_status(redis_client, "doc")  # what /ops/docs/{doc} shows an operator
    assert status.blocked_at == str(ids[2]) and status.blocked_since is not None
    # The missing update arrives (a client resends it): the next pass folds all.
    await append_all(store, "doc", [updates[2]], session="late")
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert report.blocked_at is None and report.stream_length == 0
    status = await document_status(redis_client, "doc")
    assert status.blocked_at is None and status.blocked_since is None
    assert await server_text(store, "doc") == "w0 w1 w2 w3 w4 w5 "


@pytest.mark.parametrize("point", list(Step))
async def test_a_crash_between_any_two_steps_loses_nothing(redis_client, store, point):
    updates, text = text_updates(8)
    ids = await append_all(store, "doc", updates)
    await track(redis_client, "doc", {"reader": ids[5], "laggard": ids[4]})

    with pytest.raises(SimulatedCrash):
        await Collector(redis_client, POLICY, checkpoint=crash_at(point)).collect(["doc"])

    # Whatever the crash left: the document is whole, and every tracked
    # session can still read on from its offset.
    assert await server_text(store, "doc") == text
    for offset in (ids[4], ids[5]):
        assert [entry.id for entry in await store.read_page("doc", offset, 100)] == [i for i in ids if i > offset]
    # A new collection completes the job.
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert report.error is None and not report.conflict
    assert await stream_ids(redis_client, "doc") == ids[5:]
    assert await redis_client.hlen(dedup_key("doc")) == len(ids[5:])
    assert (await store.load_snapshot("doc")).offset == ids[4]
    assert await server_text(store, "doc") == text


async def test_dry_run_reports_and_changes_nothing(redis_client, store):
    now = await _redis_ms(redis_client)
    updates, _ = text_updates(30)
    ids = await append_at(redis_client, "doc", [now - (30 - i) * 1000 for i in range(30)], updates)
    await track(redis_client, "doc", {"leader": ids[-1], "lagging": ids[2], "ok": ids[25]})
    before = await dump_document(redis_client, "doc")

    [dry] = await Collector(redis_client, POLICY).collect(["doc"], dry_run=True)

    assert await dump_document(redis_client, "doc") == before
    assert (dry.eviction, dry.evicted, dry.evicted_sessions) == ("relative", 1, ["lagging"])
    assert (dry.folded, dry.trimmed, dry.stream_length) == (26, 26, 30)
    [real] = await Collector(redis_client, POLICY).collect(["doc"])
    assert (real.evicted, real.folded, real.trimmed) == (dry.evicted, dry.folded, dry.trimmed)
    assert await tracked(redis_client, "doc") == {"leader", "ok"}


async def test_relative_eviction_measures_from_entries_not_from_idle_time(redis_client, store):
    """A session that acked everything before a quiet spell is not "behind"
    when the next edit lands, however old its offset is."""
    now = await _redis_ms(redis_client)
    updates, _ = text_updates(2)
    ids = await append_at(redis_client, "doc", [now - 3_600_000, now], updates)
    await track(redis_client, "doc", {"leader": ids[1], "quiet": ids[0]})
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert report.evicted == 0 and await tracked(redis_client, "doc") == {"leader", "quiet"}


async def test_absolute_eviction_when_no_session_is_healthy(redis_client, store):
    now = await _redis_ms(redis_client)
    updates, text = text_updates(5)
    ids = await append_at(redis_client, "doc", [now - (60 + i) * 1000 for i in range(5, 0, -1)], updates)
    # Both lack entries older than the absolute threshold (50.5 s).
    await track(redis_client, "doc", {"a": ids[1], "b": ids[2]})
    [report] = await Collector(redis_client, POLICY).collect(["doc"])
    assert (report.eviction, report.evicted) == ("absolute", 2)
    assert await tracked(redis_client, "doc") == set()
    assert report.stream_length == 0 and await server_text(store, "doc") == text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ages=st.lists(st.integers(0, 120), min_size=1, max_size=25, unique=True),
    picks=st.lists(st.integers(0, 100), min_size=1, max_size=6),
)
async def test_eviction_follows_the_rules(redis_client, store, ages, picks):
    """The Lua rule against a plain Python model of it, on random histories
    (entries on a one-second grid, thresholds off the grid: no ties with the clock)."""
    doc = f"prop-{next(_counter)}"
    now = await _redis_ms(redis_client)
    times = sorted(now - age * 1000 for age in ages)
    ids = await append_at(redis_client, doc, times, [crdt.EMPTY_UPDATE] * len(times))
    sessions = {f"s{i}": ids[pick % len(ids)] for i, pick in enumerate(picks)}
    await track(redis_client, doc, sessions)

    [report] = await Collector(redis_client, POLICY).collect([doc], dry_run=True)

    mode, expected = _model_evictions(ids, sessions, now, POLICY)
    assert report.eviction == mode
    assert set(report.evicted_sessions) == expected and report.evicted == len(expected)
    leader = max(sessions, key=lambda name: sessions[name])
    if mode == "relative":
        assert leader not in report.evicted_sessions


async def test_overlapping_collectors_never_lose_an_update(redis_client, store):
    """Appends, acks and two collectors at once, on the same documents."""
    docs = [f"d{i}" for i in range(4)]
    writers = {doc: text_updates(120, client_id=i + 1, word=doc) for i, doc in enumerate(docs)}
    policy = GcPolicy(relative_ms=5, absolute_ms=50, max_fold_entries=7)
    stop = asyncio.Event()

    async def write(doc: str) -> None:
        updates, _ = writers[doc]
        for clock, update in enumerate(updates):
            entry_id, _ = await append_one(store, doc, "writer", clock, update)
            await track(redis_client, doc, {"writer": StreamId.parse(entry_id)})
            await asyncio.sleep(0)

    async def collect() -> int:
        collector, passes = Collector(redis_client, policy), 0
        while not stop.is_set():
            await collector.collect(docs)
            passes += 1
            await asyncio.sleep(0)
        return passes

    collectors = [asyncio.create_task(collect()) for _ in range(2)]
    await asyncio.gather(*(write(doc) for doc in docs))
    stop.set()
    assert all(passes > 1 for passes in await asyncio.gather(*collectors))
    await Collector(redis_client, policy).collect(docs)
    for doc in docs:
        updates, text = writers[doc]
        ydoc, _ = await store.load_document(doc)
        assert crdt.text_of(ydoc) == text
        assert all(crdt.contains(ydoc, update) for update in updates)
        assert await redis_client.xlen(stream_key(doc)) == 0


# ---------------------------------------------------------------- helpers

_counter = itertools.count()


def _doc_of(update: bytes) -> crdt.Doc:
    doc = crdt.new_doc()
    crdt.apply_update(doc, update)
    return doc


async def _redis_ms(redis) -> int:
    seconds, micros = await redis.time()
    return seconds * 1000 + micros // 1000


def _model_evictions(
    ids: list[StreamId], sessions: dict[str, StreamId], now: int, policy: GcPolicy
) -> tuple[str, set[str]]:
    def cutoff(t_ms: int) -> StreamId | None:
        older = [entry for entry in ids if entry.ms <= t_ms]
        return older[-1] if older else None

    leader = max(sessions.values())
    absolute = cutoff(now - policy.absolute_ms)
    if absolute is not None and leader < absolute:
        mode, cut = "absolute", absolute
    else:
        mode, cut = "relative", cutoff(leader.ms - policy.relative_ms)
    return mode, {name for name, offset in sessions.items() if cut is not None and offset < cut}


async def test_meta_records_gc_statistics(redis_client, store):
    updates, _ = text_updates(3)
    ids = await append_all(store, "doc", updates)
    await track(redis_client, "doc", {"a": ids[-1]})
    await Collector(redis_client, POLICY).collect(["doc"])
    meta = await redis_client.hgetall(meta_key("doc"))
    assert int(meta[b"gc_folded"]) == 3 and int(meta[b"gc_trimmed"]) == 3 and int(meta[b"gc_at"]) > 0
    assert StreamId.parse(meta[b"trimmed_through"].decode()) == ids[-1]
    assert ZERO < ids[-1]


async def test_a_long_stream_is_read_and_trimmed_in_pieces_and_loses_nothing(redis_client, store):
    """More entries than a read page and several trim chunks (each one short
    for the event loop and for Redis): the fold, the trim, the dedup fields
    and the drift digest come out as one big step would leave them."""
    from yrelay.gc.collector import READ_PAGE, TRIM_CHUNK
    from yrelay.reconciliation.digest import digest_of
    from yrelay.reconciliation.stream_digest import StreamDigests

    count = 2 * READ_PAGE + 3 * TRIM_CHUNK + 17
    updates, text = text_updates(count)
    ids = await append_all(store, "doc", updates)
    kept = 2 * READ_PAGE + 5  # a session holds everything up to ids[kept - 1]
    await track(redis_client, "doc", {"a": ids[kept - 1]})

    [report] = await Collector(redis_client, POLICY).collect(["doc"])

    assert (report.folded, report.trimmed, report.stream_length) == (kept, kept, count - kept)
    assert await stream_ids(redis_client, "doc") == ids[kept:]
    assert await redis_client.hlen(dedup_key("doc")) == count - kept
    snapshot = await store.load_snapshot("doc")
    assert snapshot.offset == ids[kept - 1]
    assert crdt.text_of(_doc_of(snapshot.update)) == "".join(f"w{i} " for i in range(kept))
    assert await server_text(store, "doc") == text
    digests = StreamDigests(redis_client)
    assert not (await digests.recompute("doc", fix=False)).wrong
    window = await digests.window("doc", ids[kept - 1], ids[-1])
    assert window is not None and window.digest == digest_of([str(i) for i in ids[kept:]])


async def test_a_page_that_fails_to_read_costs_only_its_document_this_pass(redis_client, store, monkeypatch):
    """The pages after the first are read one by one: a Redis error there is
    that document's error in the report (it waits for the next pass), not
    the whole batch's."""
    import redis.exceptions

    from yrelay.gc.collector import READ_PAGE

    long_updates, _ = text_updates(READ_PAGE + 10, client_id=1)
    short_updates, short_text = text_updates(3, client_id=2)
    long_ids = await append_all(store, "long", long_updates)
    short_ids = await append_all(store, "short", short_updates)
    await track(redis_client, "long", {"a": long_ids[-1]})
    await track(redis_client, "short", {"a": short_ids[-1]})
    real = redis_client.xrange

    async def failing(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == stream_key("long"):
            raise redis.exceptions.ConnectionError("lost while reading a page")
        return await real(name, *args, **kwargs)

    monkeypatch.setattr(redis_client, "xrange", failing)
    long_report, short_report = await Collector(redis_client, POLICY).collect(["long", "short"])

    assert long_report.error is not None and "lost while reading" in long_report.error
    assert long_report.folded == 0 and await redis_client.xlen(stream_key("long")) == len(long_ids)
    assert short_report.error is None and short_report.folded == 3
    assert crdt.text_of(_doc_of((await store.load_snapshot("short")).update)) == short_text
