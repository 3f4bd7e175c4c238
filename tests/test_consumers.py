"""Consumer groups against a real redis-server: shared documents, takeover
after a member dies, fencing of stale members, new documents, the state
helper, clean leaving."""

from __future__ import annotations

import asyncio
import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from conftest import eventually
from consumerutil import LEASE, Worker
from gcutil import append_all, text_updates
from test_metrics import scrape, scrape_until, served
from yrelay.consumers import AckResult, ConsumerGroup, DocumentStates
from yrelay.consumers.assignment import assign, changes
from yrelay.consumers.batch import Batch
from yrelay.consumers.handover import assignment_and_handovers, release
from yrelay.storage.append import append_one
from yrelay.storage.keys import group_assignment_key, group_handover_key
from yrelay.storage.reads import DocumentStore
from yrelay.storage.scripts import Scripts

#: A dead member's documents move within its lease, plus one beat of the
#: leader to notice and one of the others to read the new assignment (and
#: slack for a machine shared with other test runs).
TAKEOVER_BOUND = LEASE + 2 * LEASE / 3 + 2.0

#: The recipe of docs/consumers.md, run as a reader would run it.
SEARCH_INDEXER = Path(__file__).resolve().parent.parent / "docs" / "examples" / "search_indexer.py"


async def write(store: DocumentStore, docs: list[str], count: int, word: str = "w") -> dict[str, list[str]]:
    ids = {}
    for index, doc in enumerate(docs):
        updates, _ = text_updates(count, client_id=100 + index, word=word)
        # A session per word: the append script answers a known (session, clock) with its old id.
        ids[doc] = [str(entry_id) for entry_id in await append_all(store, doc, updates, session=f"writer-{word}")]
    return ids


def every(ids: dict[str, list[str]]) -> set[tuple[str, str]]:
    return {(doc, entry_id) for doc, entries in ids.items() for entry_id in entries}


def test_assignment_is_balanced_and_sticky():
    docs = [f"d{i}" for i in range(20)]
    three = assign(docs, ["a", "b", "c"], {})
    assert sorted(Counter(three.values()).values()) == [6, 7, 7]
    two = assign(docs, ["a", "b"], three)
    assert sorted(Counter(two.values()).values()) == [10, 10]
    # Only the dead member's documents moved.
    assert set(changes(two, three)) == {doc for doc, member in three.items() if member == "c"}
    four = assign(docs + ["d20"], ["a", "b", "c", "d"], two)
    assert max(Counter(four.values()).values()) - min(Counter(four.values()).values()) <= 1
    # Only what the two new members take (5 each), the new document among them.
    assert len(changes(four, two)) == 10


async def test_three_members_share_the_documents_and_process_each_entry_once(redis_client, store):
    await three_members_process_each_entry_once(redis_client, store, [f"doc-{i}" for i in range(12)])


async def three_members_process_each_entry_once(redis_client, store: DocumentStore, docs: list[str]) -> None:
    """Three members share 12 documents 4 each, and process every entry
    once, also those written after they shared them."""
    ids = await write(store, docs, 5)
    processed: Counter = Counter()
    workers = [await Worker(redis_client, f"m{i}", processed).start() for i in range(3)]
    await eventually(lambda: set(processed) == every(ids), timeout=15)
    await eventually(lambda: sorted(len(w.group.documents) for w in workers) == [4, 4, 4], timeout=10)
    more = await write(store, docs, 3, word="x")
    await eventually(lambda: set(processed) == every(ids) | every(more), timeout=15)
    owners = {doc: [w.group.member for w in workers if doc in w.group.documents] for doc in docs}
    assert all(len(members) == 1 for members in owners.values()), owners
    assert max(processed.values()) == 1  # nobody died: no entry twice
    assert sum(1 for w in workers if w.group.leads) == 1
    for worker in workers:
        await worker.stop()


