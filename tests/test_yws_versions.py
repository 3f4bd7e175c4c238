"""Stock y-websocket clients of each major version (1.5.4, 2.1.0, 3.1.0,
installed from tests/stock's lockfile) against a live server and
redis-server (issue 36): rooms named as apps like (spaces, unicode, ``%``,
``/``, ``{``) work and round-trip in ``/ops`` and the event log; a room no
document id can hold (300 characters) is refused once, without a reconnect
loop; a lone client of each version stays connected with 0 closes.

The lone clients stay ``YRELAY_LONE_SECONDS`` (45 by default: longer than
y-websocket's 30 s silence timeout); docs/web.md records a 5-minute run."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from browser import run_node
from conftest import running_server
from test_eventlog import read_events
from yrelay.consumers import ConsumerGroup
from yrelay.storage.keys import doc_id_room, room_doc_id

STOCK_DIR = Path(__file__).parent / "stock"
ROOMS = ["my room", "café ☕ 東京", "100% done", "team/a b", "{tag}", "plain-id"]
REFUSED_ROOM = "r" * 300
LONE_SECONDS = float(os.environ.get("YRELAY_LONE_SECONDS", "45"))
OPS = {"Authorization": "Bearer ops-token"}


@pytest.mark.timeout(LONE_SECONDS + 180)
async def test_stock_clients_of_every_version_name_any_room_and_stay_connected(redis_url, redis_client, tmp_path):
    assert shutil.which("node"), "Node.js is needed"
    assert (STOCK_DIR / "node_modules" / "y-websocket-3").exists(), (
        "run `make tests/stock/node_modules/.package-lock.json` (npm ci from tests/stock's lockfile)"
    )
    async with running_server(redis_url, data_dir=tmp_path, ops_token="ops-token", gc_interval=0) as url:
        base = url.removesuffix("/ws")
        returncode, report, _ = await run_node(
            "--test",
            "--test-reporter=tap",
            "stock.test.mjs",
            cwd=STOCK_DIR,
            timeout=LONE_SECONDS + 150,
            env={
                "YRELAY_YWS_URL": base,
                "YRELAY_ROOMS": json.dumps(ROOMS),
                "YRELAY_REFUSED_ROOM": REFUSED_ROOM,
                "YRELAY_LONE_SECONDS": str(LONE_SECONDS),
            },
            merge_stderr=True,
        )
        assert returncode == 0, report[-6000:]
        assert "# fail 0" in report and "# pass 2" in report, report[-3000:]
        print(next(line for line in report.splitlines() if "LONE " in line))
        async with httpx.AsyncClient(base_url=base.replace("ws://", "http://"), headers=OPS) as ops:
            listed = {item["doc"] for item in (await ops.get("/ops/docs", params={"limit": 100})).json()["documents"]}
            for room in ROOMS:
                doc = room_doc_id(room)
                assert doc in listed and doc_id_room(doc) == room
                detail = await ops.get(f"/ops/docs/{quote(doc, safe='')}")  # the id, escaped once more as any path
                assert detail.status_code == 200 and detail.json()["stream_length"] >= 3, (room, detail.text)
            assert not any(doc.startswith("rrr") for doc in listed)  # refused: nothing stored
    appended = {event["doc"] for event in read_events(tmp_path / "events") if event["type"] == "append"}
    assert {room_doc_id(room) for room in ROOMS} <= appended
    assert all("{" not in doc and "}" not in doc and " " not in doc for doc in appended)
    assert await consumed_docs(redis_client, {room_doc_id(room) for room in ROOMS}) == appended


async def consumed_docs(redis_client, docs: set[str]) -> set[str]:
    """The documents a consumer group's batches name, once it had every one of ``docs``."""
    seen: set[str] = set()
    async with ConsumerGroup(redis_client, "rooms", member="only") as group:

        async def consume() -> None:
            async for batch in group.batches():
                seen.add(batch.doc)
                await batch.ack()
                if docs <= seen:
                    return

        await asyncio.wait_for(consume(), 60)
    return seen
