"""Each limit: over it, the documented error and nothing stored; the
connection (or the others) unaffected; under it, fine."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import websockets

from conftest import FAST_BACKOFF, eventually, running_server
from test_validation import good_update
from wsraw import RawPeer
from yrelay.app.limits import AddressCounts, Admission, DeliveryBudget, SessionRates
from yrelay.client import YrelayClient
from yrelay.transport.buckets import TokenBucket
from yrelay.yjs import crdt


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def update_from(client_id: int, text: str) -> bytes:
    doc = crdt.new_doc(client_id)
    crdt.insert_text(doc, 0, text)
    return crdt.encode_state(doc)


async def refused(url: str) -> tuple[dict, int]:
    """Connect, send hello, and return the error frame and the close code."""
    ws = await websockets.connect(url)
    try:
        await ws.send(json.dumps({"op": "hello"}))
    except websockets.ConnectionClosed:
        pass  # the refusal may have been sent and closed already
    frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    return frame, ws.close_code


# ------------------------------------------------------------------ the arithmetic


def test_token_bucket_allows_the_burst_then_the_rate():
    now = [0.0]
    bucket = TokenBucket(rate=10, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.retry_after_ms() == 100
    now[0] += 0.1
    assert bucket.take() and not bucket.take()
    assert TokenBucket(rate=0, burst=0).take()  # 0: unlimited


def test_admission_spreads_the_refused_over_future_slots():
    now = [0.0]
    admission = Admission(rate=10, burst=2, clock=lambda: now[0])
    assert admission.admit() is None and admission.admit() is None
    waits = [admission.admit() for _ in range(20)]
    assert all(wait is not None and wait > 0 for wait in waits)
    # the k-th refused client is sent about k/rate seconds out, not all to the same moment
    assert waits[-1] >= 1900 and waits[0] <= 300
    assert max(waits) <= Admission.MAX_WAIT * 1000 + 100


def test_address_counts_and_session_buckets_are_released():
    counts = AddressCounts(limit=2)
    assert counts.open("a") and counts.open("a") and not counts.open("a") and counts.open("b")
    counts.close("a")
    assert counts.open("a")
    for address in ("a", "a", "b"):
        counts.close(address)
    assert counts.counts == {}
    rates = SessionRates(rate=1, burst=1)
    first, second = rates.acquire("s"), rates.acquire("s")
    assert first is second  # one bucket per session, whatever its connections
    rates.release("s")
    rates.release("s")
    assert len(rates) == 0


def test_delivery_budget_wakes_waiters_when_acks_free_room():
    budget = DeliveryBudget(limit=5)
    woken = []
    budget.adjust(5)
    assert budget.spent
    budget.wait(1, lambda: woken.append(1))
    budget.adjust(-1)
    assert woken == [1] and not budget.spent


# ------------------------------------------------------------------ served


async def test_connections_per_address(redis_url):
    async with running_server(redis_url, max_connections_per_address=3) as url:
        peers = [await RawPeer.connect(url) for _ in range(3)]
        frame, code = await refused(url)
        assert frame["op"] == "error" and frame["code"] == "too_many_connections", frame
        assert frame["retry_after_ms"] > 0 and code == 1008
        for peer in peers:  # the others are unaffected
            await peer.send({"op": "ping"})
            await peer.expect("pong")
        await peers[0].close()
        await asyncio.sleep(0.1)
        peers[0] = await RawPeer.connect(url)  # a slot is free again
        assert peers[0].session
        for peer in peers:
            await peer.close()


async def test_admission_rate_refuses_with_retry_after_and_clients_honour_it(redis_url):
    async with running_server(redis_url, admission_rate=1, admission_burst=1) as url:
        first = await RawPeer.connect(url)
        frame, code = await refused(url)
        assert frame["code"] == "overloaded" and code == 1013, frame
        assert 0 < frame["retry_after_ms"] <= 31_000
        # A client with a 50 ms reconnect backoff waits what the server says
        # instead: one or two refusals, not one every 50 ms.
        events: list[str] = []
        client = YrelayClient(url, backoff=FAST_BACKOFF, on_event=lambda event, data: events.append(event))
        await client.connect(timeout=30)
        assert events.count("disconnected") <= 3, events
        doc = await client.subscribe("admitted")
        crdt.insert_text(doc.ydoc, 0, "in")
        await client.wait_idle()
        await first.send({"op": "ping"})
        await first.expect("pong")
        await client.close()
        await first.close()


async def test_a_reconnect_storm_is_admitted_at_the_bounded_rate(redis_url):
    """40 clients at once against 20 admissions/s (burst 5): the refused are
    each given a later slot and come back then, instead of every 50 ms."""
    async with running_server(redis_url, admission_rate=20, admission_burst=5) as url:
        events: list[str] = []
        clients = [
            YrelayClient(
                url,
                backoff=FAST_BACKOFF,
                subscription_check_interval=None,
                on_event=lambda event, data: events.append(event),
            )
            for _ in range(40)
        ]
        await asyncio.gather(*(client.connect(timeout=60) for client in clients))
        refusals = events.count("disconnected")
        assert refusals >= 20, refusals  # the burst let a few in, the rest were told to wait
        assert refusals < 80, refusals  # ... and most came back once, in their slot
        docs = await asyncio.gather(*(client.subscribe("storm") for client in clients))
        crdt.insert_text(docs[0].ydoc, 0, "after the storm")
        await clients[0].wait_idle()
        await eventually(lambda: all(doc.text == "after the storm" for doc in docs), timeout=30)
        for client in clients:
            await client.close()


async def answers_to(peer: RawPeer, count: int, timeout: float = 30.0) -> dict[int, tuple[float, dict]]:
    """The next ``count`` answers (appended or error) by clock, with when each arrived."""
    loop = asyncio.get_running_loop()
    answers: dict[int, tuple[float, dict]] = {}
    while len(answers) < count:
        frame = await peer.recv(timeout)
        if frame["op"] in ("appended", "error"):
            answers[frame["clock"]] = (loop.time(), frame)
    return answers


async def test_over_the_session_rate_updates_wait_instead_of_being_refused(redis_url, redis_client):
    """Issue 30: a refused update turned every update of its Yjs client
    behind it into missing_dependency. Over the rate the connection is now
    read more slowly: every update is stored, none refused, and only the
    connection over its rate waits."""
    async with running_server(redis_url, updates_per_second=5, update_burst=5) as url:
        peer, other = await RawPeer.connect(url), await RawPeer.connect(url)
        for p in (peer, other):
            await p.send({"op": "subscribe", "doc": "r"})
            await p.expect("subscribed")
        started = asyncio.get_running_loop().time()
        for clock in range(1, 16):  # the burst of 5, then 10 at 5/s: about 2 s
            await peer.send({"op": "update", "doc": "r", "clock": clock, "update": b64(update_from(clock, "x"))})
        answers = await answers_to(peer, 15)
        assert all(frame["op"] == "appended" for _, frame in answers.values()), answers
        assert await redis_client.xlen("yrelay:{r}:stream") == 15
        # the rate held: 10 updates past the burst cannot have been read in much less than 2 s
        assert max(at for at, _ in answers.values()) - started >= 1.5
        # another session of the process is not held back meanwhile
        peer.quiet.add("deliver")
        slow = [
            peer.send({"op": "update", "doc": "r", "clock": clock, "update": b64(update_from(clock, "y"))})
            for clock in range(16, 26)
        ]
        for send in slow:
            await send
        other_answer = await other.update("r", 1, update_from(99, "other"))
        other_at = asyncio.get_running_loop().time()
        assert other_answer["op"] == "appended"
        later = await answers_to(peer, 10)
        assert max(at for at, _ in later.values()) > other_at  # the other's went in while this one waited
        assert all(frame["op"] == "appended" for _, frame in later.values())
        await peer.close()
        await other.close()


async def test_a_client_over_its_rate_is_slowed_and_loses_nothing(redis_url, make_client):
    async with running_server(redis_url, updates_per_second=20, update_burst=5) as url:
        writer, reader = await make_client(url), await make_client(url)
        wdoc, rdoc = await writer.subscribe("paced"), await reader.subscribe("paced")
        for index in range(40):
            crdt.insert_text(wdoc.ydoc, 0, f"<{index}>")
        await writer.wait_idle(timeout=60)
        assert not writer.errors, writer.errors  # slowed down, never refused
        await eventually(lambda: rdoc.text == wdoc.text, timeout=30)
        assert len(writer.acked) == 40


async def test_unacked_deliveries_are_capped_per_connection(redis_url):
    async with running_server(
        redis_url, max_unacked_per_connection=10, max_unacked_entries=1000, resend_after=60
    ) as url:  # no resends: what arrives is what the budget allows
        reader, writer = await RawPeer.connect(url), await RawPeer.connect(url)
        for doc in ("u1", "u2"):
            for p in (reader, writer):
                await p.send({"op": "subscribe", "doc": doc})
                await p.expect("subscribed")
        for clock in range(1, 41):
            doc = "u1" if clock % 2 else "u2"
            assert (await writer.update(doc, clock, update_from(clock, "y")))["op"] == "appended"

        async def drain() -> dict[str, list[str]]:
            got: dict[str, list[str]] = {"u1": [], "u2": []}
            while True:
                try:
                    frame = await reader.recv(timeout=0.8)
                except TimeoutError:
                    return got
                if frame["op"] == "deliver":
                    got[frame["doc"]] += [entry["id"] for entry in frame["entries"]]

        first = await drain()
        assert sum(len(ids) for ids in first.values()) == 10, first  # both documents share the budget
        received = {doc: list(ids) for doc, ids in first.items()}
        while sum(len(set(ids)) for ids in received.values()) < 40:  # acks free the budget, for either document
            for doc, ids in received.items():
                if ids:
                    await reader.send({"op": "ack", "doc": doc, "offset": max(ids, key=_id_key)})
            more = await drain()
            assert more["u1"] or more["u2"], received
            for doc, ids in more.items():
                received[doc] += ids
        assert len(set(received["u1"])) == len(set(received["u2"])) == 20
        await reader.close()
        await writer.close()


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


async def test_documents_per_connection(redis_url):
    async with running_server(redis_url, max_docs_per_connection=2) as url:
        peer = await RawPeer.connect(url)
        for doc in ("d1", "d2"):
            await peer.send({"op": "subscribe", "doc": doc})
            await peer.expect("subscribed")
        await peer.send({"op": "subscribe", "doc": "d3"})
        error = await peer.expect("error")
        assert error["code"] == "malformed_frame" and error["doc"] == "d3" and "2 documents" in error["message"]
        assert (await peer.update("d1", 1, good_update()))["op"] == "appended"
        await peer.close()


async def test_welcome_announces_the_limits_clients_act_on(server_url):
    async with websockets.connect(server_url) as ws:
        await ws.send(json.dumps({"op": "hello"}))
        limits = json.loads(await ws.recv())["limits"]
    assert {
        "max_update_bytes",
        "max_frame_bytes",
        "max_docs_per_connection",
        "updates_per_second",
        "update_burst",
        "max_connections_per_address",
    } <= set(limits)


async def test_a_compression_bomb_is_cut_off_and_the_server_keeps_serving(redis_url):
    async with running_server(redis_url, ws_compression=True) as url:  # off by default (issue 20)
        # 3 MB inflated (under ws_max_size, over max_frame_bytes): a plain error frame
        async with websockets.connect(url, compression="deflate", max_size=None) as ws:
            await ws.send(json.dumps({"op": "hello"}))
            await ws.recv()
            await ws.send("x" * 3_000_000)
            assert json.loads(await ws.recv())["code"] == "frame_too_large"
        # 200 MB of one letter deflates to ~200 KB: the server stops inflating
        # at ws_max_size and closes with 1009 (message too big)
        ws = await websockets.connect(url, compression="deflate", max_size=None)
        assert ws.protocol.extensions, "permessage-deflate was not negotiated"
        await ws.send(json.dumps({"op": "hello"}))
        await ws.recv()
        with pytest.raises(websockets.ConnectionClosed):
            await ws.send("y" * 200_000_000)
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        assert ws.close_code == 1009
        peer = await RawPeer.connect(url)
        await peer.send({"op": "ping"})
        await peer.expect("pong")
        await peer.close()


# ----------------------------------------------------------- per subject, across sockets and processes (issue 16)


async def hello_as(url: str, subject: str, perm: str = "write") -> RawPeer:
    """A fresh session (hello without a session id) of ``subject``."""
    from test_auth import token

    peer = RawPeer(await websockets.connect(url, max_size=None))
    await peer.send({"op": "hello", "token": token(["*"], perm, subject=subject)})
    peer.session = (await peer.expect("welcome"))["session"]
    return peer


async def subscribed(peer: RawPeer, doc: str) -> dict:
    await peer.send({"op": "subscribe", "doc": doc})
    return await peer.recv()


async def test_the_update_rate_holds_per_subject_across_sockets_and_processes(redis_url, redis_client):
    """Issue 16: every hello without a session id got a fresh allowance.
    Now one user's sockets on two processes share one bucket in Redis, and
    over it they wait (issue 30) while another user is not held back."""
    from test_auth import AUTH

    limits = {**AUTH, "subject_updates_per_second": 2, "subject_update_burst": 10}
    async with running_server(redis_url, **limits) as one, running_server(redis_url, **limits) as two:
        peers = [await hello_as(url, "alice") for url in (one, two, one, two)]
        for peer in peers:
            assert (await subscribed(peer, "s"))["op"] == "subscribed"
            peer.quiet.add("deliver")
        loop = asyncio.get_running_loop()
        started = loop.time()
        for index, peer in enumerate(peers):  # 4 sockets x 5 updates, 2 processes, 4 sessions
            for clock in range(1, 6):
                await peer.send(
                    {"op": "update", "doc": "s", "clock": clock, "update": b64(update_from(index * 10 + clock, "x"))}
                )
        bob = await hello_as(two, "bob")  # another user is not held back
        assert (await subscribed(bob, "s"))["op"] == "subscribed"
        assert (await bob.update("s", 1, update_from(99, "bob")))["op"] == "appended"
        bob_at = loop.time()
        answers = [await answers_to(peer, 5) for peer in peers]
        frames = [frame for per_peer in answers for _, frame in per_peer.values()]
        assert all(frame["op"] == "appended" for frame in frames), frames
        assert await redis_client.xlen("yrelay:{s}:stream") == 21
        last = max(at for per_peer in answers for at, _ in per_peer.values())
        assert last - started >= 3.0  # 10 past the burst at 2/s, whichever process took them
        assert last > bob_at


async def test_live_subscriptions_are_capped_per_subject_across_processes(redis_url):
    """Issue 16: 10,000 documents x 256 sockets per address (~6 KiB each).
    Now a subject's live subscriptions are counted across processes."""
    from test_auth import AUTH

    limits = {**AUTH, "max_subscriptions_per_subject": 3}
    async with running_server(redis_url, **limits) as one, running_server(redis_url, **limits) as two:
        first, second = await hello_as(one, "alice", "read"), await hello_as(two, "alice", "read")
        assert (await subscribed(first, "a"))["op"] == "subscribed"
        assert (await subscribed(first, "b"))["op"] == "subscribed"
        assert (await subscribed(second, "c"))["op"] == "subscribed"
        assert (await subscribed(first, "a"))["op"] == "subscribed"  # subscribing again holds no more
        refused = await subscribed(second, "d")
        assert refused["op"] == "error" and refused["code"] == "too_many_subscriptions", refused
        assert refused["doc"] == "d"
        await first.send({"op": "ping"})  # the refused subscribe left nothing behind on that socket
        other = await hello_as(one, "bob", "read")
        assert (await subscribed(other, "d"))["op"] == "subscribed"  # another user has their own count
        await first.send({"op": "unsubscribe", "doc": "b"})
        await first.expect("pong")
        await first.expect("unsubscribed")
        await eventually_subscribed(second, "d")
        await first.close()  # a closed socket gives its subscriptions back
        await eventually_subscribed(second, "e")