async def test_a_killed_member_is_resumed_from_its_last_ack_within_the_lease(redis_client, store):
    docs = [f"doc-{i}" for i in range(6)]
    ids = await write(store, docs, 3)
    processed: Counter = Counter()
    a, b = [await Worker(redis_client, name, processed).start() for name in ("a", "b")]
    await eventually(lambda: set(processed) == every(ids) and len(a.group.documents) == 3, timeout=15)
    await eventually(lambda: len(a.acks) >= 3, timeout=5)
    # a now processes without acking, then dies: what it did not ack is redone by b.
    a.acking = False
    victims = a.group.documents
    unacked = await write(store, victims, 2, word="u")
    await eventually(lambda: every(unacked) <= set(processed), timeout=10)
    await a.kill()
    killed_at = asyncio.get_running_loop().time()
    await eventually(lambda: set(victims) <= set(b.group.documents), timeout=TAKEOVER_BOUND + 5)
    took = asyncio.get_running_loop().time() - killed_at
    print(f"\ntakeover after the kill: {took:.2f} s (lease {LEASE} s)")
    assert took <= TAKEOVER_BOUND, took
    after = await write(store, docs, 2, word="z")
    await eventually(lambda: set(processed) >= every(ids) | every(unacked) | every(after), timeout=15)
    # Nothing missed; duplicates are exactly what a processed and never acked.
    duplicates = {key for key, count in processed.items() if count > 1}
    assert duplicates == every(unacked)
    assert all(processed[key] == 2 for key in duplicates)
    # The redelivery count is exact for a killed member: b counted what a had read and not acked.
    assert b.group.reader.redelivered == len(duplicates)
    await eventually(lambda: b.group.reader.unreported_redelivered == 0, timeout=5)
    assert int(await b.group.redis.hget("yrelay:group:{idx}:meta", "redelivered")) == len(duplicates)
    await b.stop()


async def test_a_stale_members_ack_is_refused_after_a_takeover(redis_client, store):
    ids = await write(store, ["doc-1"], 3)
    processed: Counter = Counter()
    a = await Worker(redis_client, "a", processed).start()
    a.acking = False
    await eventually(lambda: set(processed) == every(ids), timeout=10)
    stale_batch = a.batches[-1]
    await a.kill()  # paused past its lease, as far as the group can tell
    b = await Worker(redis_client, "b", processed).start()
    await eventually(lambda: processed[("doc-1", ids["doc-1"][-1])] == 2, timeout=TAKEOVER_BOUND + 5)
    await eventually(lambda: AckResult.ACKED in b.acks, timeout=5)
    assert await stale_batch.ack() is AckResult.STALE
    # The refused member holds nothing any more; b's progress stands.
    assert a.group.documents == []
    offsets = await b.group.progress.offsets(["doc-1"])
    assert str(offsets["doc-1"]) == ids["doc-1"][-1]
    await b.stop()


async def steady_edits(
    store: DocumentStore, docs: list[str], appended: list[tuple[str, str]], stop: asyncio.Event
) -> None:
    """One small entry at a time, round robin, until ``stop`` is set (not
    cancelled: redis-py can swallow a cancel, and the loop would run on)."""
    clock = 0
    while not stop.is_set():
        doc = docs[clock % len(docs)]
        entry_id, _ = await append_one(store, doc, "steady", clock, b"consumers do not parse updates")
        appended.append((doc, str(entry_id)))
        clock += 1
        await asyncio.sleep(0.002)


