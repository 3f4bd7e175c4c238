"""The /ops endpoints on a running server: auth, figures on a known scenario,
dry runs that change nothing, eviction by hand."""

from __future__ import annotations

import httpx

from conftest import OPS_AUTH as AUTH
from conftest import running_server
from gcutil import append_at, dump_document, text_updates, track, tracked
from yrelay.storage.offsets import StreamId
from yrelay.yjs import crdt


async def _known_scenario(redis_client) -> list[StreamId]:
    """doc 'notes': 10 entries one second apart, ending 5 s ago; three sessions."""
    seconds, micros = await redis_client.time()
    now = seconds * 1000 + micros // 1000
    updates, _ = text_updates(10)
    ids = await append_at(redis_client, "notes", [now - 15_000 + i * 1000 for i in range(10)], updates)
    await track(redis_client, "notes", {"leader": ids[9], "middle": ids[6], "behind": ids[1]})
    return ids


async def test_auth_is_enforced(ops, redis_url):
    assert (await ops.get("/ops/docs")).status_code == 401
    assert (await ops.get("/ops/docs", headers={"Authorization": "Bearer wrong"})).status_code == 403
    assert (await ops.post("/ops/gc", json={}, headers={"Authorization": "Bearer wrong"})).status_code == 403
    assert (await ops.delete("/ops/docs/x/sessions/y")).status_code == 401
    assert (await ops.get("/ops/docs", headers=AUTH)).status_code == 200
    async with running_server(redis_url, gc_interval=0) as ws_url:  # no token configured: off
        base = ws_url.replace("ws://", "http://").removesuffix("/ws")
        async with httpx.AsyncClient(base_url=base) as client:
            response = await client.get("/ops/docs", headers=AUTH)
            assert response.status_code == 403 and "YRELAY_OPS_TOKEN" in response.text


async def test_endpoints_are_in_the_openapi_schema(ops):
    schema = (await ops.get("/openapi.json")).json()
    assert {"/ops/gc", "/ops/docs", "/ops/docs/{doc}", "/ops/docs/{doc}/sessions/{session}"} <= set(schema["paths"])
    assert schema["paths"]["/ops/gc"]["post"]["security"] == [{"HTTPBearer": []}]


async def test_document_figures(ops, redis_client):
    ids = await _known_scenario(redis_client)
    detail = (await ops.get("/ops/docs/notes", headers=AUTH)).json()
    assert detail["stream_length"] == 10 and detail["tracked_sessions"] == 3
    assert (detail["first_id"], detail["last_id"]) == (str(ids[0]), str(ids[9]))
    lags = {row["session"]: (row["offset"], row["lag_entries"], row["lag_ms"]) for row in detail["sessions"]}
    assert lags == {
        "leader": (str(ids[9]), 0, 0),
        "middle": (str(ids[6]), 3, 3000),
        "behind": (str(ids[1]), 8, 8000),
    }
    assert (detail["worst_lag_entries"], detail["worst_lag_ms"]) == (8, 8000)
    assert (await ops.get("/ops/docs/nope", headers=AUTH)).status_code == 404
    assert (await ops.get("/ops/docs/bad%20id", headers=AUTH)).status_code == 422


async def test_listing_pages_with_a_cursor(ops, redis_client):
    updates, _ = text_updates(1)
    for index in range(5):
        await append_at(redis_client, f"doc-{index}", [1000 + index], updates)
    first = (await ops.get("/ops/docs", params={"limit": 2}, headers=AUTH)).json()
    assert [item["doc"] for item in first["documents"]] == ["doc-0", "doc-1"]
    seen = [item["doc"] for item in first["documents"]]
    cursor = first["next_cursor"]
    while cursor:
        page = (await ops.get("/ops/docs", params={"limit": 2, "cursor": cursor}, headers=AUTH)).json()
        seen += [item["doc"] for item in page["documents"]]
        cursor = page["next_cursor"]
    assert seen == [f"doc-{index}" for index in range(5)]
    assert first["documents"][0]["stream_length"] == 1


async def test_gc_dry_run_changes_nothing_then_gc_does_it(ops, redis_client):
    await _known_scenario(redis_client)
    before = await dump_document(redis_client, "notes")
    dry = (await ops.post("/ops/gc", json={"doc": "notes", "dry_run": True}, headers=AUTH)).json()
    assert await dump_document(redis_client, "notes") == before
    [report] = dry["reports"]
    # Relative threshold 30 s: nobody is evicted; fold and trim up to "behind".
    assert (report["evicted"], report["folded"], report["trimmed"]) == (0, 2, 2)
    done = (await ops.post("/ops/gc", json={}, headers=AUTH)).json()
    assert (done["documents"], done["folded"], done["trimmed"], done["dry_run"]) == (1, 2, 2, False)
    assert await redis_client.xlen("yrelay:{notes}:stream") == 8


async def test_evict_a_session_by_hand(ops, redis_client):
    await _known_scenario(redis_client)
    assert (await ops.delete("/ops/docs/notes/sessions/behind", headers=AUTH)).status_code == 204
    assert await tracked(redis_client, "notes") == {"leader", "middle"}
    assert (await ops.delete("/ops/docs/notes/sessions/behind", headers=AUTH)).status_code == 404


async def test_a_blocked_document_is_reported_then_resolved_by_dropping_what_never_applied(ops, redis_client):
    """A stream written before causal admission: entry 2 was never stored, so
    3..5 sit behind it in nobody's document and GC cannot fold past them."""
    updates, _ = text_updates(6)
    seconds, _ = await redis_client.time()
    now = seconds * 1000
    ids = await append_at(redis_client, "old", [now - 10_000 + i for i in range(5)], updates[:2] + updates[3:])
    assert (await ops.post("/ops/gc", json={"doc": "old"}, headers=AUTH)).status_code == 200
    status = (await ops.get("/ops/docs/old", headers=AUTH)).json()
    assert status["blocked_at"] == str(ids[2]) and status["blocked_since"] > 0
    assert status["stream_length"] == 3

    answer = await ops.post("/ops/docs/old/drop-blocked", headers=AUTH)
    assert answer.status_code == 200 and answer.json()["dropped"] == [str(i) for i in ids[2:]]
    assert (await ops.post("/ops/gc", json={"doc": "old"}, headers=AUTH)).status_code == 200
    status = (await ops.get("/ops/docs/old", headers=AUTH)).json()
    assert status["blocked_at"] is None and status["stream_length"] == 0
    assert not await redis_client.exists("yrelay:{old}:dropped")
    # what every replica held stays: the two updates before the gap
    snapshot = await redis_client.get("yrelay:{old}:snapshot")
    doc = crdt.new_doc()
    crdt.apply_update(doc, snapshot)
    assert crdt.text_of(doc) == "w0 w1 "
