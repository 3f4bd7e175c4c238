"""/metrics on a running server: who may scrape, and the counters moving by
the right amounts as clients append, deliver, ack, resend, resync, get
rejected and evicted, and as GC runs."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import running_server
from gcutil import FAST_GC, append_at, text_updates, track
from wsraw import RawPeer
from yrelay.app import create_app
from yrelay.config import Settings
from yrelay.storage.embedded import RedisProcess
from yrelay.storage.offsets import StreamId
from yrelay.storage.scripts import NAMES, source
from yrelay.yjs.awareness import AwarenessEntry, decode_update, encode_update

TOKEN = "ops-token-for-metrics"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DOC = "metered"


class Scrape:
    """One scrape, parsed: ``scrape["yrelay_appends_total", {"duplicate": "false"}]``."""

    def __init__(self, text: str):
        self.text = text
        self.samples = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def __getitem__(self, key: str | tuple[str, dict[str, str]]) -> float:
        name, labels = (key, {}) if isinstance(key, str) else key
        return self.samples[name, frozenset(labels.items())]

    def __sub__(self, before: Scrape) -> Delta:
        return Delta(self, before)


class Delta:
    def __init__(self, after: Scrape, before: Scrape):
        self.after, self.before = after, before

    def __getitem__(self, key: str | tuple[str, dict[str, str]]) -> float:
        return self.after[key] - self.before[key]


@contextlib.asynccontextmanager
async def served(redis_url: str, **overrides: object) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with running_server(redis_url, **{"ops_token": TOKEN, "gc_interval": 0, **overrides}) as url:
        base = url.replace("ws://", "http://").removesuffix("/ws")
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            yield url, http


async def scrape(http: httpx.AsyncClient, headers: dict[str, str] = AUTH) -> Scrape:
    response = await http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


async def scrape_until(http: httpx.AsyncClient, predicate, timeout: float = 20.0) -> Scrape:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate(result := await scrape(http)):
        assert asyncio.get_running_loop().time() < deadline, "metrics did not reach the expected values"
        await asyncio.sleep(0.05)
    return result


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def subscribe(peer: RawPeer, doc: str, offset: str | None = None) -> dict:
    await peer.send({"op": "subscribe", "doc": doc, "offset": offset})
    return await peer.recv()


async def receive_entries(peer: RawPeer, count: int) -> list[str]:
    """Ids of deliver frames until ``count`` entries arrived."""
    ids: list[str] = []
    while len(ids) < count:
        frame = await peer.expect("deliver")
        ids += [entry["id"] for entry in frame["entries"]]
    return ids


async def test_metrics_need_a_token_when_one_is_set(redis_url):
    async with served(redis_url, metrics_token="scraper-token") as (_, http):
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics")).headers["www-authenticate"] == "Bearer"
        assert (await http.get("/metrics", headers={"Authorization": "Bearer wrong"})).status_code == 403
        await scrape(http, AUTH)  # the ops token works too
        await scrape(http, {"Authorization": "Bearer scraper-token"})
    async with served(redis_url, ops_token=None) as (_, http):
        await scrape(http, {})  # no token configured: loopback clients may scrape


async def test_without_a_token_only_loopback_clients_may_scrape():
    app = create_app(Settings(), "redis://unused")
    app.state.ctx = SimpleNamespace(settings=Settings())  # the check runs before anything touches Redis
    transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://yrelay") as http:
        response = await http.get("/metrics")
    assert response.status_code == 403 and "YRELAY_METRICS_TOKEN" in response.text


async def test_counters_move_with_appends_deliveries_acks_and_duplicates(redis_url):
    updates, _ = text_updates(3)
    async with served(redis_url) as (url, http):
        before = await scrape(http)
        writer, reader = await RawPeer.connect(url), await RawPeer.connect(url)
        assert (await subscribe(writer, DOC))["op"] == "subscribed"
        assert (await subscribe(reader, DOC))["op"] == "subscribed"
        during = await scrape(http)
        for clock, update in enumerate(updates):
            assert (await writer.update(DOC, clock, update))["op"] == "appended"
        assert (await writer.update(DOC, 0, updates[0]))["duplicate"] is True
        ids = await receive_entries(reader, 3)
        await reader.send({"op": "ack", "doc": DOC, "offset": ids[-1]})
        await reader.send({"op": "ping"})  # answered after the ack was handled
        await reader.expect("pong")
        after = await scrape(http)
        await writer.close()
        await reader.close()
        closed = await scrape_until(http, lambda s: s["yrelay_connections_open"] == before["yrelay_connections_open"])

    delta = after - before
    assert delta["yrelay_connections_total", {"resumed": "false"}] == 2
    assert (during - before)["yrelay_connections_open"] == 2
    assert (during - before)["yrelay_subscriptions_open"] == 2
    assert (during - before)["yrelay_documents_active"] == 1
    assert delta["yrelay_appends_total", {"duplicate": "false"}] == 3
    assert delta["yrelay_appends_total", {"duplicate": "true"}] == 1
    assert delta["yrelay_appended_bytes_total"] == sum(len(update) for update in updates) + len(updates[0])
    assert delta["yrelay_append_latency_seconds_count"] == 4
    assert delta["yrelay_deliveries_total"] == 3  # the reader's; a writer never gets its own entries
    assert delta["yrelay_delivered_bytes_total"] == sum(len(update) for update in updates)
    assert delta["yrelay_deliver_frames_total"] == delta["yrelay_delivery_lag_seconds_count"] >= 1
    assert delta["yrelay_acks_total"] == delta["yrelay_ack_lag_seconds_count"] == 1
    assert delta["yrelay_resends_total"] == 0
    assert after["yrelay_documents"] == 1 and after["yrelay_redis_up"] == 1
    assert after["yrelay_unacked_entries"] == 0
    assert (closed - before)["yrelay_connection_duration_seconds_count"] == 2
    assert closed["yrelay_subscriptions_open"] == 0
    assert after["process_resident_memory_bytes"] > 0 and "process_cpu_seconds_total" in after.text


async def test_resends_are_counted(redis_url):
    updates, _ = text_updates(2)
    async with served(redis_url, resend_after=0.2, resend_check_interval=0.05) as (url, http):
        writer, silent = await RawPeer.connect(url), await RawPeer.connect(url)
        await subscribe(writer, DOC)
        await subscribe(silent, DOC)
        before = await scrape(http)
        for clock, update in enumerate(updates):
            await writer.update(DOC, clock, update)
        first = await receive_entries(silent, 2)
        again = await receive_entries(silent, 2)  # never acked: sent again
        assert again == first
        await silent.close()  # no more resends
        after = await scrape(http)
    delta = after - before
    assert delta["yrelay_resends_total"] >= 1
    assert delta["yrelay_resent_entries_total"] >= 2
    assert delta["yrelay_deliveries_total"] >= 4


async def test_resyncs_and_rejected_frames_are_counted_by_reason(redis_url):
    async with served(redis_url) as (url, http):
        peer = await RawPeer.connect(url)
        before = await scrape(http)
        answer = await subscribe(peer, DOC, offset="99999999999999-0")  # past the stream's end
        assert answer["op"] == "resync_required" and answer["reason"] == "ahead"
        await peer.send("{not json")
        assert (await peer.expect("error"))["code"] == "malformed_frame"
        await peer.send({"op": "update", "doc": DOC, "clock": 1, "update": b64(b"\xff\xff\xff\xff")})
        assert (await peer.expect("error"))["code"] == "invalid_update"
        await peer.send({"op": "ack", "doc": "elsewhere", "offset": "1-0"})
        assert (await peer.expect("error"))["code"] == "not_subscribed"
        await peer.send({"op": "ping"})  # answered once the frames before it were handled
        await peer.expect("pong")
        after = await scrape(http)
    delta = after - before
    assert delta["yrelay_resyncs_total", {"reason": "ahead"}] == 1
    assert delta["yrelay_resyncs_total", {"reason": "trimmed"}] == 0
    assert delta["yrelay_rejected_frames_total", {"code": "malformed_frame"}] == 1
    assert delta["yrelay_rejected_frames_total", {"code": "invalid_update"}] == 1
    assert delta["yrelay_rejected_frames_total", {"code": "not_subscribed"}] == 1
    assert delta["yrelay_rejected_frames_total", {"code": "frame_too_large"}] == 0


async def test_operator_evictions_and_gc_runs_through_ops_are_counted(redis_url):
    updates, _ = text_updates(3)
    async with served(redis_url) as (url, http):
        writer, reader = await RawPeer.connect(url), await RawPeer.connect(url)
        await subscribe(writer, DOC)
        await subscribe(reader, DOC)
        for clock, update in enumerate(updates):
            await writer.update(DOC, clock, update)
        await receive_entries(reader, 3)  # and never acks: it holds the stream back
        before = await scrape(http)
        response = await http.delete(f"/ops/docs/{DOC}/sessions/{reader.session}", headers=AUTH)
        assert response.status_code == 204
        report = (await http.post("/ops/gc", json={"doc": DOC}, headers=AUTH)).json()
        assert report["folded"] == report["trimmed"] == 3
        await http.post("/ops/gc", json={"dry_run": True}, headers=AUTH)  # changes nothing, not counted
        after = await scrape(http)
    delta = after - before
    assert delta["yrelay_evictions_total", {"mode": "operator"}] == 1
    assert delta["yrelay_gc_runs_total", {"trigger": "ops"}] == 1
    assert delta["yrelay_gc_pass_seconds_count", {"trigger": "ops"}] == 1
    assert delta["yrelay_gc_documents_total"] == 1
    assert delta["yrelay_gc_snapshots_total"] == 1
    assert delta["yrelay_gc_folded_entries_total"] == 3
    assert delta["yrelay_gc_trimmed_entries_total"] == 3
    assert delta["yrelay_gc_runs_total", {"trigger": "loop"}] == 0


async def test_the_gc_loop_counts_its_passes_and_evictions(redis_url, redis_client):
    seconds, micros = await redis_client.time()
    now = seconds * 1000 + micros // 1000
    updates, _ = text_updates(3)
    async with served(redis_url, **FAST_GC) as (_, http):
        before = await scrape(http)
        # History from the past: "behind" lacks an entry 5 s older than the leader's: relative eviction.
        ids = await append_at(redis_client, "old", [now - 10_000, now - 6_000, now - 5_000], updates)
        await track(redis_client, "old", {"leader": ids[2], "behind": StreamId(ids[0].ms - 1, 0)})
        # The pass that trims is counted when it ends, a moment after its trim.
        after = await scrape_until(
            http,
            lambda s: (
                (s - before)["yrelay_gc_trimmed_entries_total"] >= 3
                and (s - before)["yrelay_gc_runs_total", {"trigger": "loop"}] >= 1
            ),
        )
    delta = after - before
    assert delta["yrelay_evictions_total", {"mode": "relative"}] == 1
    assert delta["yrelay_gc_runs_total", {"trigger": "loop"}] >= 1
    assert delta["yrelay_gc_pass_seconds_count", {"trigger": "loop"}] >= 1
    assert after["yrelay_gc_last_pass_timestamp_seconds"] > 0
    assert delta["yrelay_gc_folded_entries_total"] == 3


async def test_presence_is_counted(redis_url):
    async with served(redis_url) as (url, http):
        alice, bob = await RawPeer.connect(url), await RawPeer.connect(url)
        await subscribe(alice, DOC)
        await subscribe(bob, DOC)
        before = await scrape(http)
        for sender, receiver, client_id in ((alice, bob, 1), (bob, alice, 2)):
            state = json.dumps({"user": {"name": f"client {client_id}"}})
            await sender.send(
                {"op": "awareness", "doc": DOC, "update": b64(encode_update([AwarenessEntry(client_id, 1, state)]))}
            )
            while client_id not in await awareness_clients(receiver):
                pass
        after = await scrape(http)
    delta = after - before
    assert after["yrelay_presence_members"] == 2
    assert delta["yrelay_presence_updates_total"] == 2
    assert delta["yrelay_presence_frames_relayed_total"] >= 1


async def awareness_clients(peer: RawPeer) -> set[int]:
    """The clientIDs in the next awareness frame."""
    frame = await peer.expect("awareness")
    return {entry.client_id for entry in decode_update(base64.b64decode(frame["update"]))}


async def test_readyz_checks_redis_and_every_script(redis_url, redis_client, tmp_path):
    async with served(redis_url) as (_, http):
        assert (await http.get("/readyz")).status_code == 200
        await redis_client.script_flush()  # as after a Redis restart without its script cache
        assert (await http.get("/readyz")).status_code == 200
        loaded = await redis_client.script_exists(*every_sha())
        assert all(loaded) and len(loaded) == len(NAMES) + 3  # every script in scripts.py, and presence's 3
    with RedisProcess(tmp_path / "redis") as private:
        async with running_server(private.url, gc_interval=0) as url:
            base = url.replace("ws://", "http://").removesuffix("/ws")
            async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                private.kill()
                response = await http.get("/readyz")
                assert response.status_code == 503 and response.json()["status"] == "unavailable"
                assert (await http.get("/healthz")).status_code == 200
                scraped = await scrape(http, {})
                assert scraped["yrelay_redis_up"] == 0


def every_sha() -> list[str]:
    """The SHA1 of every script the server runs (the append and GC scripts, presence's)."""
    names = [*NAMES, "presence_put", "presence_forget", "presence_read"]
    return [hashlib.sha1(source(name).encode()).hexdigest() for name in names]


async def test_metrics_switched_off_answer_404_and_delivery_is_unchanged(redis_url):
    updates, _ = text_updates(1)
    async with served(redis_url, metrics=False) as (url, http):
        writer, reader = await RawPeer.connect(url), await RawPeer.connect(url)
        await subscribe(writer, DOC)
        await subscribe(reader, DOC)
        assert (await writer.update(DOC, 0, updates[0]))["op"] == "appended"
        assert len(await receive_entries(reader, 1)) == 1
        assert (await http.get("/metrics", headers=AUTH)).status_code == 404


def test_loop_metrics_expose_what_prometheus_clients_own_would() -> None:
    """The lock-free per-delivery metrics (yrelay/observability/loop_metrics.py) read the
    same at a scrape as prometheus_client's (but for its _created samples)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from yrelay.observability.loop_metrics import LoopMetrics

    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their_histogram = Histogram("x_seconds", "d", buckets=(0.001, 0.01, 1.0), registry=theirs)
    their_counter = Counter("x_frames", "e", registry=theirs)
    loop = LoopMetrics(ours)
    our_histogram, our_counter = loop.histogram("x_seconds", "d", (0.001, 0.01, 1.0)), loop.counter("x_frames", "e")
    for value in (0.0005, 0.001, 0.002, 0.01, 0.5, 3.0):  # bounds are inclusive ("le")
        their_histogram.observe(value)
        our_histogram.observe(value)
        their_counter.inc(2)
        our_counter.inc(2)
    expected = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
    assert generate_latest(ours).decode().splitlines() == expected