# two-step: a member has 8 s (not the default two leases, 2.4 s) to finish the
# batches in flight on a document that moves: the default was met on a quiet
# machine, but with both cores busy an ack came later than that and the
# document moved at the deadline (2 duplicates, issue 31). The protocol is
# what this checks, not the default deadline's fit to a busy 2-core machine.
@pytest.mark.parametrize("handover", [8.0, 0.0], ids=["two-step", "at-once"])
async def test_a_fourth_member_joining_under_steady_edits_causes_no_duplicates(redis_client, store, handover):
    """A rebalance among live members hands each moving document over in two
    steps: 0 duplicates, 0 missed. ``handover=0`` (move at once, as before
    the two-step handover) shows the test can fail: its duplicates are counted."""
    docs = [f"doc-{i:02d}" for i in range(24)]
    await write(store, docs, 1)
    processed: Counter = Counter()
    options = {"ack_delay": LEASE / 2, "handover": handover}  # acks come later than a beat
    workers = [await Worker(redis_client, f"m{i}", processed, **options).start() for i in range(3)]
    appended: list[tuple[str, str]] = []
    stop = asyncio.Event()
    writer = asyncio.create_task(steady_edits(store, docs, appended, stop))
    try:
        await eventually(lambda: sorted(len(w.group.documents) for w in workers) == [8, 8, 8], timeout=10)
        await asyncio.sleep(LEASE)
        workers.append(await Worker(redis_client, "m3", processed, **options).start())
        await eventually(
            lambda: sorted(len(w.group.documents) for w in workers) == [6, 6, 6, 6],
            timeout=4 * LEASE + 5 + (handover or 0),
        )
        await asyncio.sleep(LEASE)
        stop.set()
        await writer
        await eventually(lambda: set(appended) <= set(processed), timeout=15)
        await asyncio.sleep(LEASE / 2)  # the last acks
        # Counted before the members leave: leaving drops their in-flight acks (processed again).
        duplicates = sum(count - 1 for count in processed.values())
        refused = sum(1 for w in workers for result in w.acks if result is not AckResult.ACKED)
        redelivered = sum(w.group.reader.redelivered for w in workers)
    finally:
        stop.set()
        for worker in workers:
            await worker.stop()
    print(
        f"\nhandover={handover}: {len(appended)} entries, {duplicates} duplicates, {redelivered} counted, "
        f"{refused} refused acks"
    )
    if handover == 0.0:
        assert duplicates > 0 and refused > 0  # what the two-step handover removes
        # Counted: every duplicate (and batches read and dropped unprocessed when the document moved).
        assert redelivered >= duplicates
    else:
        assert duplicates == 0 and refused == 0 and redelivered == 0
        assert int(await redis_client.hget("yrelay:group:{idx}:meta", "handovers")) >= 6


async def test_an_owner_never_sees_a_document_it_released_as_its_own_again(redis_client):
    """The view a member reads its share from (the assignment and the
    handovers) is one instant, also while owners release documents. Read in
    two round trips, a release landing between them showed the released
    document as its owner's with no handover: the owner took it back and
    claimed it with its old version before the target claimed, and both
    handed out the same entries (the fourth-member test failed 1 run in 5,
    issue 31)."""
    group, docs = "handover-view", [f"doc-{i:03d}" for i in range(300)]
    await redis_client.hset(group_assignment_key(group), mapping={doc: "owner|1" for doc in docs})
    await redis_client.hset(group_handover_key(group), mapping={doc: "target|2|9999999999999" for doc in docs})
    scripts = Scripts(redis_client)
    released = 0

    async def release_all() -> None:
        nonlocal released
        for doc in docs:
            assert await release(scripts, group, doc, "owner", 1)
            released += 1

    releasing = asyncio.create_task(release_all())
    views, mixed = 0, 0
    while not releasing.done():
        assigned, pending = await assignment_and_handovers(redis_client, group)
        taken_back = [doc for doc, owner in assigned.items() if owner.member == "owner" and doc not in pending]
        assert taken_back == [], f"view {views}: released, yet the owner's without a handover: {taken_back[:3]}"
        views += 1
        mixed += 0 < sum(owner.member == "target" for owner in assigned.values()) < len(docs)
    await releasing
    assert released == len(docs)
    # The views were read while releases went on (else this checked nothing).
    assert mixed > 10, (views, mixed)
    assigned, pending = await assignment_and_handovers(redis_client, group)
    assert pending == {} and {owner.member for owner in assigned.values()} == {"target"}


async def test_new_documents_are_picked_up(redis_client, store):
    await write(store, ["old"], 1)
    processed: Counter = Counter()
    a = await Worker(redis_client, "a", processed).start()
    await eventually(lambda: "old" in {doc for doc, _ in processed}, timeout=10)
    ids = await write(store, ["brand-new"], 2)
    await eventually(lambda: every(ids) <= set(processed), timeout=10)
    await a.stop()


