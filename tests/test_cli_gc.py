"""`yrelay gc` as an operator runs it: a real process against a real Redis."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from gcutil import append_all, dump_document, text_updates, track
from yrelay.storage.reads import DocumentStore


def run_gc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yrelay", "gc", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "", "YRELAY_DATA_DIR": os.environ["YRELAY_DATA_DIR"]},
    )


async def _seed(redis_client, docs: list[str]) -> None:
    store = DocumentStore(redis_client)
    await store.load_scripts()
    for doc in docs:
        updates, _ = text_updates(4)
        ids = await append_all(store, doc, updates)
        await track(redis_client, doc, {"reader": ids[-1]})


async def test_dry_run_then_gc_of_all_documents(redis_url, redis_client):
    await _seed(redis_client, ["a", "b", "c"])
    before = {doc: await dump_document(redis_client, doc) for doc in "abc"}

    dry = await asyncio.to_thread(run_gc, "--redis-url", redis_url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "GC of 3 documents" in dry.stdout and "12 entries would be folded" in dry.stdout
    assert {doc: await dump_document(redis_client, doc) for doc in "abc"} == before

    done = await asyncio.to_thread(run_gc, "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    assert "12 entries were folded, 12 were trimmed" in done.stdout
    assert [await redis_client.xlen(f"yrelay:{{{doc}}}:stream") for doc in "abc"] == [0, 0, 0]


async def test_one_document(redis_url, redis_client):
    await _seed(redis_client, ["a", "b"])
    done = await asyncio.to_thread(run_gc, "--redis-url", redis_url, "b")
    assert done.returncode == 0 and "GC of 1 documents" in done.stdout
    assert await redis_client.xlen("yrelay:{a}:stream") == 4
    assert await redis_client.xlen("yrelay:{b}:stream") == 0


def test_without_a_redis_it_says_what_is_missing(tmp_path):
    result = run_gc("--data-dir", str(tmp_path))
    assert result.returncode == 2 and "--redis-url" in result.stderr