async def eventually_subscribed(peer: RawPeer, doc: str, timeout: float = 5.0) -> None:
    """Subscribe, retrying while the subject's count (written on the next loop turn) has not dropped yet."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (answer := await subscribed(peer, doc))["op"] != "subscribed":
        assert answer["code"] == "too_many_subscriptions", answer
        assert asyncio.get_running_loop().time() < deadline, answer
        await asyncio.sleep(0.05)


async def test_a_crashed_process_cannot_hold_a_subjects_subscriptions_for_ever(redis_url, tmp_path):
    from test_auth import SECRET
    from yrelay_tools.testing.processes import ServerProcess

    env = {
        "YRELAY_INSECURE_NO_AUTH": "0",
        "YRELAY_AUTH_SECRET": SECRET,
        "YRELAY_MAX_SUBSCRIPTIONS_PER_SUBJECT": "2",
        "YRELAY_SUBSCRIPTION_LEASE": "1.5",
    }
    doomed = ServerProcess(redis_url, tmp_path, env=env).start()
    try:
        held = await hello_as(doomed.ws_url, "alice", "read")
        for doc in ("a", "b"):
            assert (await subscribed(held, doc))["op"] == "subscribed"
        async with running_server(
            redis_url,
            insecure_no_auth=False,
            auth_secret=SECRET,
            max_subscriptions_per_subject=2,
            subscription_lease=1.5,
        ) as url:
            await asyncio.sleep(2)  # past one lease: the live process renewed it
            peer = await hello_as(url, "alice", "read")
            assert (await subscribed(peer, "c"))["code"] == "too_many_subscriptions"
            doomed.kill()  # no goodbye: its count stays in Redis until the lease lapses
            assert (await subscribed(peer, "c"))["code"] == "too_many_subscriptions"
            await asyncio.sleep(1.6)
            assert (await subscribed(peer, "c"))["op"] == "subscribed"
    finally:
        doomed.stop()


async def test_a_subject_bucket_is_taken_from_redis_in_chunks(redis_url):
    """The update path stays cheap: one Redis call per chunk (a tenth of a
    second of the rate), not per update, and the next chunk is fetched
    before the current one runs out. Once Redis refuses, the takes that
    follow are refused here, without asking Redis again and again.

    The refusals are those of a subject whose bucket stays empty for
    seconds: another process of the subject booked a debt of 10 s of its
    rate. Refused right at the limit instead (an empty bucket refilling at
    1000/s), every call is granted what refilled since the previous one, so
    the count of calls follows how long each round trip took: 61 on a busy
    machine (issue 31), not a figure of the design."""
    from redis.asyncio import Redis

    from yrelay.app.quotas import SubjectQuotas
    from yrelay.config import Settings
    from yrelay.storage.keys import subject_bucket_key
    from yrelay.storage.scripts import Scripts

    redis = Redis.from_url(redis_url)
    settings = Settings(subject_updates_per_second=1000, subject_update_burst=1000)
    quotas = SubjectQuotas(redis, Scripts(redis), settings)
    subject = "s" * 32
    buckets = quotas.acquire(subject)
    assert buckets.updates.chunk == 100
    results = [await buckets.updates.take() for _ in range(1000)]
    assert results.count(None) >= 1000 - 100  # the burst (the last prefetch may still be on its way)
    assert quotas.bucket_calls <= 12, quotas.bucket_calls
    other = SubjectQuotas(redis, Scripts(redis), settings)  # another process of the subject
    await other.take(subject_bucket_key(subject, "updates"), 1000, 1000, 10_000, owe=True)
    refused = [await buckets.updates.take() for _ in range(300)]
    assert any(wait is not None and wait > 0 for wait in refused)
    assert refused[-1] is not None  # still refused at the end
    assert quotas.bucket_calls <= 20, quotas.bucket_calls  # a refused take does not ask Redis again and again
    await redis.aclose()


async def test_without_auth_the_subject_is_the_client_address(redis_url):
    """Development servers have no subjects: fresh sessions from one address
    share the per-subject limits instead of getting a fresh allowance each."""
    async with running_server(redis_url, max_subscriptions_per_subject=2) as url:
        first, second = await RawPeer.connect(url), await RawPeer.connect(url)
        assert first.session != second.session
        assert (await subscribed(first, "a"))["op"] == "subscribed"
        assert (await subscribed(second, "b"))["op"] == "subscribed"
        assert (await subscribed(second, "c"))["code"] == "too_many_subscriptions"