async def test_a_prefix_limits_the_groups_documents(redis_client, store):
    await write(store, ["team-a/1", "team-b/1"], 1)
    processed: Counter = Counter()
    a = await Worker(redis_client, "a", processed, prefix="team-a/").start()
    await eventually(lambda: {doc for doc, _ in processed} == {"team-a/1"}, timeout=10)
    await asyncio.sleep(LEASE)
    assert a.group.documents == ["team-a/1"]
    await a.stop()


async def test_leaving_hands_documents_over_without_waiting_for_the_lease(redis_client, store):
    docs = [f"doc-{i}" for i in range(4)]
    await write(store, docs, 1)
    processed: Counter = Counter()
    a, b = [await Worker(redis_client, name, processed).start() for name in ("a", "b")]
    await eventually(lambda: len(a.group.documents) == 2 and len(b.group.documents) == 2, timeout=10)
    leaver, stayer = (a, b) if a.group.leads else (b, a)  # the leader leaves: the harder case
    await leaver.stop()
    left_at = asyncio.get_running_loop().time()
    await eventually(lambda: stayer.group.documents == docs, timeout=10)
    # One beat of the stayer (it takes the leader lease once it is free), not a lease.
    assert asyncio.get_running_loop().time() - left_at < LEASE
    await stayer.stop()


async def test_the_state_helper_keeps_each_documents_text(redis_client, store):
    updates, text = text_updates(6, client_id=7)
    await append_all(store, "doc-1", updates[:3])
    states = DocumentStates(redis_client)
    seen = asyncio.Event()
    async with ConsumerGroup(redis_client, "texts", member="only", lease=LEASE) as group:

        async def consume() -> None:
            async for batch in group.batches():
                await states.apply(batch)
                await batch.ack()
                if states.text("doc-1") == text:
                    seen.set()

        task = asyncio.create_task(consume())
        await append_all(store, "doc-1", updates[3:], session="writer-2")
        await asyncio.wait_for(seen.wait(), 10)
        task.cancel()
    assert states.text("doc-1") == text
    assert states.text("never-seen") == ""


async def test_the_state_helper_reloads_a_document_that_comes_back_under_a_new_version(redis_client, store):
    """While another member held the document it processed entries this
    copy never saw: the copy kept from the old assignment would miss them."""
    updates, text = text_updates(6, client_id=9)
    await append_all(store, "doc-1", updates[:2])
    states = DocumentStates(redis_client)
    snapshot, entries = await store.load_entries("doc-1")
    await states.apply(Batch("doc-1", entries, version=1, offset=entries[-1].id))
    assert states.text("doc-1") == "w0 w1 "
    await append_all(store, "doc-1", updates[2:], session="writer-2")  # another member's share
    _, entries = await store.load_entries("doc-1")
    await states.apply(Batch("doc-1", entries[-1:], version=2, offset=entries[-1].id))
    assert states.text("doc-1") == text
    await states.apply(Batch("doc-1", [], version=2, offset=entries[-1].id, deleted=True))
    assert states.text("doc-1") == "" and "doc-1" not in states.documents
    await states.apply(Batch("doc-1", entries[-1:], version=3, offset=entries[-1].id))
    assert states.text("doc-1") == text  # reloaded after the deletion batch dropped it
    states.keep_only({"other"})  # the member no longer holds doc-1
    assert not states.documents and not states.versions


