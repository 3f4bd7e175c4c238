"""The benches' own ways of writing a stream still work: they call the
appender directly, and when its signature grew the causal ``needs`` (issue
15) `yrelay bench catchup`, `bench/gc_bench.py` and `bench/append_batching.py`
broke without any test noticing, until a session needed their figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from yrelay.storage.keys import stream_key
from yrelay.storage.offsets import ZERO
from yrelay.storage.reads import DocumentStore
from yrelay_tools.bench.edits import writer_edits
from yrelay_tools.bench.scenarios import _append_all

ROOT = Path(__file__).resolve().parents[1]


async def test_the_catchup_bench_seeds_a_stream_the_server_can_read(redis_url, redis_client):
    updates = writer_edits(7, 30)
    await _append_all(redis_url, "seeded", updates)
    assert await redis_client.xlen(stream_key("seeded")) == 30
    entries = await DocumentStore(redis_client).read_page("seeded", ZERO, 100)
    assert [entry.update for entry in entries] == updates


def test_the_gc_pass_bench_runs():
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gc_bench.py"),
            "pass",
            "--docs",
            "3",
            "--changed",
            "1",
            "--entries",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| 3 | 1 |" in result.stdout