async def test_metrics_show_each_groups_members_lag_rebalances_and_takeovers(redis_url, redis_client, store):
    docs = [f"doc-{i}" for i in range(4)]
    await write(store, docs, 2)
    processed: Counter = Counter()
    a, b = [await Worker(redis_client, name, processed).start() for name in ("a", "b")]
    a.acking = False  # a holds what it reads unacked: the group lags
    await eventually(lambda: len(a.group.documents) == 2 and len(b.group.documents) == 2, timeout=10)
    await write(store, docs, 1, word="late")
    async with served(redis_url) as (_, http):
        group = {"group": "idx"}
        result = await scrape_until(http, lambda s: s["yrelay_consumer_group_unacked_entries", group] >= 2)
        assert result["yrelay_consumer_group_members", group] == 2
        assert result["yrelay_consumer_group_lag_seconds", group] > 0
        assert result["yrelay_consumer_group_elections_total", group] == 1
        rebalances = result["yrelay_consumer_group_rebalances_total", group]
        assert rebalances >= 2  # a alone, then a and b
        await a.kill()
        result = await scrape_until(http, lambda s: s["yrelay_consumer_group_takeovers_total", group] == 2)
        assert result["yrelay_consumer_group_members", group] == 1
        assert result["yrelay_consumer_group_rebalances_total", group] == rebalances + 1
        assert (await scrape(http))["yrelay_consumer_group_unacked_entries", group] == 0
        # What a had read and never acked, b read again: counted.
        result = await scrape_until(http, lambda s: s["yrelay_consumer_group_redelivered_total", group] >= 2)
        assert result["yrelay_consumer_group_handovers_total", group] == 0
        assert await redis_client.hget("yrelay:group:{idx}:meta", "lag:a") is None  # the leader forgot it
    await b.stop()


async def test_the_search_indexer_recipe_indexes_every_documents_text(redis_url, redis_client, store):
    spec = importlib.util.spec_from_file_location("search_indexer", SEARCH_INDEXER)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)  # type: ignore[union-attr]
    for index, doc in enumerate(["notes/a", "notes/b"]):
        updates, _ = text_updates(3, client_id=50 + index, word=doc[-1])
        await append_all(store, doc, updates)
    task = asyncio.create_task(recipe.main(redis_url))
    await eventually(
        lambda: recipe.INDEX.get("a2") == {"notes/a"} and recipe.INDEX.get("b0") == {"notes/b"}, timeout=10
    )
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_cancel_that_a_redis_call_drops_still_ends_the_iteration(redis_client, monkeypatch):
    """redis-py sends under asyncio.wait_for, which on Python 3.11 drops a
    cancel that lands as the write completes: the caller's ``async for`` over
    ``batches()`` must end anyway, not run on for ever."""
    from yrelay.consumers import reader as reader_module

    async def swallowing_step(self):  # type: ignore[no-untyped-def]
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass  # what asyncio.wait_for does on 3.11 when its future completes as the cancel lands
        return []

    monkeypatch.setattr(reader_module.Reader, "_step", swallowing_step)
    member = await ConsumerGroup(redis_client, "cancel-lost", member="m1", lease=LEASE).__aenter__()
    try:

        async def consume() -> None:
            async for _ in member.batches():
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.02)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done and task.cancelled()
    finally:
        await member.leave()


async def test_a_member_reads_on_after_redis_forgot_its_scripts(redis_client, store):
    """The reader's fenced marks are packed by hand (no SCRIPT EXISTS round
    trip per batch); Redis restarted without its script cache refuses them
    NOSCRIPT: they run again once loaded, and nothing is lost or repeated."""
    docs = ["noscript-a", "noscript-b"]
    ids = await write(store, docs, 2)
    processed: Counter = Counter()
    worker = await Worker(redis_client, "m0", processed, group="noscript", prefix="noscript-").start()
    try:
        await eventually(lambda: set(processed) == every(ids), timeout=15)
        await redis_client.script_flush()
        more = await write(store, docs, 2, word="x")  # (the append script is loaded again by its caller)
        await eventually(lambda: set(processed) == every(ids) | every(more), timeout=15)
        assert max(processed.values()) == 1
        assert not worker.group.reader.refused
    finally:
        await worker.stop()


async def test_a_client_that_decodes_replies_or_speaks_resp3_is_refused_at_once(redis_url):
    """Entries hold binary updates and the reader parses RESP2 replies: such a
    client would hand out broken batches, so the group refuses it up front."""
    from redis.asyncio import Redis

    for options, words in (({"decode_responses": True}, "decode_responses=False"), ({"protocol": 3}, "RESP2")):
        client = Redis.from_url(redis_url, **options)
        with pytest.raises(ValueError, match=words):
            ConsumerGroup(client, "refused")
        await client.aclose()
